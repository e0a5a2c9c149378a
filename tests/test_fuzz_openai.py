"""Property/fuzz suite for /v1 on a live uvicorn (tiny model with a chat template, a hand-made atom set).

Bodies start valid and get up to two fields replaced by anything (wrong types, huge numbers,
NaN, lone surrogates, NUL, unknown fields); raw bodies add bytes that are not UTF-8 and broken or
deeply nested JSON. Every answer is a completion in OpenAI's shape (200), or OpenAI's error shape
with a 400 or a 404 (`model_not_found`); never a 422 or a 500, never an error inside a stream.
The server still answers after.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from generation_helpers import drop_atom_set, write_tiny_atom_set
from server_helpers import WAIT_S, live_app
from test_openai_api import templated_model
from test_server import parse_sse

FUZZ = settings(deadline=None, max_examples=150, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
WEIRD = ["\ud800", "\x00", "\u202e", "🙂", "東京", "\r\n", "\U0010ffff"]


@pytest.fixture(scope="module")
def atom_set(server_url: str) -> Iterator[str]:
    name = write_tiny_atom_set(server_url, model="tiny", seed=9)
    yield name
    drop_atom_set(server_url, name)


@pytest.fixture(scope="module")
def http(reader_url: str, atom_set: str) -> Iterator[httpx.Client]:
    server, _ = live_app(reader_url, atom_set, exact_model=templated_model(), pool_size=2)
    with server as url, httpx.Client(base_url=url, timeout=WAIT_S * 4) as client:
        yield client
        assert client.get("/v1/models").status_code == 200, "the server did not survive the fuzz requests"


any_text = st.lists(st.one_of(st.characters(), st.sampled_from(WEIRD)), max_size=30).map("".join)
anything = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from([2**63, -2**63 - 1, 10**300]),
                     st.floats(allow_nan=True, allow_infinity=True), any_text, st.lists(st.integers(-3, 400),
                                                                                        max_size=4),
                     st.dictionaries(st.text(max_size=4), st.integers(), max_size=2))
prompt = st.one_of(st.lists(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40).map("".join),
                   st.lists(st.integers(0, 300), min_size=1, max_size=8))
message = st.fixed_dictionaries({"role": st.sampled_from(["system", "user", "assistant", "developer"]),
                                 "content": st.text(max_size=40)})
VALID = {
    "model": st.sampled_from(["exact", "exact", "{spatial}"]),
    "prompt": prompt,
    "messages": st.lists(message, min_size=1, max_size=3),
    "max_tokens": st.integers(1, 4),
    "max_completion_tokens": st.integers(1, 4),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0, 1, exclude_min=True),
    "seed": st.integers(-2**63, 2**63 - 1),
    "stop": st.one_of(st.text(min_size=1, max_size=4), st.lists(st.text(min_size=1, max_size=4), max_size=4)),
    "stream": st.booleans(),
    "logprobs": st.integers(0, 5),
    "echo": st.booleans(),
    "top_k": st.integers(0, 50),
    "repetition_penalty": st.floats(1e-6, 100),
    "n": st.just(1),
    "user": st.text(max_size=8),
}
FIELDS = {
    "/v1/completions": ("model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream",
                        "logprobs", "echo", "top_k", "repetition_penalty", "n", "user"),
    "/v1/chat/completions": ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
                             "seed", "stop", "stream", "top_k", "repetition_penalty", "n", "user"),
}
REQUIRED = ("model", "prompt", "messages")


@st.composite
def requests(draw) -> tuple[str, dict]:
    """(endpoint, body): a valid body with up to two fields replaced by anything, removed, or added."""
    endpoint = draw(st.sampled_from(tuple(FIELDS)))
    names = FIELDS[endpoint]
    body = {name: draw(VALID[name]) for name in names if name in REQUIRED or draw(st.booleans())}
    for name in draw(st.sets(st.sampled_from((*names, "unknown_field", "presence_penalty")), max_size=2)):
        if draw(st.integers(0, 4)) == 0:
            body.pop(name, None)
        else:
            body[name] = draw(anything)
    return endpoint, body


def check_error(response: httpx.Response) -> None:
    assert response.status_code in (400, 404), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error"
    assert response.status_code == 400 or error["code"] == "model_not_found"


def check_answer(response: httpx.Response, body: dict) -> None:
    """A 200 is a whole completion, or a stream of chunks ending in [DONE] with no error inside."""
    assert response.status_code == 200, response.text
    if body.get("stream") is True:
        events = [data for _, data in parse_sse(response.text.splitlines())]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(data) for data in events[:-1]]
        assert chunks and all("error" not in chunk for chunk in chunks)
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
        return
    reply = response.json()
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")
    limit = body.get("max_completion_tokens") or body.get("max_tokens") or 512
    assert 1 <= reply["usage"]["completion_tokens"] <= limit


@FUZZ
@given(request=requests())
def test_every_v1_answer_is_a_completion_or_an_openai_error(http, atom_set, request):
    endpoint, body = request
    if isinstance(body.get("model"), str):
        body["model"] = body["model"].format(spatial=f"exact:spatial:{atom_set}")
    response = http.post(endpoint, content=json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass"),
                         headers={"Content-Type": "application/json"})
    event(f"{endpoint} {response.status_code}")
    if response.status_code == 200:
        check_answer(response, body)
    else:
        check_error(response)


@FUZZ
@given(raw=st.one_of(st.binary(max_size=60), st.sampled_from([b"[" * 5000 + b"]" * 5000, b'{"model": ',
                                                              b'{"model": "exact", "prompt": "\xff\xfe"}', b"null"])))
def test_raw_bodies_are_400_in_openais_shape(http, raw):
    for endpoint in FIELDS:
        response = http.post(endpoint, content=raw, headers={"Content-Type": "application/json"})
        check_error(response)
