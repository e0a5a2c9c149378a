"""Citations in every surface: token events, `generate --cite`, /api (SSE), /v1 and the playground.

The tiny set gets a file table whose one train file is the prompt followed by the spatial path's
greedy continuation (and one holding the exact path's), so every token the store picks has a
known source: the file, the line of its offset, its license, and every token before it matched.
- Python: with config.cite each store-picked token's event carries its citations; the others and
  a run without cite carry none; the exact path refuses cite naming it; speculative cites exactly
  its kept drafts (files and the remembered generation), augmented exactly the steps whose token
  was the store's most probable.
- CLI: --cite prints file:line after the output and flags the run of 20+ tokens stored verbatim
  with the file's license; --json carries both.
- HTTP: /api/generate/stream details events and /v1 completions (streamed chunks and the whole
  response's extension) carry the same citations as the Python events.
- The playground (headless Chromium) shows a token's sources on hover when its cite box is ticked.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from generation_helpers import drop_atom_set, run_cli, save_tiny_model, write_tiny_atom_set
from hartonomous.client import Client
from hartonomous.errors import InvalidArgument
from hartonomous.generation_config import GenerationConfig
from server_helpers import WAIT_S, live_app
from test_augmented_path import corpus_set  # noqa: F401 - fixture: a corpus-labelled set with a gate

PROMPT = "The capital of France is"
N = 24
LINES = list(range(0, 200, 4))          # a line every four tokens
GREEDY = GenerationConfig(temperature=0.0, max_new_tokens=N, stop_at_eos=False)


def line_of(offset: int) -> int:
    return sum(1 for start in LINES if start <= offset)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def cited_set(server_url, tiny_dir) -> Iterator[tuple[str, list[int], list[int], list[int]]]:
    """(set, prompt ids, spatial greedy ids, exact greedy ids); file 1 = prompt + spatial's, file 2 =
    prompt + exact's (Apache-2.0), file 3 the same as 1 but held out (test split)."""
    name = write_tiny_atom_set(server_url, model=str(tiny_dir), seed=4)
    with Client(database_url=server_url, atom_set=name, model=str(tiny_dir), device="cpu") as client:
        prompt = client.engine("spatial").encode(PROMPT)
        spatial = client.engine("spatial").generate(PROMPT, GREEDY).token_ids
        exact = client.engine("exact").generate(PROMPT, GREEDY).token_ids
    with psycopg.connect(server_url) as db:
        (set_id,) = db.execute("SELECT id FROM atom_sets WHERE name = %s", (name,)).fetchone()
        for file_id, path, tokens, split, license in ((1, "src/spatial.py", prompt + spatial, "train", "MIT"),
                                                      (2, "src/exact.py", prompt + exact, "train", "Apache-2.0"),
                                                      (3, "tests/held.py", prompt + spatial, "test", "MIT")):
            db.execute("INSERT INTO atom_set_files (atom_set_id, file_id, path, content_sha256, size_bytes, n_tokens, "
                       "split, license, license_source, token_ids, line_starts) "
                       "VALUES (%s, %s, %s, %s, 0, %s, %s, %s, 'license-file', %s, %s)",
                       (set_id, file_id, path, hashlib.sha256(path.encode()).digest(), len(tokens), split, license,
                        tokens, [s for s in LINES if s < len(tokens)]))
        db.commit()
    yield name, prompt, spatial, exact
    drop_atom_set(server_url, name)


@pytest.fixture(scope="module")
def client(server_url, cited_set, tiny_dir) -> Iterator[Client]:
    with Client(database_url=server_url, atom_set=cited_set[0], model=str(tiny_dir), device="cpu") as c:
        yield c


def expected_first(prompt: list[int], step: int) -> tuple[str, int, int]:
    """The spatial file's citation of generated token `step`: (path, line, context tokens matched)."""
    offset = len(prompt) + step
    return "src/spatial.py", line_of(offset), min(offset, 255)


def test_spatial_events_cite_the_file_line_and_license_of_every_store_pick(client, cited_set) -> None:
    _, prompt, spatial, _ = cited_set
    events = list(client.engine("spatial").session(PROMPT, GREEDY.with_options(cite=True)).events())
    assert [e.token_id for e in events] == spatial
    for e in events:                      # greedy spatial: every token is the store's top pick
        first = e.citations[0]
        assert (first.path, first.line, first.match_tokens) == expected_first(prompt, e.step)
        assert first.kind == "file" and first.license == "MIT" and first.license_source == "license-file"
        assert first.label == f"src/spatial.py:{first.line}"
        assert all(c.path != "tests/held.py" for c in e.citations)
    plain = list(client.engine("spatial").session(PROMPT, GREEDY).events())
    assert all(e.citations is None for e in plain)


def test_the_exact_path_refuses_cite_naming_it(client) -> None:
    with pytest.raises(InvalidArgument) as error:
        client.engine("exact").session(PROMPT, GREEDY.with_options(cite=True))
    assert error.value.name == "cite"


def test_speculative_cites_its_kept_drafts_files_and_memory_and_nothing_else(server_url, cited_set,
                                                                            tiny_dir) -> None:
    """The exact output remembered, the drafter reads the memory: kept drafts cite the exact path's
    file and the remembered generation; the exact model's own tokens cite nothing."""
    name, prompt, _, exact = cited_set
    with psycopg.connect(server_url, autocommit=True) as db:
        (generation,) = db.execute("SELECT generation FROM remember(%s, %s, %s, 'exact', temperature => 0)",
                                   (name, prompt, exact)).fetchone()
        try:
            with Client(database_url=server_url, atom_set=name, model=str(tiny_dir), device="cpu",
                        memory=True) as client:
                events = list(client.engine("speculative").session(PROMPT, GREEDY.with_options(cite=True)).events())
        finally:
            db.execute("SELECT forget(%s)", (name,))
    assert [e.token_id for e in events] == exact
    assert any(e.origin == "draft" for e in events)
    for e in events:
        assert (e.citations is not None) == (e.origin == "draft")
    for e in (e for e in events if e.citations):
        files = [c for c in e.citations if c.kind == "file"]
        assert files[0].path == "src/exact.py" and files[0].license == "Apache-2.0"
        assert files[0].line == line_of(len(prompt) + e.step)
        assert any(c.kind == "memory" and c.generation == generation and c.label.startswith("memory:")
                   for c in e.citations)


def test_cli_cite_prints_file_lines_and_flags_the_verbatim_run(capsys, database_env, cited_set, tiny_dir) -> None:
    name, prompt, spatial, _ = cited_set
    common = ["generate", PROMPT, "--path", "spatial", "--temperature", "0", "--max-new-tokens", str(N),
              "--ignore-eos", "--atom-set", name, "--model", str(tiny_dir), "--device", "cpu"]
    code, out, _ = run_cli(capsys, *common, "--cite")
    assert code == 0
    lines = out.splitlines()
    assert f"[cite] {N} of {N} tokens picked by the store have sources" in lines
    path, line, _ = expected_first(prompt, N - 1)
    assert any(f"{path}:{line} (MIT)" in entry for entry in lines if entry.strip().startswith(f"{N} "))
    verbatim = [entry for entry in lines if "VERBATIM" in entry]
    start_line = line_of(len(prompt))
    assert verbatim == [f"[cite] VERBATIM: tokens 1-{N} ({N}) match src/spatial.py:{start_line} verbatim (MIT)"]
    code, out, _ = run_cli(capsys, *common)
    assert code == 0 and "[cite]" not in out
    code, out, _ = run_cli(capsys, *common, "--cite", "--json")
    body = json.loads(out)
    assert code == 0 and body["token_ids"] == spatial
    assert [c[0]["line"] for c in body["citations"]] == [expected_first(prompt, i)[1] for i in range(N)]
    assert body["verbatim"] == [{"start": 0, "length": N, "path": "src/spatial.py", "line": start_line,
                                 "license": "MIT", "license_source": "license-file"}]
    code, out, _ = run_cli(capsys, *common, "--cite", "--max-new-tokens", "10")   # under 20 tokens: no flag
    assert code == 0 and "VERBATIM" not in out


@pytest.fixture(scope="module")
def served(reader_url, cited_set) -> Iterator[str]:
    server, _ = live_app(reader_url, cited_set[0], pool_size=2)
    with server as url:
        yield url


def sse(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.iter_lines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_api_stream_events_carry_the_citations(served, client, cited_set) -> None:
    name = cited_set[0]
    expected = [[c.as_dict() for c in e.citations]
                for e in client.engine("spatial").session(PROMPT, GREEDY.with_options(cite=True)).events()]
    body = {"prompt": PROMPT, "path": "spatial", "temperature": 0, "max_new_tokens": N, "ignore_eos": True,
            "details": True, "atom_set": name}
    with httpx.Client(base_url=served, timeout=WAIT_S) as http:
        with http.stream("POST", "/api/generate/stream", json={**body, "cite": True}) as response:
            assert response.status_code == 200
            events = [e for e in sse(response) if "token_id" in e]
        assert [e["citations"] for e in events] == expected
        with http.stream("POST", "/api/generate/stream", json=body) as response:
            assert all("citations" not in e for e in sse(response))
        with http.stream("POST", "/api/generate/stream", json={**body, "path": "exact", "cite": True}) as refused:
            refused.read()
        assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "cite"


def test_v1_completions_carry_citations_streamed_and_whole(served, client, cited_set) -> None:
    name = cited_set[0]
    expected = [[c.as_dict() for c in e.citations]
                for e in client.engine("spatial").session(PROMPT, GREEDY.with_options(cite=True)).events()]
    body = {"model": f"exact:spatial:{name}", "prompt": PROMPT, "max_tokens": N, "temperature": 0, "cite": True}
    with httpx.Client(base_url=served, timeout=WAIT_S) as http:
        whole = http.post("/v1/completions", json=body)
        assert whole.status_code == 200, whole.text
        cited = whole.json()["hartonomous"]["citations"]
        assert [c["step"] for c in cited] == list(range(len(cited)))
        assert [c["citations"] for c in cited] == expected[:len(cited)]
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
            chunks = [c["choices"][0].get("hartonomous", {}) for c in sse(response) if c.get("choices")]
        assert [c["citations"] for c in chunks if "citations" in c] == [c["citations"] for c in cited]
        plain = http.post("/v1/completions", json={**body, "cite": False}).json()
        assert "citations" not in plain["hartonomous"]


def test_the_playground_shows_a_tokens_sources_on_hover(served, cited_set) -> None:
    """Headless Chromium: with the cite box ticked, each token of the spatial pane carries its
    file:line (license) in its hover title; unticked, none does."""
    from browser import CHROMIUM, Browser

    if not os.path.exists(CHROMIUM):
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    name, prompt, spatial, _ = cited_set
    with Browser() as browser:
        browser.navigate(served + "/")
        browser.wait_for(f"[...document.querySelectorAll('#atom_set option')].some(o => o.value === "
                         f"{json.dumps(name)})", "the atom set in the selector")
        titles = {}
        for cite in (True, False):
            fill = [f"document.getElementById('prompt').value = {json.dumps(PROMPT)}",
                    f"document.getElementById('atom_set').value = {json.dumps(name)}",
                    f"document.getElementById('cite').checked = {json.dumps(cite)}",
                    *[f"document.getElementById('use-{p}').checked = {json.dumps(p == 'spatial')}"
                      for p in ("spatial", "exact", "speculative", "augmented", "hybrid")],
                    *[f"document.getElementById('{k}').value = '{v}'" for k, v in
                      {"max_new_tokens": N, "temperature": 0, "repetition_penalty": 1}.items()]]
            browser.evaluate("; ".join(fill))
            browser.click("#generate")
            browser.wait_for("document.getElementById('pane-spatial').dataset.state === 'done'", "the spatial pane")
            titles[cite] = browser.evaluate("[...document.querySelectorAll('#pane-spatial .generated .tok')]"
                                            ".map(s => s.title)")
    assert titles[False] == []
    assert len(titles[True]) == N               # the tiny greedy continuation has no EOS
    for step, title in enumerate(titles[True]):
        path, line, _ = expected_first(prompt, step)
        assert title.splitlines()[0] == f"{path}:{line} (MIT)"


def test_augmented_cites_exactly_the_steps_whose_token_was_the_stores_top(server_url, corpus_set) -> None:
    """The corpus set's text as its one train file: a step whose pick was the store's most probable
    token cites the corpus (its (context, token) is in it, at least one context token matched);
    the other steps cite nothing."""
    from test_augmented_path import client as augmented_client
    from tiny_model import TRAIN_TEXT, tiny_model

    tokens = list(tiny_model(0)[1].encode("\n".join(TRAIN_TEXT), add_special_tokens=False))
    with psycopg.connect(server_url, autocommit=True) as db:
        (set_id,) = db.execute("SELECT id FROM atom_sets WHERE name = %s", (corpus_set,)).fetchone()
        db.execute("INSERT INTO atom_set_files (atom_set_id, file_id, path, content_sha256, size_bytes, n_tokens, "
                   "split, license, license_source, token_ids, line_starts) "
                   "VALUES (%s, 1, 'corpus.txt', '\\x00', 0, %s, 'train', NULL, 'unknown', %s, '{0}')",
                   (set_id, len(tokens), tokens))
        try:
            with augmented_client(server_url, corpus_set) as c:
                config = GenerationConfig(max_new_tokens=16, temperature=1.0, top_k=40, top_p=0.9, seed=7,
                                          stop_at_eos=False, cite=True)
                events = list(c.engine("augmented").session("def add(a, b):", config).events())
        finally:
            db.execute("DELETE FROM atom_set_files WHERE atom_set_id = %s", (set_id,))
    assert any(e.store_top for e in events) and not all(e.store_top for e in events)
    for e in events:
        assert (e.citations is not None) == bool(e.store_top)
        if e.citations:
            assert e.citations[0].path == "corpus.txt" and e.citations[0].match_tokens >= 1
            assert e.citations[0].license is None and e.citations[0].license_source == "unknown"
