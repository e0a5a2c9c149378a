"""A hostile client cannot poison a remembering server's memory (`serve --remember`).

The server is live (uvicorn on 127.0.0.1, the reader role for requests, the owner's writer for the
memory, the tiny model). Any client may ask for any sampler settings the API accepts; the memory
keeps a generation only under settings the set's policy admits (sql/070_memory.sql rule 2a), and
every response says what the memory did: `memory` in the JSON, `event: memory` at the end of a
plain stream, `memory` in a detailed stream's result.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from generation_helpers import tiny_atom_set
from server_helpers import WAIT_S, live_app

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def atom_set(server_url):
    with tiny_atom_set(server_url, seed=9) as name:
        yield name


@pytest.fixture(scope="module")
def served(server_url, reader_url, atom_set):
    """A server that remembers (the reader role serves requests; the owner writes the memory)."""
    server, runtime = live_app(reader_url, atom_set, pool_size=2, remember=True, writer_url=server_url)
    with server as url:
        yield url, runtime


@pytest.fixture
def http(served, server_url, atom_set) -> Iterator[httpx.Client]:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("SELECT forget(%s)", (atom_set,))
    with httpx.Client(base_url=served[0], timeout=WAIT_S) as client:
        yield client


def held(server_url, atom_set) -> tuple[int, int]:
    """(atoms, generations) in the set's memory, read as the owner."""
    with psycopg.connect(server_url) as conn:
        return tuple(conn.execute("SELECT atoms, generations FROM memory_status(%s)", (atom_set,)).fetchone())


def generate(http: httpx.Client, **body) -> dict:
    response = http.post("/api/generate", json={"prompt": PROMPT, "max_new_tokens": 6, **body})
    assert response.status_code == 200, response.text
    return response.json()


def stream(http: httpx.Client, **body) -> list[tuple[str, str]]:
    """(event, data) of each SSE event of a streamed generation."""
    events, event, data = [], "message", []
    with http.stream("POST", "/api/generate/stream", json={"prompt": PROMPT, "max_new_tokens": 6, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line == "":
                if data:
                    events.append((event, "\n".join(data)))
                event, data = "message", []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
    return events


HOSTILE = [
    (dict(path="exact", temperature=100.0, seed=1), "temperature 100 is outside the set's memory policy (0 .. 1)"),
    (dict(path="exact", temperature=1.0, top_k=0, top_p=1.0, seed=2), "top_p 1 is outside the set's memory policy"),
    (dict(path="exact", temperature=1.0, top_k=0, seed=2), "top_k off is outside the set's memory policy"),
    (dict(path="exact", temperature=0.0, repetition_penalty=0.01), "repetition_penalty 0.01 is not allowed"),
    (dict(path="exact", temperature=0.0, ignore_eos=True), "ignore_eos is not allowed by the set's memory policy"),
    (dict(path="speculative", temperature=100.0, seed=3), "temperature 100 is outside the set's memory policy"),
]


@pytest.mark.parametrize("body, reason", HOSTILE)
def test_a_hostile_request_is_answered_and_not_remembered(http, server_url, atom_set, body, reason):
    result = generate(http, **body)
    assert len(result["token_ids"]) > 0
    assert result["memory"]["remembered"] is False and result["memory"]["atoms"] == 0
    assert reason in result["memory"]["reason"]
    assert held(server_url, atom_set) == (0, 0)


def test_greedy_and_the_servers_defaults_are_remembered_and_say_so(http, server_url, atom_set):
    greedy = generate(http, path="exact", temperature=0.0)
    assert greedy["memory"]["remembered"] is True and greedy["memory"]["reason"] is None
    assert greedy["memory"]["atoms"] == len(greedy["token_ids"])
    defaults = generate(http, path="exact", seed=5)            # what a request that says nothing runs
    assert defaults["memory"]["remembered"] is True and defaults["memory"]["generation"] > greedy["memory"]["generation"]
    assert held(server_url, atom_set) == (len(greedy["token_ids"]) + len(defaults["token_ids"]), 2)


def test_paths_that_mix_the_store_in_say_why_they_are_not_remembered(http, server_url, atom_set):
    for path, options in (("spatial", {}), ("hybrid", {"risk_threshold": 0.0})):   # hybrid: every step the model's
        result = generate(http, path=path, temperature=0.0, **options)
        assert result["memory"]["remembered"] is False
        assert f"the {path} path's output holds the store's guesses" in result["memory"]["reason"]
    assert held(server_url, atom_set) == (0, 0)


def test_a_plain_stream_ends_with_what_the_memory_did(http, server_url, atom_set):
    events = stream(http, path="exact", temperature=100.0, seed=4)
    memory = [json.loads(data) for event, data in events if event == "memory"]
    assert len(memory) == 1 and memory[0]["remembered"] is False and "temperature 100" in memory[0]["reason"]
    assert events[-1] == ("message", "[DONE]")
    assert held(server_url, atom_set) == (0, 0)
    kept = [json.loads(d) for e, d in stream(http, path="exact", temperature=0.0) if e == "memory"]
    assert kept[0]["remembered"] is True and held(server_url, atom_set)[1] == 1


def test_a_detailed_stream_carries_it_in_its_result(http, server_url, atom_set):
    events = stream(http, path="exact", temperature=100.0, seed=6, details=True)
    result = [json.loads(data) for event, data in events if event == "result"]
    assert result[0]["memory"]["remembered"] is False and "temperature 100" in result[0]["memory"]["reason"]
    assert not [event for event, _ in events if event == "memory"]
    assert held(server_url, atom_set) == (0, 0)


def test_healthz_counts_what_the_policy_refused(http, served):
    before = http.get("/healthz").json()["memory"]
    generate(http, path="exact", temperature=100.0, seed=7)
    after = http.get("/healthz").json()["memory"]
    assert after["refused"] == before["refused"] + 1 and after["failed"] == before["failed"]
    assert after["remembered"] == before["remembered"] and after["policy"] is None


def test_a_server_that_does_not_remember_says_nothing_about_the_memory(reader_url, atom_set):
    server, _ = live_app(reader_url, atom_set, pool_size=1)
    with server as url, httpx.Client(base_url=url, timeout=WAIT_S) as client:
        assert generate(client, path="exact", temperature=0.0)["memory"] is None
        events = stream(client, path="exact", temperature=0.0)
        assert events[-1] == ("message", "[DONE]") and {event for event, _ in events} == {"message"}


# -- the command line ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cli_set(server_url, tmp_path_factory):
    """The tiny model as a local folder and an atom set that names it (the CLI loads the set's model)."""
    from generation_helpers import drop_atom_set, save_tiny_model, write_tiny_atom_set

    model_dir = save_tiny_model(tmp_path_factory.mktemp("tiny"))
    name = write_tiny_atom_set(server_url, model=str(model_dir), seed=12)
    yield name, model_dir
    drop_atom_set(server_url, name)


def test_generate_remember_says_what_the_memory_did(capsys, database_env, server_url, cli_set):
    from generation_helpers import run_cli

    name, model_dir = cli_set
    common = ["generate", PROMPT, "--path", "exact", "--max-new-tokens", "4", "--remember", "--atom-set", name,
              "--model", str(model_dir), "--device", "cpu"]
    code, _, err = run_cli(capsys, *common, "--temperature", "100", "--seed", "1")
    assert code == 0 and "[memory] not remembered: temperature 100 is outside the set's memory policy (0 .. 1)" in err
    assert held(server_url, name) == (0, 0)
    code, out, _ = run_cli(capsys, *common, "--temperature", "0", "--json")
    memory = json.loads(out)["memory"]
    assert code == 0 and memory["remembered"] is True and held(server_url, name) == (memory["atoms"], 1)


@pytest.mark.parametrize("arguments, message", [
    (["--memory-policy", "max_temperature=2"], "--memory-policy is the policy of the memory the server writes: "
                                               "add --remember"),
    (["--remember", "--memory-policy", "temperature=2"], "the memory policy takes KEY=VALUE pairs"),
    (["--remember", "--memory-policy", "max_temperature=-1"], "max_temperature must be between min_temperature"),
    (["--remember", "--memory-policy", "max_top_k=-5"], "max_top_k must be between 0 and 1000000, got -5"),
])
def test_serve_refuses_a_bad_memory_policy_in_one_line(capsys, database_env, cli_set, arguments, message):
    from generation_helpers import run_cli

    code, out, err = run_cli(capsys, "serve", "--atom-set", cli_set[0], "--port", "1", *arguments)
    assert code != 0 and not out
    assert message in err and len(err.strip().splitlines()) == 1
