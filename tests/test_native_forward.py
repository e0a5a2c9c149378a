"""The int4 runtime's native forward (hartonomous/runtimes/native/int4_forward.cpp).

It computes what the Python forward computes, in its own loops between the same matmuls, so the two
agree within bfloat16 rounding, not to the bit: the native forward sums a norm's squares and an
attention row's scores in its own order and takes its own exp, and a last-bit difference before a
matmul's bfloat16 input rounds differently about once in a few hundred values. What holds to the
bit is the runtime's promise on the native forward as on the Python one: a token's logits are the
same decoded alone, in a chain or in a tree, on one thread or two, and a prompt continued from a
cached prefix gives the bits of the same prompt cold. `make install-native` builds it; under CI a
missing build fails these tests (tests/optional_parts.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest
import torch
from optional_parts import missing, require_smollm2
from test_runtime_int4 import VOCAB, assert_tiny_rounding, top2_gap, write_tiny_gguf

from hartonomous.backends.base import Cancelled
from hartonomous.errors import InvalidArgument, UserError
from hartonomous.runtimes import native_build, runtime_summary
from hartonomous.runtimes.cancel import watching
from hartonomous.runtimes.gguf_weights import GGUFWeights
from hartonomous.runtimes.int4 import FORWARD_ENV, Int4Model, Int4Weights, StaticKVCache

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py

NOT_BUILT = "the native int4 forward is not built (`make install-native`, which `make install` runs)"
FULL_CONTEXT = 8192


def require_native() -> None:
    if native_build.load() is None:
        missing(NOT_BUILT)


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Int4Weights:
    """The tiny random llama, its context widened to SmolLM2's 8,192 positions."""
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf")
    w = Int4Weights.from_gguf(GGUFWeights(path))
    return Int4Weights(dataclasses.replace(w.config, context_length=FULL_CONTEXT), w.tensors)


@pytest.fixture(scope="module")
def native(weights) -> Int4Model:
    require_native()
    model = Int4Model(weights, tokenizer=None, description="tiny", forward="native")
    assert model.forward_kind == "native"
    return model


@pytest.fixture(scope="module")
def python(weights) -> Int4Model:
    model = Int4Model(weights, tokenizer=None, description="tiny", forward="python")
    assert model.forward_kind == "python" and model.native is None
    return model


def random_ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and torch.equal(a, b), f"max |Δ| {float((a - b).abs().max())}"


# -- what it computes ------------------------------------------------------------------------------

def test_it_computes_the_python_forwards_logits_within_bfloat16_rounding(native, python):
    ids = random_ids(1, 60)
    for model in (native, python):
        cache = model.new_cache()
        model.prefill(ids[:20], cache)                                  # a short prompt: rows as decoded
        model.rows = (model.extend(ids[20:40], cache, 20), torch.stack([model.decode_one_token(t, cache) for t in ids[40:]]))
    for a, b in zip(native.rows, python.rows):
        assert_tiny_rounding(a, b)
        assert bool((a.argmax(-1) == b.argmax(-1)).all())


def test_a_chunked_prompt_gives_the_python_forwards_answer_within_bfloat16_rounding(native, python):
    ids = random_ids(2, 300)                                           # 128 + 128 + 44 rows, batched
    assert_tiny_rounding(native.prefill(ids, native.new_cache()), python.prefill(ids, python.new_cache()))


def test_a_token_has_the_same_bits_decoded_alone_in_a_chain_and_in_a_tree(native):
    ids = random_ids(3, 40)
    past, branches = 30, [[5, 6, 7], [9, 10], [11]]
    alone = native.new_cache()
    native.prefill(ids[:past], alone)
    decoded = torch.stack([native.decode_one_token(t, alone) for t in ids[past:]])
    chain = native.new_cache()
    native.prefill(ids[:past], chain)
    same_bits(native.extend(ids[past:], chain, len(ids) - past), decoded)
    tree = native.new_cache()
    native.prefill(ids[:past], tree)
    rows = native.extend_tree(ids[past:past + 2], branches, tree)
    same_bits(rows[:2], decoded[:2])
    at = 2
    for branch in branches:
        chain.crop(past)
        same_bits(rows[at:at + len(branch)], native.extend(ids[past:past + 2] + branch, chain, len(branch) + 1)[1:])
        at += len(branch)


def test_the_bits_do_not_depend_on_the_thread_count(native):
    """Attention over 1,500 keys is split across threads by row and head: each is still computed
    by one thread in one order."""
    ids = random_ids(4, 1508)
    out = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        cache = native.new_cache()
        native.prefill(ids[:1500], cache)
        out.append(native.extend(ids[1500:], cache, 8))
    torch.set_num_threads(1)
    same_bits(out[0], out[1])


def test_a_prompt_continued_from_cached_chunks_gives_the_bits_of_the_prompt_cold(native):
    ids = random_ids(5, 300)
    cold = native.new_cache()
    cold_logits = native.prefill(ids, cold)
    warm = native.new_cache()
    native.prefill(ids[:256], warm)
    same_bits(native.prefill_more(ids[256:], warm), cold_logits)
    same_bits(warm.k[:, :, :300], cold.k[:, :, :300])


# -- the full context --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def full_cache(native) -> tuple[list[int], StaticKVCache]:
    ids = random_ids(6, FULL_CONTEXT - 2)
    cache = native.new_cache()
    native.prefill(ids, cache)
    return ids, cache


def test_attention_at_the_full_context_is_the_python_forwards_and_a_position_beyond_is_refused(native, python,
                                                                                             full_cache):
    ids, cache = full_cache
    assert cache.length == FULL_CONTEXT - 2
    twin = StaticKVCache(native.config, cache.capacity)
    twin.k.copy_(cache.k)
    twin.v.copy_(cache.v)
    twin.length = cache.length
    assert_tiny_rounding(native.extend([7, 8], cache, 2), python.extend([7, 8], twin, 2))
    assert cache.length == FULL_CONTEXT
    with pytest.raises(UserError, match="context is 8192 tokens"):
        native.decode_one_token(9, cache)
    with pytest.raises(UserError, match="context is 8192 tokens"):
        native.prefill(random_ids(7, FULL_CONTEXT + 1), native.new_cache())
    cache.crop(FULL_CONTEXT - 2)


def test_a_prompt_and_max_new_tokens_beyond_the_context_are_refused_before_any_forward(native):
    from hartonomous.backends.exact import ExactBackend
    from hartonomous.engine import Engine
    from hartonomous.generation_config import GenerationConfig

    class Tokenizer:
        eos_token_id = 2

        def decode(self, ids, **_):
            return "".join(f"<{i}>" for i in ids)

    native.tokenizer = Tokenizer()
    try:
        engine = Engine(ExactBackend(native))
        with pytest.raises(InvalidArgument, match="context is 8192 tokens.*shorten the prompt") as refused:
            engine.stream(random_ids(8, FULL_CONTEXT - 10), GenerationConfig(max_new_tokens=11, temperature=0))
        assert refused.value.name == "max_new_tokens"
        session = engine.stream(random_ids(8, FULL_CONTEXT - 10), GenerationConfig(max_new_tokens=10, temperature=0,
                                                                                    stop_at_eos=False))
        assert len(session.run().token_ids) == 10
    finally:
        native.tokenizer = None


# -- cancel ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("forward", ["native", "python"])
def test_a_cancel_stops_a_long_prompt_inside_its_forward(weights, forward):
    if forward == "native":
        require_native()
    model = Int4Model(weights, tokenizer=None, description="tiny", forward=forward)
    ids = random_ids(9, FULL_CONTEXT - 1)
    started = time.perf_counter()
    model.prefill(ids, model.new_cache())
    whole = time.perf_counter() - started
    event = threading.Event()
    threading.Timer(whole / 10, event.set).start()
    cache = model.new_cache()
    started = time.perf_counter()
    with watching(event), pytest.raises(Cancelled):
        model.prefill(ids, cache)
    assert time.perf_counter() - started < whole / 2
    assert cache.length == 0                                           # nothing half-fed is kept
    assert model.prefill(ids[:10], cache).shape == (VOCAB,)           # and the cache serves the next request


@pytest.mark.integration
def test_the_engines_cancel_stops_smollm2_inside_a_long_prompt():
    require_native()
    require_smollm2()
    from hartonomous.backends.exact import ExactBackend
    from hartonomous.engine import Engine, State
    from hartonomous.generation_config import GenerationConfig
    from hartonomous.runtimes import load_exact_model

    model = load_exact_model("int4", "smollm2", "cpu")
    assert model.forward_kind == "native"
    session = Engine(ExactBackend(model)).stream(random_ids(10, 3000), GenerationConfig(max_new_tokens=4))
    threading.Timer(0.5, session.cancel).start()
    started = time.perf_counter()
    result = session.run()
    assert session.state == State.CANCELLED and result.token_ids == []
    assert time.perf_counter() - started < 3.0          # the whole prompt takes ~10 s on one thread


# -- choosing and naming the forward -----------------------------------------------------------------------

def test_the_python_forward_can_be_chosen_and_a_bad_choice_is_refused(weights, monkeypatch):
    monkeypatch.setenv(FORWARD_ENV, "python")
    assert Int4Model(weights, None, "tiny").forward_kind == "python"
    assert "python forward: HARTONOMOUS_INT4_FORWARD=python" in runtime_summary("int4", "smollm2", "cpu")
    monkeypatch.setenv(FORWARD_ENV, "fast")
    with pytest.raises(UserError, match="HARTONOMOUS_INT4_FORWARD must be one of auto, native, python"):
        Int4Model(weights, None, "tiny")


def test_a_model_of_a_shape_the_native_forward_does_not_take_runs_the_python_forward(weights, monkeypatch):
    require_native()
    monkeypatch.delenv(FORWARD_ENV, raising=False)
    narrow = Int4Weights(dataclasses.replace(weights.config, heads=4, kv_heads=2), weights.tensors)   # head_dim 16
    assert Int4Model(narrow, None, "tiny").forward_kind == "python"
    with pytest.raises(UserError, match="head_dim of 32, 64 or 128 .this model: 64, 128, 16."):
        Int4Model(narrow, None, "tiny", forward="native")


def test_db_status_and_healthz_name_the_native_forward(native, monkeypatch):
    from hartonomous.server.runtime import Runtime, ServerConfig

    monkeypatch.delenv(FORWARD_ENV, raising=False)
    assert "int4 (chosen; native forward;" in runtime_summary("int4", "smollm2", "cpu")
    assert Runtime(ServerConfig(prefix_cache_mb=0), exact_model=native).exact_status() == \
        "loaded (int4 runtime, native forward)"


def test_without_a_compiler_the_build_says_so_in_one_line_and_the_python_forward_runs(weights, tmp_path, monkeypatch):
    monkeypatch.setenv("HARTONOMOUS_NATIVE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    ok, line = native_build.build()
    assert not ok and "\n" not in line and "keeps its Python forward" in line
    assert not native_build.target().exists()
    native_build.load.cache_clear()
    try:
        assert native_build.load() is None
        monkeypatch.delenv(FORWARD_ENV, raising=False)
        assert Int4Model(weights, None, "tiny").forward_kind == "python"
        with pytest.raises(UserError, match="native int4 forward is unavailable: it is not built here"):
            Int4Model(weights, None, "tiny", forward="native")
    finally:
        monkeypatch.undo()
        native_build.load.cache_clear()


# -- SmolLM2 ---------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_on_smollm2_it_picks_the_python_forwards_token_but_at_near_ties():
    """Teacher-forced on this repository's engine source, 200 positions: the native forward's argmax
    is the Python forward's wherever the Python forward's top two are 0.5 apart or more."""
    require_native()
    require_smollm2()
    from pathlib import Path

    from hartonomous.runtimes import load_exact_model

    native = load_exact_model("int4", "smollm2", "cpu")
    python = Int4Model(native.weights, native.tokenizer, "SmolLM2", forward="python")
    text = (Path(__file__).resolve().parents[1] / "hartonomous" / "engine.py").read_text()
    ids = native.tokenizer.encode(text)[:216]
    rows = {}
    for model in (native, python):
        cache = model.new_cache()
        model.prefill(ids[:16], cache)
        rows[model.forward_kind] = model.extend(ids[16:], cache, len(ids) - 16)
    a, b = rows["native"], rows["python"]
    differ = a.argmax(-1) != b.argmax(-1)
    assert bool((top2_gap(b)[differ] < 0.5).all())
    assert int(differ.sum()) <= 10
    assert float((a - b).abs().median()) < 0.1
