"""The llama runtime: llama.cpp's own model behind the exact model's operations.

Cached logits equal logits recomputed from scratch, rollback and cache switching leave no trace,
greedy decoding equals llama.cpp's own `Llama.generate`, and teacher-forced on code it picks the
float32 reference's token everywhere but at near-ties of the reference.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import optional_parts

optional_parts.require_llama_cpp(module=True)      # `make test` installs it (make install-llama)

import llama_cpp  # noqa: E402

from hartonomous.errors import UserError  # noqa: E402
from hartonomous.model import load_fast_tokenizer, resolve_source  # noqa: E402
from hartonomous.runtimes.llama_cpp import LlamaCppModel  # noqa: E402
from hartonomous.threads import machine_threads  # noqa: E402

PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
OTHER = "The capital of France is"
# Forwards of the same batch shape agree to the last bit (a batch split into a prefill and an
# extend included); llama.cpp's one-token kernels round differently from its batched ones, as much
# as both differ from float32 (measured: max 1.13, median 0.58 per position over 300 positions of
# code), so a one-token step is held to rounding of that size, and its mean to far less. A wrong
# cache (a token missing or misplaced) moves the logits by several units on average.
SAME_SHAPE = 1e-3
ONE_TOKEN_MAX, ONE_TOKEN_MEAN = 2.0, 0.3
NEAR_TIE = 0.5       # the reference's top-2 logit gap below which llama.cpp may pick the other token


def gguf_path() -> Path:
    source = resolve_source("smollm2")
    return source.directory / source.gguf_file


@pytest.fixture(scope="module")
def model() -> LlamaCppModel:
    """One thread: llama.cpp's threads wait for each other by spinning at every operation, which
    turns ~20 ms a token into seconds when the tests share their cores with other work."""
    optional_parts.require_smollm2()
    return LlamaCppModel(gguf_path(), load_fast_tokenizer("smollm2"), "SmolLM2-135M-Instruct", threads=1)


def ids_of(model: LlamaCppModel, text: str) -> list[int]:
    return model.tokenizer.encode(text)


def assert_near(a: torch.Tensor, b: torch.Tensor, same_shape: bool = False) -> None:
    """Equal up to llama.cpp's rounding: to the last bits between forwards of the same batch shape,
    else within the one-token kernels' rounding (the module's note on tolerances)."""
    assert a.shape == b.shape
    assert a.dtype == torch.float32 and b.dtype == torch.float32
    diff = (a - b).abs()
    if same_shape:
        assert float(diff.max()) <= SAME_SHAPE
    else:
        assert float(diff.max()) <= ONE_TOKEN_MAX
        assert float(diff.mean()) <= ONE_TOKEN_MEAN


def test_describes_itself(model):
    assert model.runtime == "llama" and model.supports_trees is False
    assert model.vocab_size == model.llama.n_vocab() == model.tokenizer.vocab_size
    assert model.device == torch.device("cpu") and model.use_cache
    assert int(model.llama.token_eos()) in model.eos_token_ids()
    fingerprint = model.fingerprint()
    assert fingerprint.startswith("llama|") and gguf_path().name in fingerprint
    assert llama_cpp.__version__ in fingerprint and fingerprint.endswith("threads=1")
    default = LlamaCppModel(gguf_path(), model.tokenizer, n_ctx=64)
    assert default.n_threads == machine_threads() and default.n_ctx == default.llama.n_ctx() >= 64
    assert default.fingerprint().endswith(f"threads={machine_threads()}")


def test_prefill_then_decode_equals_logits_from_scratch(model):
    ids = ids_of(model, PROMPT)
    cache = model.new_cache()
    logits = model.prefill(ids, cache)
    for _ in range(6):
        assert logits.shape == (model.vocab_size,)
        assert_near(logits, model.full_logits(ids))
        token = int(logits.argmax())
        ids.append(token)
        logits = model.decode_one_token(token, cache)
        assert cache.length == len(ids)
    assert_near(logits, model.full_logits(ids))


def test_extend_equals_full_logits_and_rollback_leaves_no_trace(model):
    ids = ids_of(model, PROMPT)
    draft = [1000, 2000, 3000, 42, 7]
    cache = model.new_cache()
    model.prefill(ids, cache)
    first = model.extend(draft, cache, len(draft))
    assert first.shape == (len(draft), model.vocab_size)
    assert cache.length == len(ids) + len(draft)
    assert_near(first, model.full_logits_many(ids + draft, len(draft)), same_shape=True)
    for kept in (3, 0):
        cache.crop(len(ids) + kept)
        assert cache.length == len(ids) + kept
        again = model.extend(draft[kept:], cache, len(draft) - kept)
        assert_near(again, first[kept:], same_shape=True)
    last_two = model.extend([5, 6], cache, 1)
    assert last_two.shape == (1, model.vocab_size)
    assert_near(last_two[0], model.full_logits(ids + draft + [5, 6]), same_shape=True)


def test_bad_inputs_are_refused(model):
    cache = model.new_cache()
    model.prefill(ids_of(model, OTHER), cache)
    for length in (-1, cache.length + 1):
        with pytest.raises(ValueError, match="cannot crop"):
            cache.crop(length)
    with pytest.raises(UserError, match="empty"):
        model.prefill([], cache)
    with pytest.raises(UserError, match="vocabulary"):
        model.decode_one_token(model.vocab_size, cache)
    with pytest.raises(UserError, match="vocabulary"):
        model.extend([5, -1], cache, 1)
    with pytest.raises(UserError, match="vocabulary"):
        model.full_logits_many([model.vocab_size + 7], 1)
    with pytest.raises(ValueError, match="keep"):
        model.extend([5, 6], cache, 3)
    with pytest.raises(NotImplementedError, match="chains only"):
        model.extend_tree([5], [[6, 7], [8]], cache)
    with pytest.raises(UserError, match="context"):
        model.full_logits_many([5] * (model.n_ctx + 1), 1)


def steps(model: LlamaCppModel, cache, prompt: list[int], tokens: list[int]):
    """Prefill, then yield the logits after each step: decode, extend, and a rolled-back extend."""
    yield model.prefill(prompt, cache)
    for t in tokens:
        yield model.decode_one_token(t, cache)
    yield model.extend(tokens[:3], cache, 3)
    cache.crop(cache.length - 2)
    yield model.extend(tokens[3:5], cache, 2)


def test_two_caches_used_alternately_equal_each_alone(model):
    prompts = [ids_of(model, PROMPT), ids_of(model, PROMPT[:30] + " # the other one")]
    tokens = [[11, 12, 13, 14, 15, 16], [21, 22, 23, 24, 25, 26]]
    alone = [list(steps(model, model.new_cache(), p, t)) for p, t in zip(prompts, tokens)]
    a, b = model.new_cache(), model.new_cache()
    runs = [steps(model, a, prompts[0], tokens[0]), steps(model, b, prompts[1], tokens[1])]
    together: list[list[torch.Tensor]] = [[], []]
    for i in range(len(alone[0])):
        for k in (0, 1):
            together[k].append(next(runs[k]))
        if i == 2:                               # a fresh sequence in between: both are fed again
            model.full_logits_many(prompts[0], 2)
    for k in (0, 1):
        for x, y in zip(alone[k], together[k]):
            assert_near(x, y)
    b.crop(3)                                    # cropping the cache the context does not hold
    assert b.length == 3
    assert_near(model.decode_one_token(9, b), model.full_logits(prompts[1][:3] + [9]), same_shape=True)


def test_greedy_decoding_is_llama_cpp_generate(model):
    prompt = ids_of(model, PROMPT)
    reference = llama_cpp.Llama(str(gguf_path()), n_ctx=512, n_batch=512, n_threads=model.n_threads,
                                n_threads_batch=model.n_threads, n_gpu_layers=0, verbose=False)
    expected = []
    for token in reference.generate(prompt, top_k=1, temp=0.0, repeat_penalty=1.0):
        expected.append(int(token))
        if len(expected) == 32:
            break
    reference.close()
    cache = model.new_cache()
    logits = model.prefill(prompt, cache)
    got = []
    for _ in range(32):
        got.append(int(logits.argmax()))
        logits = model.decode_one_token(got[-1], cache)
    assert got == expected


@pytest.mark.integration
def test_teacher_forced_argmax_agrees_with_the_float32_reference_but_at_near_ties(model):
    from hartonomous.runtimes.reference import ExactModel

    text = (Path(__file__).resolve().parents[1] / "hartonomous" / "engine.py").read_text()[:2000]
    ids = ids_of(model, text)[:301]
    keep = len(ids) - 1
    ours = model.full_logits_many(ids, keep)
    reference = ExactModel.load("smollm2", "cpu").full_logits_many(ids, keep)
    top2 = reference.topk(2, dim=-1).values
    gaps = top2[:, 0] - top2[:, 1]
    differ = ours.argmax(-1) != reference.argmax(-1)
    assert int(differ.sum()) <= keep // 20                       # at least 95% agree
    assert bool((gaps[differ] < NEAR_TIE).all()), f"argmax differs where the reference's gap is {gaps[differ]}"
