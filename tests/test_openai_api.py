"""The OpenAI-compatible API (/v1) through the official `openai` client, against a live server with
the tiny model and a real database: the Python Client on the same model is the oracle."""

from __future__ import annotations

import asyncio
import copy
import math
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest

from generation_helpers import tiny_atom_set
from hartonomous.client import Client
from hartonomous.runtimes.reference import ExactModel
from server_helpers import WAIT_S, GatedModel, live_app
from test_augmented_path import corpus_set, tiny_dir  # noqa: F401 - fixtures: a set with corpus labels and a gate
from tiny_model import tiny_model, tiny_tokenizer

PROMPT = "def add(a, b):"
# A chat template for the tiny tokenizer, as a model's metadata would carry one (the real one is tested below).
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "add two numbers"}]


def templated_tokenizer():
    """A copy of the (shared, cached) tiny tokenizer with TEMPLATE in its metadata."""
    tokenizer = copy.deepcopy(tiny_tokenizer())
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def templated_model() -> ExactModel:
    return ExactModel(tiny_model(0)[0], templated_tokenizer())


@pytest.fixture(scope="module")
def atom_set(server_url):
    with tiny_atom_set(server_url, seed=5) as name:
        yield name


@pytest.fixture(scope="module")
def served(reader_url, atom_set):
    """(base URL, runtime) of a server whose tiny model carries a chat template."""
    server, runtime = live_app(reader_url, atom_set, exact_model=templated_model(), pool_size=2)
    with server as url:
        yield url, runtime


@pytest.fixture(scope="module")
def client(served) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0, timeout=WAIT_S) as c:
        yield c


@pytest.fixture(scope="module")
def direct(reader_url, atom_set):
    """The Python client on the same database and model: the oracle for the API."""
    with Client(database_url=reader_url, atom_set=atom_set, spatial_tokenizer=tiny_tokenizer(),
                exact_model=templated_model()) as c:
        yield c


def greedy(direct, prompt, n: int, path: str = "exact", **options):
    return direct.generate(prompt, path, temperature=0, top_k=None, top_p=1.0, max_new_tokens=n, **options)


def rendered(messages) -> list[int]:
    tokenizer = templated_tokenizer()
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def error_of(call) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value


# -- models ------------------------------------------------------------------------------------------


def test_models_list_the_exact_model_and_each_servable_path_over_the_set(client, atom_set):
    ids = [m.id for m in client.models.list()]
    assert ids[0] == "exact"
    assert f"exact:spatial:{atom_set}" in ids and f"exact:speculative:{atom_set}" in ids
    # The tiny set has no corpus labels, gate or risk predictor: the paths needing them are not offered.
    assert f"exact:augmented:{atom_set}" not in ids and f"exact:hybrid:{atom_set}" not in ids
    assert client.models.retrieve(f"exact:spatial:{atom_set}").id == f"exact:spatial:{atom_set}"


@pytest.mark.parametrize("model", ["smollm3", "exact:augmented:{set}", "exact:spatial:no_such_set", "exact:warp:{set}"])
def test_an_unknown_or_unservable_model_is_404_model_not_found(client, atom_set, model):
    model = model.format(set=atom_set)
    error = error_of(lambda: client.completions.create(model=model, prompt=PROMPT, max_tokens=2))
    assert error.status_code == 404 and error.code == "model_not_found" and error.param == "model"
    assert error_of(lambda: client.models.retrieve(model)).status_code == 404


# -- completions ----------------------------------------------------------------------------------------


def test_greedy_completion_is_the_exact_paths_text_with_usage(client, direct):
    reply = client.completions.create(model="exact", prompt=PROMPT, max_tokens=6, temperature=0)
    expected = greedy(direct, PROMPT, 6)
    choice = reply.choices[0]
    assert reply.object == "text_completion" and reply.model == "exact"
    assert choice.text == expected.text
    assert choice.finish_reason == ("length" if expected.finish_reason == "length" else "stop")
    assert reply.usage.prompt_tokens == len(expected.prompt_ids)
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_a_prompt_of_token_ids_and_echo(client, direct):
    ids = tiny_tokenizer().encode(PROMPT)
    reply = client.completions.create(model="exact", prompt=ids, max_tokens=4, temperature=0, echo=True)
    expected = greedy(direct, ids, 4)
    assert reply.choices[0].text == direct.engine("exact").tokenizer.decode(ids) + expected.text
    assert reply.usage.prompt_tokens == len(ids)


def test_echo_with_logprobs_scores_each_prompt_token_with_the_exact_model(client, direct):
    ids = tiny_tokenizer().encode(PROMPT)
    reply = client.completions.create(model="exact", prompt=ids, max_tokens=4, temperature=0, echo=True, logprobs=2)
    plain = client.completions.create(model="exact", prompt=ids, max_tokens=4, temperature=0, logprobs=2)
    echoed, alone = reply.choices[0].logprobs, plain.choices[0].logprobs
    assert reply.choices[0].text == direct.engine("exact").tokenizer.decode(ids) + plain.choices[0].text
    assert len(echoed.tokens) == len(ids) + len(alone.tokens)
    # Nothing comes before the first token: no logprob, no alternatives (OpenAI's null).
    assert echoed.token_logprobs[0] is None and echoed.top_logprobs[0] is None
    # Each later prompt token: the exact model's own distribution after the tokens before it, at temperature 1.
    for i in range(1, len(ids)):
        rows = {r.token_id: r.probability for r in direct.next_token(ids[:i], "exact", temperature=1.0,
                                                                        top_k=None, top_p=1.0)}
        assert echoed.token_logprobs[i] == pytest.approx(math.log(rows[ids[i]]), abs=1e-4)
        assert 1 <= len(echoed.top_logprobs[i]) <= 2 and max(echoed.top_logprobs[i].values()) <= 0
    # The completion's part is the one a request without echo gets.
    assert echoed.token_logprobs[len(ids):] == pytest.approx(alone.token_logprobs, abs=1e-5)
    assert echoed.text_offset == sorted(echoed.text_offset) and echoed.text_offset[0] == 0


def test_a_streamed_echo_sends_the_prompt_first_then_the_completion(client):
    whole = client.completions.create(model="exact", prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                      logprobs=1)
    chunks = list(client.completions.create(model="exact", prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                            logprobs=1, stream=True))
    assert chunks[0].choices[0].text == PROMPT and chunks[0].choices[0].logprobs.token_logprobs[0] is None
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    streamed = [v for c in chunks if c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(whole.choices[0].logprobs.token_logprobs[1:],
                                                                 abs=1e-5)


def test_a_seed_reproduces_a_sampled_completion_at_openais_defaults(client):
    runs = [client.completions.create(model="exact", prompt=PROMPT, max_tokens=8, seed=11).choices[0].text
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_the_spatial_path_over_the_set_matches_the_client(client, direct, atom_set):
    reply = client.completions.create(model=f"exact:spatial:{atom_set}", prompt=PROMPT, max_tokens=5, temperature=0)
    assert reply.choices[0].text == greedy(direct, PROMPT, 5, "spatial").text
    assert reply.model_extra["hartonomous"]["path"] == "spatial"
    assert reply.model_extra["hartonomous"]["atom_set"] == atom_set


def test_a_stop_sequence_cuts_the_text_and_finishes_with_stop(client, direct):
    full = greedy(direct, PROMPT, 12).text
    stop = full[3:5]
    reply = client.completions.create(model="exact", prompt=PROMPT, max_tokens=12, temperature=0, stop=[stop])
    assert reply.choices[0].text == full[:full.find(stop)]
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model_extra["hartonomous"]["finish_reason"] == "stop_string"


def test_logprobs_are_the_paths_own_distribution_at_temperature_1(client, direct):
    reply = client.completions.create(model="exact", prompt=PROMPT, max_tokens=3, temperature=0, logprobs=5)
    logprobs = reply.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 3
    first = direct.next_token(PROMPT, "exact", temperature=1.0, top_k=None, top_p=1.0)
    top = logprobs.top_logprobs[0]
    assert len(top) == 5
    for row in first[:5]:
        assert math.isclose(top[row.text], math.log(row.probability), rel_tol=1e-5, abs_tol=1e-6)
    # Greedy picks the most likely token: its logprob is the best of the top five.
    assert logprobs.token_logprobs[0] == pytest.approx(max(top.values()))


def test_streamed_completion_joins_to_the_whole_text_then_usage(client, direct):
    chunks = list(client.completions.create(model="exact", prompt=PROMPT, max_tokens=6, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == greedy(direct, PROMPT, 6).text
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6


def test_a_streamed_speculative_completion_says_where_each_token_came_from(client, direct, atom_set):
    chunks = list(client.completions.create(model=f"exact:speculative:{atom_set}", prompt=PROMPT, max_tokens=6,
                                            temperature=0, stream=True))
    tokens = [c for c in chunks if c.choices[0].text]
    assert "".join(c.choices[0].text for c in chunks) == greedy(direct, PROMPT, 6).text   # the exact path's output
    assert tokens and all(c.choices[0].model_extra["hartonomous"]["origin"] in ("draft", "exact") for c in tokens)
    assert chunks[-1].model_extra["hartonomous"]["path"] == "speculative"


# -- chat ----------------------------------------------------------------------------------------------


def test_chat_renders_the_models_template_and_answers_as_the_exact_path(client, direct):
    reply = client.chat.completions.create(model="exact", messages=MESSAGES, max_completion_tokens=5, temperature=0)
    expected = greedy(direct, rendered(MESSAGES), 5)
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected.text
    assert reply.usage.prompt_tokens == len(rendered(MESSAGES))


def test_streamed_chat_deltas_join_to_the_reply_with_usage_last(client, direct):
    stream = client.chat.completions.create(model="exact", messages=MESSAGES, max_tokens=5, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].object == "chat.completion.chunk" and chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == greedy(direct, rendered(MESSAGES), 5).text
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == len(rendered(MESSAGES))


def test_chat_logprobs_list_each_token_with_its_top_alternatives(client):
    reply = client.chat.completions.create(model="exact", messages=MESSAGES, max_tokens=3, temperature=0,
                                           logprobs=True, top_logprobs=2)
    content = reply.choices[0].logprobs.content
    assert len(content) == 3
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)
    assert "".join(entry.token for entry in content) == reply.choices[0].message.content


def test_async_client_chat_and_stream(served, direct):
    async def main():
        async with openai.AsyncOpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0) as c:
            whole = await c.chat.completions.create(model="exact", messages=MESSAGES, max_tokens=4, temperature=0)
            stream = await c.completions.create(model="exact", prompt=PROMPT, max_tokens=4, temperature=0,
                                                stream=True)
            pieces = [chunk.choices[0].text async for chunk in stream]
            return whole.choices[0].message.content, "".join(pieces)

    chat, text = asyncio.run(main())
    assert chat == greedy(direct, rendered(MESSAGES), 4).text
    assert text == greedy(direct, PROMPT, 4).text


def test_a_model_without_a_chat_template_is_400_for_chat(reader_url, atom_set):
    server, _ = live_app(reader_url, atom_set, pool_size=1)
    with server as url, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as c:
        error = error_of(lambda: c.chat.completions.create(model="exact", messages=MESSAGES, max_tokens=2))
        assert error.status_code == 400 and error.param == "messages" and "chat template" in error.message
        assert c.completions.create(model="exact", prompt=PROMPT, max_tokens=2).usage.completion_tokens >= 1


# -- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra, param", [
    ({"n": 2}, "n"), ({"presence_penalty": 0.5}, "presence_penalty"), ({"frequency_penalty": -1}, "frequency_penalty"),
    ({"temperature": 2.5}, "temperature"), ({"top_p": 0}, "top_p"), ({"max_tokens": 0}, "max_tokens"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"logprobs": 6}, "logprobs"),
    ({"logit_bias": {"1": 5}}, "logit_bias"), ({"best_of": 3}, "best_of"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
])
def test_completion_fields_out_of_range_are_400_naming_them(client, extra, param):
    error = error_of(lambda: client.completions.create(model="exact", prompt=PROMPT, max_tokens=2, extra_body=extra)
                     if param in ("logit_bias", "best_of") else
                     client.completions.create(model="exact", prompt=PROMPT, **{"max_tokens": 2, **extra}))
    assert error.status_code == 400 and error.param == param
    assert error.type == "invalid_request_error" or error.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("extra, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"top_logprobs": 2}, "top_logprobs"),
])
def test_chat_fields_this_server_does_not_implement_are_400_naming_them(client, extra, param):
    error = error_of(lambda: client.chat.completions.create(model="exact", messages=MESSAGES, max_tokens=2, **extra))
    assert error.status_code == 400 and error.param == param


def test_an_image_in_a_message_is_400_naming_the_part(client):
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this"},
                                             {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]
    error = error_of(lambda: client.chat.completions.create(model="exact", messages=messages, max_tokens=2))
    assert error.status_code == 400 and error.param == "messages[0].content[1]"


def test_an_unknown_field_is_400_naming_it_and_an_extension_is_accepted(client, direct):
    error = error_of(lambda: client.completions.create(model="exact", prompt=PROMPT, max_tokens=2,
                                                       extra_body={"top_a": 0.1}))
    assert error.status_code == 400 and error.param == "top_a" and "unrecognized" in error.message
    reply = client.completions.create(model="exact", prompt=PROMPT, max_tokens=4, temperature=0.7, seed=3,
                                      extra_body={"top_k": 1, "repetition_penalty": 1.0})
    assert reply.choices[0].text == greedy(direct, PROMPT, 4).text      # top_k 1 is greedy


def test_speculative_logprobs_are_its_targets_the_exact_paths(client, atom_set):
    ask = dict(prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3)
    speculative = client.completions.create(model=f"exact:speculative:{atom_set}", **ask).choices[0]
    exact = client.completions.create(model="exact", **ask).choices[0]
    assert speculative.text == exact.text
    assert speculative.logprobs.tokens == exact.logprobs.tokens
    assert speculative.logprobs.token_logprobs == pytest.approx(exact.logprobs.token_logprobs, rel=1e-5, abs=1e-6)
    for ours, theirs in zip(speculative.logprobs.top_logprobs, exact.logprobs.top_logprobs):
        assert ours.keys() == theirs.keys()


def test_a_prompt_beyond_the_models_context_is_400_with_the_numbers(client):
    ids = tiny_tokenizer().encode(PROMPT) * 40          # the tiny model's context is 256 tokens
    error = error_of(lambda: client.completions.create(model="exact", prompt=ids, max_tokens=200))
    assert error.status_code == 400 and error.code == "context_length_exceeded"
    assert "256" in error.message and str(len(ids)) in error.message


def test_chat_without_max_tokens_takes_what_the_context_leaves(client):
    reply = client.chat.completions.create(model="exact", messages=MESSAGES, temperature=0,
                                           extra_body={"top_k": 1})
    assert reply.usage.total_tokens <= 256                # the tiny model's context
    assert reply.usage.completion_tokens >= 1


@pytest.mark.parametrize("body, content_type", [
    (b"{not json", "application/json"), (b"[1, 2]", "application/json"), (b"model=exact", "text/plain"),
    (b"\xff\xfe", "application/json"), (b"{}", "application/json"),
])
def test_a_malformed_body_is_400_in_openais_shape_never_422_or_500(served, body, content_type):
    for route in ("/v1/completions", "/v1/chat/completions"):
        response = httpx.post(served[0] + route, content=body, headers={"Content-Type": content_type}, timeout=WAIT_S)
        assert response.status_code == 400
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_another_v1_address_is_404_in_openais_shape(served):
    for method, route in (("POST", "/v1/embeddings"), ("GET", "/v1/files"), ("POST", "/v1/responses")):
        response = httpx.request(method, served[0] + route, json={"model": "exact"}, timeout=WAIT_S)
        assert response.status_code == 404
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


# -- cancellation ----------------------------------------------------------------------------------------


def test_a_client_leaving_a_stream_cancels_the_generation(reader_url, atom_set):
    model = GatedModel()
    server, runtime = live_app(reader_url, atom_set, exact_model=model, pool_size=1)
    with server as url, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=WAIT_S) as c:
        model.permits.release(3)
        stream = c.completions.create(model="exact", prompt=PROMPT, max_tokens=200, temperature=0, stream=True)
        first = next(iter(stream))
        assert first.choices[0].finish_reason is None
        stream.close()
        model.permits.release(50)                      # enough for the generation to notice it is cancelled
        deadline = threading.Event()
        for _ in range(int(WAIT_S / 0.1)):
            if runtime.finished and not runtime.active:
                break
            deadline.wait(0.1)
        assert runtime.finished[-1].finish_reason == "cancelled"
        assert len(runtime.finished[-1].token_ids) < 200


def test_a_client_leaving_a_whole_completion_cancels_the_generation(reader_url, atom_set):
    model = GatedModel()
    server, runtime = live_app(reader_url, atom_set, exact_model=model, pool_size=1)
    with server as url, openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=1.0) as c:
        model.permits.release(2)
        with pytest.raises(openai.APITimeoutError):      # the client gives up and closes the connection
            c.completions.create(model="exact", prompt=PROMPT, max_tokens=200, temperature=0)
        waited = threading.Event()
        for _ in range(150):            # one step at a time, so the server has time to see the client gone
            if runtime.finished and not runtime.active:
                break
            model.permits.release(1)
            waited.wait(0.05)
        for _ in range(int(WAIT_S / 0.1)):
            if runtime.finished and not runtime.active:
                break
            waited.wait(0.1)
        assert runtime.finished[-1].finish_reason == "cancelled"
        assert len(runtime.finished[-1].token_ids) < 200


def test_concurrent_streams_over_the_exact_and_speculative_models_have_no_errors(served, atom_set):
    """The load benchmark's client (benchmarks/openai_load.py), briefly: every stream finishes."""
    from benchmarks.openai_load import run

    models = ["exact", f"exact:speculative:{atom_set}"]
    report = asyncio.run(run(served[0] + "/v1", models, clients=6, seconds=3, max_tokens=4, timeout_s=WAIT_S))
    assert report["errors"] == 0, report
    assert all(report["models"][m]["requests"] >= 1 and report["models"][m]["tokens"] >= 1 for m in models)


# -- the real SmolLM2 ---------------------------------------------------------------------------------------


def test_smollm2_chat_is_rendered_with_its_own_template_and_default_system_prompt():
    from hartonomous.model import SMOLLM2, load_fast_tokenizer, load_tokenizer
    from hartonomous.server.openai_api import render_chat
    from optional_parts import require_smollm2

    require_smollm2()
    tokenizer = load_tokenizer(SMOLLM2)
    with_system = render_chat(tokenizer, MESSAGES)
    assert with_system == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nadd two numbers<|im_end|>\n"
                           "<|im_start|>assistant\n")
    # Without a system message, the template's own default system prompt comes first.
    alone = render_chat(tokenizer, MESSAGES[1:])
    assert alone.startswith("<|im_start|>system\n") and "Be brief." not in alone
    assert alone.endswith("<|im_start|>user\nadd two numbers<|im_end|>\n<|im_start|>assistant\n")
    # The GGUF runtimes' tokenizer (no transformers) renders the same template to the same text.
    fast = load_fast_tokenizer(SMOLLM2)
    assert render_chat(fast, MESSAGES) == with_system and render_chat(fast, MESSAGES[1:]) == alone


def test_smollm2_served_chats_through_its_template_within_its_context(reader_url, atom_set):
    from hartonomous.model import SMOLLM2, load_tokenizer
    from hartonomous.server import Runtime, ServerConfig, create_app
    from hartonomous.server.openai_api import render_chat
    from optional_parts import require_smollm2
    from server_helpers import LiveServer

    require_smollm2()
    tokenizer = load_tokenizer(SMOLLM2)
    runtime = Runtime(ServerConfig(database_url=reader_url, atom_set=atom_set, model=SMOLLM2, pool_size=1))
    with LiveServer(create_app(runtime)) as url, \
            openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120) as c:
        assert [m.id for m in c.models.list()][0] == SMOLLM2
        reply = c.chat.completions.create(model=SMOLLM2, messages=MESSAGES, max_tokens=8, temperature=0)
        prompt = tokenizer.encode(render_chat(tokenizer, MESSAGES), add_special_tokens=False)
        assert reply.usage.prompt_tokens == len(prompt)
        assert reply.choices[0].message.content and reply.choices[0].finish_reason in ("stop", "length")
        # 8,192 tokens of context, from the model's own metadata.
        error = error_of(lambda: c.completions.create(model=SMOLLM2, prompt=[1] * 8190, max_tokens=16))
        assert error.status_code == 400 and error.code == "context_length_exceeded" and "8192" in error.message


# -- the augmented path: listed where its set has corpus labels and a gate -------------------------------------


def test_the_augmented_path_is_listed_for_a_set_with_corpus_labels_and_a_gate_and_streams_its_weights(
        client, reader_url, corpus_set):
    ids = [m.id for m in client.models.list()]
    model = f"exact:augmented:{corpus_set}"
    assert model in ids
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, stream=True))
    tokens = [c for c in chunks if c.choices[0].text]
    assert tokens and all(0 < c.choices[0].model_extra["hartonomous"]["weight"] < 1 for c in tokens)
    with Client(database_url=reader_url, atom_set=corpus_set, exact_model=templated_model()) as direct:
        expected = greedy(direct, PROMPT, 5, "augmented")
        first = direct.next_token(PROMPT, "augmented", temperature=1.0, top_k=None, top_p=1.0)
    assert "".join(c.choices[0].text for c in chunks) == expected.text
    # logprobs: the augmented mixture's own distribution at temperature 1.
    reply = client.completions.create(model=model, prompt=PROMPT, max_tokens=1, temperature=0, logprobs=3)
    top = reply.choices[0].logprobs.top_logprobs[0]
    for row in first[:3]:
        assert top[row.text] == pytest.approx(math.log(row.probability), rel=1e-5, abs=1e-6)


def test_hybrid_is_listed_for_a_set_with_a_risk_predictor_and_reports_each_steps_distribution(client, corpus_set):
    model = f"exact:hybrid:{corpus_set}"
    assert model in [m.id for m in client.models.list()]
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2,
                                            stream=True))
    tokens = [c.choices[0] for c in chunks if c.choices[0].logprobs and c.choices[0].logprobs.tokens]
    assert tokens and all(c.model_extra["hartonomous"]["route"] in ("spatial", "exact") for c in tokens)
    assert all(len(c.logprobs.top_logprobs[0]) == 2 and c.logprobs.token_logprobs[0] <= 0 for c in tokens)
