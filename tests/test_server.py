"""The HTTP API against a live uvicorn on 127.0.0.1, a real database and the tiny model."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from generation_helpers import tiny_atom_set
from hartonomous.client import Client
from hartonomous.engine import State
from server_helpers import WAIT_S, GatedModel, live_app, tiny_exact_model
from tiny_model import tiny_model, tiny_tokenizer

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def atom_set(server_url):
    with tiny_atom_set(server_url, seed=5) as name:
        yield name


@pytest.fixture(scope="module")
def served(reader_url, atom_set):
    """(base URL, runtime) of one server for the module; it connects as the reader role."""
    server, runtime = live_app(reader_url, atom_set, pool_size=2)
    with server as url:
        yield url, runtime


@pytest.fixture
def http(served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served[0], timeout=WAIT_S) as client:
        yield client


@pytest.fixture(scope="module")
def direct(reader_url, atom_set):
    """The Python client on the same database and model: the oracle for the API."""
    with Client(database_url=reader_url, atom_set=atom_set, spatial_tokenizer=tiny_tokenizer(),
                exact_model=tiny_exact_model()) as client:
        yield client


def parse_sse(lines: Iterator[str]) -> Iterator[tuple[str, str]]:
    """(event, data) per SSE event; comments come as ('comment', text)."""
    event, data = "message", []
    for line in lines:
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
        elif line.startswith(":"):
            yield "comment", line[1:].strip()
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)


def stream(http: httpx.Client, body: dict) -> tuple[httpx.Response, list[tuple[str, str]]]:
    with http.stream("POST", "/api/generate/stream", json=body) as response:
        if response.status_code != 200:
            response.read()
            return response, []
        return response, list(parse_sse(response.iter_lines()))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.01)
    return value


# -- service endpoints ---------------------------------------------------------------------


def test_healthz_checks_the_database(http, atom_set):
    response = http.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["database"] == "ok" and body["atom_sets"] >= 1
    assert body["exact_model"] == "loaded (torch runtime)"   # the tiny model given to the server runs on torch


def test_healthz_is_503_when_the_database_is_unreachable(atom_set):
    server, _ = live_app(f"postgresql://nobody@127.0.0.1:{_free_port()}/none", atom_set, pool_timeout_s=1)
    with server as url:
        response = httpx.get(f"{url}/healthz", timeout=WAIT_S)
        generate = httpx.post(f"{url}/api/generate", json={"prompt": PROMPT}, timeout=WAIT_S)
    assert response.status_code == 503
    assert response.json()["status"] == "error" and "unavailable" in response.json()["database"]
    assert generate.status_code == 503 and "GET /healthz" in generate.json()["error"]


def test_atom_sets_lists_the_sets(http, atom_set, server_url):
    body = http.get("/api/atom_sets").json()
    ours = [s for s in body["atom_sets"] if s["name"] == atom_set]
    assert len(ours) == 1
    assert ours[0]["model"] == "tiny" and ours[0]["kind"] == "token" and ours[0]["vocab_size"] == len(tiny_tokenizer())
    assert "exact" in ours[0]["paths"] and "spatial" in ours[0]["paths"]
    assert "augmented" not in ours[0]["paths"]            # labelled by hand, not by its corpus; no gate
    with psycopg.connect(server_url) as conn:
        names = [r[0] for r in conn.execute("SELECT name FROM atom_sets").fetchall()]
    assert sorted(s["name"] for s in body["atom_sets"]) == sorted(names)


def test_openapi_docs_and_playground_are_published(http):
    schema = http.get("/openapi.json").json()
    for path in ("/api/next_token", "/api/generate", "/api/generate/stream", "/api/generate/batch",
                 "/api/atom_sets", "/healthz"):
        assert path in schema["paths"], path
    limits = schema["components"]["schemas"]["GenerateRequest"]["properties"]["max_new_tokens"]
    assert limits["maximum"] == 512 and limits["minimum"] == 1
    assert "swagger" in http.get("/docs").text.lower()
    page = http.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert 'id="pane-spatial"' in page.text and 'id="pane-exact"' in page.text
    assert 'id="pane-speculative"' in page.text and 'id="use-speculative"' in page.text
    script = http.get("/static/playground.js")
    assert script.status_code == 200 and "/api/generate/stream" in script.text
    assert "http://" not in page.text + script.text.replace("http://www.w3.org/2000/svg", "")


# -- next_token ----------------------------------------------------------------------------


def test_next_token_spatial_equals_sql_with_texts(http, atom_set, reader_url):
    response = http.post("/api/next_token", json={"prompt": PROMPT, "top_k": 10, "limit": 5})
    assert response.status_code == 200
    body = response.json()
    ids = tiny_tokenizer().encode(PROMPT)
    with psycopg.connect(reader_url) as conn:
        sql = conn.execute("SELECT token_id, probability FROM next_token(%s, 1.0, 10, 0.9, NULL, 100, %s)",
                           (ids, atom_set)).fetchall()
    assert body["path"] == "spatial" and body["atom_set"] == atom_set
    assert body["total_rows"] == len(sql) and len(body["rows"]) == min(5, len(sql))
    assert [(r["token_id"], r["probability"]) for r in body["rows"]] == [tuple(r) for r in sql[:5]]
    assert [r["text"] for r in body["rows"]] == [tiny_tokenizer().decode([t]) for t, _ in sql[:5]]


def test_next_token_exact_greedy_is_the_argmax(http):
    body = http.post("/api/next_token", json={"prompt": PROMPT, "path": "exact", "temperature": 0}).json()
    model, tokenizer = tiny_model(0)
    logits = tiny_exact_model().full_logits(tokenizer.encode(PROMPT))
    assert [(r["token_id"], r["probability"]) for r in body["rows"]] == [(int(logits.argmax()), 1.0)]


# -- generate, batch, stream ---------------------------------------------------------------


@pytest.mark.parametrize("path,extra", [("spatial", {}), ("exact", {}), ("spatial", {"in_database": True})])
def test_generate_equals_the_python_client(http, direct, path, extra):
    options = dict(seed=11, max_new_tokens=12, temperature=0.9, top_k=20, top_p=0.95, repetition_penalty=1.2)
    response = http.post("/api/generate", json={"prompt": PROMPT, "path": path, "ignore_eos": True,
                                                 **options, **extra})
    assert response.status_code == 200, response.text
    body = response.json()
    expected = direct.generate(PROMPT, path=path, stop_at_eos=False, **options)
    assert body["token_ids"] == expected.token_ids and body["text"] == expected.text
    assert body["state"] == "complete" and body["finish_reason"] == "length" and body["seed"] == 11
    assert body["prompt_tokens"] == len(tiny_tokenizer().encode(PROMPT)) and body["path"] == path


def test_speculative_greedy_is_the_exact_paths_output_with_stats(http, direct):
    options = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    exact = http.post("/api/generate", json={"prompt": PROMPT, "path": "exact", **options}).json()
    response = http.post("/api/generate", json={"prompt": PROMPT, "path": "speculative", "draft_tokens": 3, **options})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["token_ids"] == exact["token_ids"] and body["text"] == exact["text"]
    assert body["path"] == "speculative" and exact["stats"] is None
    stats = body["stats"]
    assert stats["tokens"] == 12 and stats["draft_lengths"][0] == 3 and stats["rounds"] == stats["forwards"]
    assert stats["acceptance_rate"] == (stats["accepted"] / stats["drafted"] if stats["drafted"] else None)
    _, events = stream(http, {"prompt": PROMPT, "path": "speculative", **options})
    assert "".join(json.loads(d)["token"] for kind, d in events[:-1] if kind == "message") == exact["text"]
    _, events = stream(http, {"prompt": PROMPT, "path": "speculative", "details": True, **options})
    result = json.loads(events[-2][1])
    assert events[-2][0] == "result" and result["token_ids"] == exact["token_ids"]
    assert result["stats"]["tokens"] == 12


def test_speculative_requests_carry_what_drafting_learned(http, served):
    """The server's requests share one DraftLearning (hartonomous/speculative/learned.py): after a
    request its kind holds the judged drafts, and asking again gives the same tokens, greedy and
    sampled with a seed, whatever was carried."""
    runtime = served[1]
    for options in ({"temperature": 0}, {"temperature": 1.0, "seed": 7}):
        body = {"prompt": PROMPT, "path": "speculative", "max_new_tokens": 12, "ignore_eos": True, **options}
        first = http.post("/api/generate", json=body)
        assert first.status_code == 200, first.text
        again = http.post("/api/generate", json=body).json()
        assert again["token_ids"] == first.json()["token_ids"]
    kinds = runtime.draft_learning.as_dict()["kinds"]
    assert any("/greedy/" in k for k in kinds) and any("/sampled/" in k for k in kinds)
    assert http.get("/healthz").json()["draft_learning"]["kinds"] == kinds
    assert all(v["judged"] > 0 for k, v in kinds.items() if "/greedy/" in k)
    with runtime.engine("speculative") as engine:
        assert engine.backend.learned is runtime.draft_learning


def test_hybrid_at_the_ends_is_the_exact_or_the_spatial_path_with_stats(http):
    options = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
    for threshold, path, exact_steps in ((0, "exact", 10), (2, "spatial", 0)):   # above 1: every step spatial
        want = http.post("/api/generate", json={"prompt": PROMPT, "path": path, **options}).json()
        response = http.post("/api/generate", json={"prompt": PROMPT, "path": "hybrid", "risk_threshold": threshold,
                                                     **options})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["token_ids"] == want["token_ids"] and body["path"] == "hybrid"
        assert body["stats"] == {"threshold": threshold, "steps": 10, "exact_steps": exact_steps,
                                 "exact_fraction": exact_steps / 10}


def test_stream_details_carry_the_step_signals(http, direct, atom_set):
    from hartonomous import sqlcalls

    body = {"prompt": PROMPT, "seed": 5, "max_new_tokens": 4, "ignore_eos": True, "details": True, "signals": True}
    _, events = stream(http, body)
    tokens = [json.loads(data) for kind, data in events if kind == "message" and data != "[DONE]"]
    ids = tiny_tokenizer().encode(PROMPT)
    conn = direct.engine("spatial").backend.conn
    for token in tokens:
        want = sqlcalls.next_token_signals(conn, ids, atom_set=atom_set)
        assert token["signals"]["h"] == pytest.approx(want.h) and token["signals"]["risk"] is None
        assert token["signals"]["distinct_tokens"] == want.distinct_tokens
        assert token["signals"]["predicted_gap"] == want.predicted_gap          # None: this set has no predictor
        ids.append(token["token_id"])


def test_batch_equals_one_by_one(http):
    prompts = [PROMPT, "def add(a, b):", "héllo wörld"]
    options = {"seed": 3, "max_new_tokens": 6, "ignore_eos": True}
    for path in ("spatial", "exact"):
        batch = http.post("/api/generate/batch", json={"prompts": prompts, "path": path, **options})
        assert batch.status_code == 200, batch.text
        single = [http.post("/api/generate", json={"prompt": p, "path": path, **options}).json() for p in prompts]
        assert [r["token_ids"] for r in batch.json()["results"]] == [r["token_ids"] for r in single]
        assert len({tuple(r["token_ids"]) for r in single}) > 1     # different prompts, different outputs


@pytest.mark.parametrize("path", ["spatial", "exact"])
def test_stream_is_the_original_sse_protocol(http, direct, path):
    body = {"prompt": PROMPT, "path": path, "seed": 7, "max_new_tokens": 16, "ignore_eos": True}
    response, events = stream(http, body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == ("message", "[DONE]")
    tokens = [json.loads(data) for kind, data in events[:-1] if kind == "message"]
    assert all(set(t) == {"token"} for t in tokens) and all(t["token"] for t in tokens)
    assert [kind for kind, _ in events if kind not in ("message", "comment")] == []
    expected = direct.generate(PROMPT, path=path, seed=7, max_new_tokens=16, stop_at_eos=False)
    assert "".join(t["token"] for t in tokens) == expected.text


def test_stream_details_carry_ids_timings_and_the_distribution(http, direct):
    body = {"prompt": PROMPT, "seed": 5, "max_new_tokens": 8, "ignore_eos": True, "details": True, "top_n": 4,
            "top_k": 10}
    response, events = stream(http, body)
    assert events[-1] == ("message", "[DONE]") and events[-2][0] == "result"
    tokens = [json.loads(data) for kind, data in events if kind == "message" and data != "[DONE]"]
    result = json.loads(events[-2][1])
    expected = direct.generate(PROMPT, seed=5, max_new_tokens=8, stop_at_eos=False, top_k=10)
    assert [t["token_id"] for t in tokens] == expected.token_ids == result["token_ids"]
    assert [t["step"] for t in tokens] == list(range(8))
    assert result["state"] == "complete" and result["timings"]["tokens_per_second"] > 0
    assert all(t["seconds"] > 0 for t in tokens)
    for t in tokens:        # the picked token is one of the distribution's rows, with its probability
        rows = {r["token_id"]: r["probability"] for r in t["distribution"]}
        assert len(t["distribution"]) == 4
        assert t["token_id"] not in rows or rows[t["token_id"]] == t["probability"]
    first = direct.next_token(PROMPT, top_k=10)[:4]
    assert [(r["token_id"], r["text"]) for r in tokens[0]["distribution"]] == [(r.token_id, r.text) for r in first]


def test_concurrent_requests_each_get_their_own_connection(http, served, direct):
    """More concurrent spatial requests than pooled connections: all succeed, all reproducible."""
    url, _ = served
    results, errors = [], []

    def one(path):
        try:
            with httpx.Client(base_url=url, timeout=WAIT_S) as c:
                r = c.post("/api/generate", json={"prompt": PROMPT, "path": path, "seed": 2, "max_new_tokens": 10,
                                                  "ignore_eos": True})
                results.append((path, r.status_code, r.json().get("token_ids")))
        except Exception as exc:     # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(p,)) for p in ["spatial"] * 6 + ["exact"] * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for path in ("spatial", "exact"):
        expected = direct.generate(PROMPT, path=path, seed=2, max_new_tokens=10, stop_at_eos=False).token_ids
        assert [r for r in results if r[0] == path] == [(path, 200, expected)] * (6 if path == "spatial" else 2)


# -- limits and errors ---------------------------------------------------------------------


@pytest.mark.parametrize("endpoint,body,field", [
    ("/api/generate", {"prompt": PROMPT, "max_new_tokens": 100000}, "max_new_tokens"),
    ("/api/generate", {"prompt": PROMPT, "max_new_tokens": 0}, "max_new_tokens"),
    ("/api/generate", {"prompt": "x" * 8001}, "prompt"),
    ("/api/generate", {"prompt": "   "}, "prompt"),
    ("/api/generate", {"prompt": PROMPT, "temperature": -0.5}, "temperature"),
    ("/api/generate", {"prompt": PROMPT, "top_p": 0}, "top_p"),
    ("/api/generate", {"prompt": PROMPT, "top_k": -1}, "top_k"),
    ("/api/generate", {"prompt": PROMPT, "repetition_penalty": 0}, "repetition_penalty"),
    ("/api/generate", {"prompt": PROMPT, "seed": 2**64}, "seed"),
    ("/api/generate", {"prompt": PROMPT, "path": "quantum"}, "path"),
    ("/api/generate", {"prompt": PROMPT, "tmperature": 1}, "tmperature"),
    ("/api/generate", {"prompt": PROMPT, "stop": [""]}, "stop.0"),
    ("/api/generate", {}, "prompt"),
    ("/api/generate/stream", {"prompt": PROMPT, "top_n": 1000}, "top_n"),
    ("/api/generate/stream", {"prompt": PROMPT, "max_new_tokens": 513}, "max_new_tokens"),
    ("/api/generate", {"prompt": PROMPT, "max_new_tokens": 4097}, "max_new_tokens"),
    ("/api/generate", {"prompt": PROMPT, "temperature": 1e-7}, "temperature"),       # GenerationConfig's rule
    ("/api/generate/stream", {"prompt": " \n", "path": "exact"}, "prompt"),          # the engine's prompt rule
    ("/api/next_token", {"prompt": PROMPT, "temperature": 1e-7}, "temperature"),
    ("/api/next_token", {"prompt": "  "}, "prompt"),
    ("/api/generate/batch", {"prompts": []}, "prompts"),
    ("/api/generate/batch", {"prompts": ["ok"] * 17}, "prompts"),
    ("/api/generate/batch", {"prompts": ["ok", " "]}, "prompts"),
    ("/api/next_token", {"prompt": PROMPT, "limit": 0}, "limit"),
    ("/api/next_token", {"prompt": PROMPT, "max_neighbors": 0}, "max_neighbors"),
    ("/api/next_token", {"prompt": PROMPT, "history_weight": -1}, "history_weight"),
    ("/api/generate", {"prompt": PROMPT, "history_window": 4097}, "history_window"),
    ("/api/generate", {"prompt": PROMPT, "path": "speculative", "draft_tokens": 0}, "draft_tokens"),
    ("/api/generate/stream", {"prompt": PROMPT, "path": "speculative", "draft_tokens": 65}, "draft_tokens"),
    ("/api/next_token", {"prompt": PROMPT, "path": "speculative"}, "path"),
    ("/api/next_token", {"prompt": PROMPT, "path": "hybrid"}, "path"),
    ("/api/generate", {"prompt": PROMPT, "path": "hybrid", "risk_threshold": -1}, "risk_threshold"),
    ("/api/generate", {"prompt": PROMPT, "cautious_mode": "panic"}, "cautious_mode"),
    ("/api/generate", {"prompt": PROMPT, "explore_risk": 0.9, "cautious_risk": 0.5}, "explore_risk"),  # GenerationConfig
    ("/api/generate", {"prompt": PROMPT, "augment_weight": 0.5}, "augment_weight"),      # options of another path
    ("/api/generate/stream", {"prompt": PROMPT, "path": "exact", "augment_weight": 0}, "augment_weight"),
    ("/api/generate/batch", {"prompts": [PROMPT], "path": "speculative", "augment_weight": 1}, "augment_weight"),
    ("/api/next_token", {"prompt": PROMPT, "path": "exact", "augment_weight": 0.5}, "augment_weight"),
])
def test_out_of_range_requests_are_422_naming_the_field(http, endpoint, body, field):
    response = http.post(endpoint, json=body)
    assert response.status_code == 422
    payload = response.json()
    assert field in [d["field"] for d in payload["detail"]]
    assert payload["error"].startswith(field) or f"; {field}:" in payload["error"]
    assert "x" * 100 not in response.text          # the input is not echoed back


def test_augment_weight_is_accepted_where_the_augmented_distribution_is_computed():
    """The augmented path, and speculative decoding verified against it, read augment_weight."""
    from hartonomous.server.schemas import GenerateRequest, NextTokenRequest

    assert GenerateRequest(prompt=PROMPT, path="augmented", augment_weight=0.5).augment_weight == 0.5
    assert GenerateRequest(prompt=PROMPT, path="speculative", speculative_target="augmented",
                           augment_weight=0).augment_weight == 0
    assert NextTokenRequest(prompt=PROMPT, path="augmented", augment_weight=1).augment_weight == 1


def test_the_servers_limits_and_defaults_come_from_the_engine(http):
    from hartonomous.generation_config import MAX_NEW_TOKENS, GenerationConfig
    from hartonomous.server.schemas import MAX_NEW_TOKENS_PER_REQUEST

    assert MAX_NEW_TOKENS_PER_REQUEST <= MAX_NEW_TOKENS          # the server may only be stricter
    properties = http.get("/openapi.json").json()["components"]["schemas"]["GenerateRequest"]["properties"]
    for name in ("temperature", "top_k", "top_p", "repetition_penalty", "max_new_tokens"):
        assert properties[name]["default"] == getattr(GenerationConfig, name), name


def test_a_body_that_is_not_json_is_422(http):
    response = http.post("/api/generate", content=b"{not json", headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and response.json()["error"]


def test_an_unknown_atom_set_is_400_with_a_hint(http):
    for endpoint in ("/api/generate", "/api/generate/stream", "/api/next_token"):
        response = http.post(endpoint, json={"prompt": PROMPT, "atom_set": "no-such-set"})
        assert response.status_code == 400, endpoint
        assert "no atom set named 'no-such-set'" in response.json()["error"]
        assert "hartonomous atom-sets" in response.json()["error"]


class ExplodingModel:
    """An exact model whose forward pass fails with a message that must stay server-side."""

    def __init__(self):
        self._model = tiny_exact_model()

    def __getattr__(self, name):
        return getattr(self._model, name)

    def prefill(self, *args, **kwargs):
        raise RuntimeError("secret internal detail /etc/hartonomous")


def test_a_server_error_is_500_json_without_a_traceback(reader_url, atom_set, caplog):
    server, _ = live_app(reader_url, atom_set, exact_model=ExplodingModel())
    with server as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
        blocking = http.post("/api/generate", json={"prompt": PROMPT, "path": "exact"})
        response, events = stream(http, {"prompt": PROMPT, "path": "exact"})
        spatial = http.post("/api/generate", json={"prompt": PROMPT, "max_new_tokens": 2})
    assert blocking.status_code == 500
    assert blocking.json()["error"].startswith("internal server error (id ")
    assert response.status_code == 200 and [e[0] for e in events] == ["error", "message"]
    assert json.loads(events[0][1])["error"].startswith("internal server error (id ")
    assert events[1] == ("message", "[DONE]")
    for text in (blocking.text, json.dumps(events)):
        assert "Traceback" not in text and "secret" not in text and "RuntimeError" not in text
    assert caplog.text.count("secret internal detail") >= 2        # logged server-side, with the id
    assert blocking.json()["error"].split("id ")[1].split(")")[0] in caplog.text
    assert spatial.status_code == 200          # the server is still fine


# -- cancellation --------------------------------------------------------------------------


def _cancelled_within_one_step(runtime, model: GatedModel, steps_seen: int):
    session = wait_for(lambda: next(iter(runtime.active.values()), None), "the running session")
    wait_for(session.cancel_event.is_set, "the server to notice the disconnect")
    model.permits.release(1)           # let the step in flight finish; no more permits follow
    wait_for(lambda: not runtime.active, "the session to end")
    result = runtime.finished[-1]
    assert result.state is State.CANCELLED and result.finish_reason == "cancelled"
    assert steps_seen <= len(result.token_ids) <= steps_seen + 1
    assert model.decoded <= steps_seen     # steps_seen - 1 released before, one in flight


def test_stream_disconnect_cancels_within_one_step_and_pings_keep_alive(reader_url, atom_set):
    model = GatedModel()
    server, runtime = live_app(reader_url, atom_set, exact_model=model, ping_seconds=0.2)
    body = {"prompt": PROMPT, "path": "exact", "max_new_tokens": 200, "ignore_eos": True, "details": True,
            "seed": 1}
    with server as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
        model.permits.release(2)                     # step 0 needs no decode; steps 1 and 2 do
        with http.stream("POST", "/api/generate/stream", json=body) as response:
            seen, pinged = 0, False
            for kind, _ in parse_sse(response.iter_lines()):
                seen += kind == "message"
                pinged = pinged or (kind == "comment" and seen == 3)
                if pinged:                           # generation is blocked: only pings can arrive now
                    break
        # leaving the block closes the connection mid-stream
        assert seen == 3 and pinged
        _cancelled_within_one_step(runtime, model, steps_seen=3)
        assert http.get("/healthz").status_code == 200


def test_blocking_generate_disconnect_cancels(reader_url, atom_set):
    model = GatedModel()
    server, runtime = live_app(reader_url, atom_set, exact_model=model)
    body = json.dumps({"prompt": PROMPT, "path": "exact", "max_new_tokens": 200, "ignore_eos": True}).encode()
    with server as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(b"POST /api/generate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            wait_for(lambda: runtime.active, "the generation to start")
        _cancelled_within_one_step(runtime, model, steps_seen=1)


def test_spatial_disconnect_returns_the_connection_to_the_pool(reader_url, atom_set):
    """With one pooled connection, a request after a dropped stream can only run once it was returned."""
    server, runtime = live_app(reader_url, atom_set, pool_size=1, pool_timeout_s=WAIT_S)
    body = {"prompt": PROMPT, "max_new_tokens": 512, "ignore_eos": True, "seed": 4}
    with server as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
        with http.stream("POST", "/api/generate/stream", json=body) as response:
            assert next(parse_sse(response.iter_lines()))[0] == "message"
        again = http.post("/api/generate", json={"prompt": PROMPT, "max_new_tokens": 3, "ignore_eos": True})
    assert again.status_code == 200 and len(again.json()["token_ids"]) == 3
    dropped = runtime.finished[0]
    assert dropped.state in (State.CANCELLED, State.COMPLETE) and len(dropped.token_ids) >= 1


# -- executors and pools --------------------------------------------------------------------


class StalledModel:
    """The tiny exact model on a slow runtime: every forward sleeps until the test releases it."""

    FORWARDS = ("prefill", "decode_one_token", "extend", "extend_tree", "full_logits", "full_logits_many")

    def __init__(self):
        self._model = tiny_exact_model()
        self.released = threading.Event()
        self.entered = 0

    def __getattr__(self, name):
        attr = getattr(self._model, name)
        if name not in self.FORWARDS:
            return attr

        def stalled(*args, **kwargs):
            self.entered += 1
            if not self.released.wait(WAIT_S):
                raise RuntimeError("the test never released the model")
            return attr(*args, **kwargs)
        return stalled


def connections_held(pool) -> int:
    stats = pool.get_stats()
    return stats["pool_size"] - stats["pool_available"]


PROMPT_S = 10          # what "promptly" allows a database-only request on 2 busy cores (the model stalls 30 s)


def test_database_only_requests_never_wait_behind_generations_on_the_model(reader_url, atom_set):
    """Every model worker busy in a stalled forward, two of them holding a connection (speculative), one
    more request queued for the model: spatial (Python and in-database), SQL-only next_token, the atom
    sets and /healthz still answer, and all of it while the model has not moved."""
    model = StalledModel()
    server, runtime = live_app(reader_url, atom_set, exact_model=model, pool_size=2, max_concurrent=2,
                               pool_timeout_s=WAIT_S)
    body = {"prompt": PROMPT, "max_new_tokens": 3, "ignore_eos": True, "temperature": 0}
    answers: dict[str, httpx.Response] = {}

    def on_the_model(name: str, path: str) -> None:
        with httpx.Client(base_url=url, timeout=2 * WAIT_S) as c:
            answers[name] = c.post("/api/generate", json={**body, "path": path})

    with server as url:
        waiting = [threading.Thread(target=on_the_model, args=(f"{path} {i}", path))
                   for i, path in enumerate(["speculative", "speculative", "exact"])]
        for thread in waiting[:2]:
            thread.start()
        wait_for(lambda: model.entered == 1 and connections_held(runtime.model_pool) == 2,
                 "both model workers to be busy, each with a connection")
        waiting[2].start()                      # and one more in line for the model
        with httpx.Client(base_url=url, timeout=PROMPT_S) as c:
            quick = [c.post("/api/generate", json={**body, "path": "spatial"}),
                     c.post("/api/generate", json={**body, "path": "spatial", "in_database": True}),
                     c.post("/api/next_token", json={"prompt": PROMPT, "limit": 3}),
                     c.get("/api/atom_sets"), c.get("/healthz")]
        still_stalled = not model.released.is_set() and model.entered == 1 and not answers
        model.released.set()
        for thread in waiting:
            thread.join()
    assert [r.status_code for r in quick] == [200] * 5, [r.text for r in quick]
    assert len(quick[0].json()["token_ids"]) == len(quick[1].json()["token_ids"]) == 3
    assert still_stalled
    assert {name: r.status_code for name, r in answers.items()} == {"speculative 0": 200, "speculative 1": 200,
                                                                   "exact 2": 200}


# -- the command -------------------------------------------------------------------------


def test_hartonomous_serve_connects_as_the_reader(server_url, reader_url, atom_set, tmp_path):
    from psycopg.conninfo import make_conninfo

    port, tag = _free_port(), f"serve-test-{os.getpid()}"
    env = {**os.environ, "HARTONOMOUS_DATABASE_URL": server_url, "HARTONOMOUS_HOME": str(tmp_path),
           "HARTONOMOUS_READER_DATABASE_URL": make_conninfo(reader_url, application_name=tag)}
    exe = os.path.join(os.path.dirname(sys.executable), "hartonomous")
    proc = subprocess.Popen([exe, "serve", "--port", str(port), "--atom-set", atom_set, "--no-preload",
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                return False

        wait_for(healthy, "hartonomous serve to answer /healthz")
        sets = httpx.get(f"http://127.0.0.1:{port}/api/atom_sets", timeout=WAIT_S).json()
        assert atom_set in [s["name"] for s in sets["atom_sets"]]
        with psycopg.connect(server_url) as conn:
            users = {r[0] for r in conn.execute("SELECT usename FROM pg_stat_activity WHERE application_name = %s",
                                                (tag,))}
        assert users == {"hartonomous_reader"}
    finally:
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=WAIT_S)[0]
    assert proc.returncode == 0, output
    assert f"http://127.0.0.1:{port}/" in output


def test_hartonomous_serve_fails_in_one_line_without_a_database(tmp_path):
    port = _free_port()
    env = {**os.environ, "HARTONOMOUS_DATABASE_URL": f"postgresql://nobody@127.0.0.1:{port}/none",
           "HARTONOMOUS_HOME": str(tmp_path)}
    env.pop("HARTONOMOUS_READER_DATABASE_URL", None)
    exe = os.path.join(os.path.dirname(sys.executable), "hartonomous")
    out = subprocess.run([exe, "serve", "--port", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().startswith("error: cannot connect to") and len(out.stderr.strip().splitlines()) == 1
