"""Property/fuzz suite for the HTTP API on a live uvicorn (tiny model, hand-made atom set, reader role).

Bodies start valid and get up to two fields replaced by anything: wrong types, huge numbers,
NaN/Infinity, unicode with lone surrogates, control characters and NUL, unknown fields; raw
bodies add bytes that are not UTF-8, broken and deeply nested JSON. Every answer is a valid
distribution / generation (200), a 422 naming the field, or a 400 with a message; never a
500, never an `internal server error` event. The server and the database still answer after.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from distribution_checks import check_distribution
from generation_helpers import drop_atom_set, write_tiny_atom_set
from server_helpers import WAIT_S, live_app
from test_server import parse_sse
from tiny_model import tiny_tokenizer

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                print_blob=True)
VOCAB = set(range(len(tiny_tokenizer())))
ENDPOINTS = ("/api/next_token", "/api/generate", "/api/generate/batch", "/api/generate/stream")
WEIRD_CHARS = ["\ud800", "\udfff", "\udbff\udc00", "\x00", "\x1b[31m", "\x7f", "\u202e", "\ufeff", "\u2028",
               "\u0085", "\r\n", "\t", "🙂", "東京", "é", "\U0010ffff"]


@pytest.fixture(scope="module")
def atom_set(server_url: str) -> Iterator[str]:
    name = write_tiny_atom_set(server_url, model="tiny", seed=8)
    yield name
    drop_atom_set(server_url, name)


@pytest.fixture(scope="module")
def http(reader_url: str, atom_set: str) -> Iterator[httpx.Client]:
    server, _ = live_app(reader_url, atom_set, pool_size=2)
    with server as url, httpx.Client(base_url=url, timeout=WAIT_S * 4) as client:
        yield client
        assert client.get("/healthz").status_code == 200, "the server did not survive the fuzz requests"


# -- strategies ---------------------------------------------------------------------------------------

any_text = st.lists(st.one_of(st.characters(exclude_categories=[]), st.sampled_from(WEIRD_CHARS)),
                    max_size=40).map("".join)
short_prompt = st.lists(st.one_of(st.characters(exclude_categories=["Cs"]), st.sampled_from(WEIRD_CHARS[3:])),
                        min_size=1, max_size=60).map("".join)
prompt_text = st.one_of(short_prompt, st.sampled_from(["The capital of France is", " x", "\x00", "🙂" * 2000,
                                                       "x" * 8000]))
anything = st.one_of(
    st.none(), st.booleans(), st.integers(), st.sampled_from([2**63, -2**63 - 1, 2**200, 10**300]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([5e-324, 1e-7, -0.0, 1e308, -1e308]),
    any_text, st.lists(st.integers(-3, 400), max_size=4), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                         max_size=2))
VALID = {
    "prompt": prompt_text,
    "prompts": st.lists(short_prompt, min_size=1, max_size=3),
    "atom_set": st.none(),
    "path": st.sampled_from(["spatial", "spatial", "exact"]),
    "temperature": st.one_of(st.just(0.0), st.floats(1e-6, 100)),
    "top_k": st.one_of(st.none(), st.integers(0, 1_000_000)),
    "top_p": st.floats(0, 1, exclude_min=True),
    "repetition_penalty": st.floats(1e-6, 100),
    "search_radius": st.one_of(st.none(), st.floats(1e-300, 10)),
    "max_neighbors": st.integers(1, 100_000),
    "limit": st.integers(1, 1000),
    "max_new_tokens": st.integers(1, 6),
    "seed": st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
    "stop": st.lists(st.text(min_size=1, max_size=5), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 2**31 - 1), max_size=3),
    "ignore_eos": st.booleans(),
    "in_database": st.booleans(),
    "details": st.booleans(),
    "top_n": st.integers(0, 100),
}
FIELDS = {
    "/api/next_token": ("prompt", "path", "atom_set", "temperature", "top_k", "top_p", "repetition_penalty",
                        "search_radius", "max_neighbors", "limit"),
    "/api/generate": ("prompt", "path", "atom_set", "temperature", "top_k", "top_p", "repetition_penalty",
                      "search_radius", "max_neighbors", "max_new_tokens", "seed", "stop", "stop_token_ids",
                      "ignore_eos", "in_database"),
}
FIELDS["/api/generate/batch"] = ("prompts", *FIELDS["/api/generate"][1:])
FIELDS["/api/generate/stream"] = (*FIELDS["/api/generate"], "details", "top_n")


@st.composite
def requests(draw) -> tuple[str, dict]:
    """(endpoint, body): a valid body with up to two fields replaced by anything, or removed, or added."""
    endpoint = draw(st.sampled_from(ENDPOINTS))
    names = FIELDS[endpoint]
    body = {name: draw(VALID[name]) for name in names if name in ("prompt", "prompts") or draw(st.booleans())}
    for name in draw(st.sets(st.sampled_from((*names, "unknown_field")), max_size=2)):
        if draw(st.integers(0, 4)) == 0:
            body.pop(name, None)
        else:
            textual = name in ("prompt", "prompts", "stop", "atom_set")
            body[name] = draw(st.one_of(anything, any_text) if textual else anything)
    if body.get("path") == "exact" and any(len(str(p)) > 200 for p in (body.get("prompt"), body.get("prompts"))):
        body["path"] = "spatial"     # an 8000-character prompt on the exact path takes ~20 s here; see the docs
    return endpoint, body


# -- what a good answer is --------------------------------------------------------------------------

def _check_generation(result: dict, body: dict) -> None:
    assert set(result["token_ids"]) <= VOCAB
    assert len(result["token_ids"]) <= body.get("max_new_tokens", 64)
    assert isinstance(result["text"], str) and result["finish_reason"] and result["state"] != "failed"


def _check_ok(http: httpx.Client, endpoint: str, body: dict, response: httpx.Response) -> None:
    if endpoint == "/api/next_token":
        payload = response.json()
        rows = [(r["token_id"], r["probability"], r["cumulative_probability"]) for r in payload["rows"]]
        if rows:
            check_distribution(rows, VOCAB, complete=payload["total_rows"] == len(rows))
        else:                # only the search radius can leave no candidate: without it, the same request has some
            assert payload["total_rows"] == 0 and body.get("search_radius") is not None
            rest = {k: v for k, v in body.items() if k != "search_radius"}
            unbounded = _send(http, endpoint, json.dumps(rest, ensure_ascii=True, allow_nan=True).encode())
            assert unbounded.status_code == 200 and unbounded.json()["rows"], unbounded.text[:300]
    elif endpoint == "/api/generate":
        _check_generation(response.json(), body)
    elif endpoint == "/api/generate/batch":
        results = response.json()["results"]
        assert len(results) == len(body["prompts"])
        for result in results:
            _check_generation(result, body)
    else:
        events = list(parse_sse(response.text.splitlines()))
        assert events and events[-1] == ("message", "[DONE]"), events[-3:]
        assert not [e for e in events if e[0] == "error"], events


def _check_422(body: dict, response: httpx.Response) -> None:
    payload = response.json()
    assert payload["error"] and payload["detail"]
    for item in payload["detail"]:
        top = item["field"].split(".")[0]
        assert top in body or top in ("body", "prompt", "prompts"), item
        assert payload["error"].startswith(payload["detail"][0]["field"])


def _send(http: httpx.Client, endpoint: str, content: bytes) -> httpx.Response:
    return http.post(endpoint, content=content, headers={"Content-Type": "application/json"})


@settings(FUZZ, max_examples=150)
@given(request=requests())
def test_any_request_gets_a_valid_answer_a_422_or_a_400_never_a_500(http, request) -> None:
    endpoint, body = request
    content = json.dumps(body, ensure_ascii=True, allow_nan=True).encode()   # lone surrogates as \ud800
    response = _send(http, endpoint, content)
    event(f"{endpoint} {response.status_code}")
    assert response.status_code in (200, 400, 422), (response.status_code, response.text[:300])
    assert "internal server error" not in response.text and "Traceback" not in response.text
    if response.status_code == 200:
        _check_ok(http, endpoint, body, response)
    elif response.status_code == 422:
        _check_422(body, response)
    else:
        assert response.json()["error"]


RAW_BODIES = [b"", b"{", b"{not json", b"null", b"[]", b"42", b'"prompt"', b"\xff\xfe\xfd", b'{"prompt": "a\xff"}',
              b'{"prompt": "\xed\xa0\x80"}', b"[" * 100_000 + b"]" * 100_000, b'{"prompt": ' + b"[" * 5000 + b"]" * 5000
              + b"}", b'{"prompt": "x", "prompt": 1}', b'{"prompt": "hi", "temperature": NaN}',
              b'{"prompt": "hi", "top_k": 1e400}', b"\x00" * 64, json.dumps({"prompt": "y" * 2_000_000}).encode()]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_malformed_bodies_are_422_naming_the_body_or_field(http, endpoint) -> None:
    for raw in RAW_BODIES:
        response = _send(http, endpoint, raw)
        assert response.status_code == 422, (raw[:40], response.status_code, response.text[:200])
        payload = response.json()
        assert payload["error"].startswith(payload["detail"][0]["field"])
        assert payload["detail"][0]["field"] in ("body", "prompt", "prompts", "temperature", "top_k"), payload["detail"]
        assert "Traceback" not in response.text


@pytest.mark.parametrize("body,field", [
    ({"prompt": "hi", "temperature": 1e-320}, "temperature"),
    ({"prompt": "hi", "repetition_penalty": 5e-324}, "repetition_penalty"),
    ({"prompt": "hi", "atom_set": "a\x00b"}, "atom_set"),
    ({"prompt": "\ud800"}, "prompt"),
])
def test_inputs_that_used_to_be_500_are_422(http, body, field) -> None:
    """Regressions found by the fuzz suite: each was an HTTP 500 on the spatial path."""
    for endpoint in ("/api/next_token", "/api/generate", "/api/generate/stream"):
        response = _send(http, endpoint, json.dumps(body).encode())
        assert response.status_code == 422, (endpoint, response.text[:300])
        assert response.json()["detail"][0]["field"] == field


def test_the_database_is_still_up(http, server_url) -> None:
    assert http.get("/healthz").json()["database"] == "ok"
    with psycopg.connect(server_url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert math.isfinite(http.post("/api/next_token", json={"prompt": "hi"}).json()["rows"][0]["probability"])
