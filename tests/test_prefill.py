"""The int4 runtime's prompt: chunks of batched attention on the unpacked bfloat16 weights.

A prompt is cut at absolute multiples of the runtime's chunk; a chunk of at least EXACT_ROWS rows is
computed in one batched forward, a shorter one as decoding computes it. Only the prompt's last row
gives logits, so the batched rows need not equal decoded ones: they agree within bfloat16 rounding.
What must hold bitwise: a prompt continued from its own cached whole chunks gives the bits of the
prompt prefilled cold (the prefix cache's promise), and the speculative path's first forward
prefills as the exact path's start does (so both paths decode from the same cache).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_runtime_int4 import VOCAB, assert_tiny_rounding, write_tiny_gguf

from hartonomous.backends.exact import ExactBackend
from hartonomous.runtimes.gguf_weights import GGUFWeights
from hartonomous.runtimes.int4 import EXACT_ROWS, Int4Linear, Int4Model, Int4Weights, prefill_chunks

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py

CHUNK = 64                  # the tiny model's chunk: several chunks in a short test prompt


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Int4Model:
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf")
    model = Int4Model(Int4Weights.from_gguf(GGUFWeights(path)), tokenizer=None, description="tiny")
    model.prefill_chunk = CHUNK
    return model


def random_ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def test_a_prompt_is_cut_at_absolute_multiples_of_the_chunk_whatever_came_before():
    assert prefill_chunks(0, 300, 128) == [(0, 128), (128, 256), (256, 300)]
    assert prefill_chunks(200, 300, 128) == [(200, 256), (256, 300)]
    assert prefill_chunks(256, 384, 128) == [(256, 384)]
    assert prefill_chunks(5, 5, 128) == []


def test_the_unpacked_weight_is_the_weight_the_int4_kernel_multiplies_by(tiny):
    """Each projection's bfloat16 weight is what the kernel computes for the identity matrix (every
    weight the kernel holds, rounded to bfloat16 as the kernel rounds its outputs)."""
    rng = np.random.default_rng(3)
    linears = [tiny.weights.layers[0][name] for name in ("qkv", "out", "gate_up", "down")]
    linears.append(Int4Linear.from_codes(rng.integers(0, 16, (128, 96)).astype(np.int32),
                                         rng.uniform(0.01, 0.1, (128, 3)).astype(np.float32),
                                         rng.uniform(-0.5, 0.5, (128, 3)).astype(np.float32)))
    for linear in linears:
        k = linear.scales_zeros.shape[0] * 32
        through_kernel = linear(torch.eye(k, dtype=torch.bfloat16)).T
        assert torch.equal(linear.dense(), through_kernel)


def test_a_long_prompt_gives_the_logits_of_a_forward_from_scratch_within_bfloat16_rounding(tiny):
    """Batched attention and the unpacked weights change the last bits of the prompt's rows, not
    what the model says after it: the logits agree with the row-at-a-time forward within rounding."""
    for seed, n in ((1, 3 * CHUNK + 17), (2, 2 * CHUNK), (3, CHUNK + EXACT_ROWS)):
        ids = random_ids(seed, n)
        cache = tiny.new_cache()
        logits = tiny.prefill(ids, cache)
        assert cache.length == n
        assert_tiny_rounding(logits[None], tiny.full_logits(ids)[None])
        after = [tiny.decode_one_token(t, cache) for t in (5, 6, 7)]
        assert_tiny_rounding(torch.stack(after), tiny.full_logits_many(ids + [5, 6, 7], 3))


def test_a_short_prompt_and_a_short_last_chunk_are_computed_as_decoding_computes_them(tiny):
    """A prompt of fewer than EXACT_ROWS tokens gives bit for bit the logits of a forward from scratch;
    so does a prompt whose batched chunks are followed by a short one, against the same chunks
    prefilled and the short rest decoded token by token."""
    short = random_ids(4, EXACT_ROWS - 1)
    assert torch.equal(tiny.prefill(short, tiny.new_cache()), tiny.full_logits(short))
    ids = random_ids(5, 2 * CHUNK + 5)
    cache, decoded = tiny.new_cache(), tiny.new_cache()
    logits = tiny.prefill(ids, cache)
    tiny.prefill(ids[:2 * CHUNK], decoded)
    one_by_one = [tiny.decode_one_token(t, decoded) for t in ids[2 * CHUNK:]]
    assert torch.equal(logits, one_by_one[-1])


@pytest.mark.parametrize("cached", [CHUNK, 2 * CHUNK, 3 * CHUNK])
def test_a_prompt_continued_from_its_cached_whole_chunks_gives_the_bits_of_a_cold_prefill(tiny, cached):
    """prefill(ids[:k*chunk]) then prefill_more(ids[k*chunk:]) is prefill(ids) to the bit: the logits,
    every key and value of the cache, and the decoding after it."""
    ids = random_ids(6, 3 * CHUNK + 40)
    cold, warm = tiny.new_cache(), tiny.new_cache()
    expected = tiny.prefill(ids, cold)
    tiny.prefill(ids[:cached], warm)
    got = tiny.prefill_more(ids[cached:], warm)
    assert torch.equal(got, expected)
    assert warm.length == cold.length == len(ids)
    assert torch.equal(warm.k[:, :, :len(ids)], cold.k[:, :, :len(ids)])
    assert torch.equal(warm.v[:, :, :len(ids)], cold.v[:, :, :len(ids)])
    for token in (9, 10, 11):
        assert torch.equal(tiny.decode_one_token(token, warm), tiny.decode_one_token(token, cold))


def test_a_continuation_from_a_cut_inside_a_chunk_is_computed_but_not_the_same_bits(tiny):
    """The promise holds at whole chunks only: continuing from the middle of a chunk cuts the prompt
    elsewhere (the rows differ in the last bits, the answer agrees within rounding), which is why the
    prefix cache keeps whole chunks."""
    ids = random_ids(7, 2 * CHUNK + 40)
    cold, warm = tiny.new_cache(), tiny.new_cache()
    expected = tiny.prefill(ids, cold)
    tiny.prefill(ids[:CHUNK + 10], warm)
    got = tiny.prefill_more(ids[CHUNK + 10:], warm)
    assert not torch.equal(warm.k[:, :, :len(ids)], cold.k[:, :, :len(ids)])
    assert_tiny_rounding(got[None], expected[None])


def greedy_exact(backend: ExactBackend, prompt: list[int], steps: int) -> list[int]:
    state, out = backend.start(prompt), []
    for _ in range(steps):
        out.append(int(state.logits.argmax()))
        backend.advance(state, out[-1])
    return out


def test_the_speculative_path_prefills_as_the_exact_path_does(tiny):
    """The first verification forward prefills the prompt with the runtime's prefill, then feeds the
    draft as decoding would: its rows are the bits of start() and one-token steps, and greedy
    verification keeps exactly the exact path's tokens."""
    backend = ExactBackend(tiny)
    prompt = random_ids(8, 2 * CHUNK + 30)
    plain = greedy_exact(backend, prompt, 6)
    state = backend.begin(prompt)
    rows = backend.score_logits(state, plain[:4])
    start = backend.start(prompt)
    stepped = [start.logits]
    for token in plain[:4]:
        backend.advance(start, token)
        stepped.append(start.logits)
    assert torch.equal(rows, torch.stack(stepped))
    tree_state = backend.begin(prompt)
    wrong = [(plain[0] + 1) % VOCAB, 4]
    root, branch_rows = backend.score_tree(tree_state, [plain[:3], wrong], greedy())
    assert int(root.argmax()) == plain[0]
    assert branch_rows[0].argmax(-1).tolist() == plain[1:4]


def greedy():
    from hartonomous.generation_config import GenerationConfig

    return GenerationConfig(max_new_tokens=8, temperature=0.0, stop_at_eos=False).sampler


def test_preparing_the_prefill_unpacks_every_projection_and_changes_no_bit(tmp_path):
    """A server's preload unpacks the weights before the first prompt; the prompt's bits are those of
    unpacking them lazily."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf")

    def load() -> Int4Model:
        model = Int4Model(Int4Weights.from_gguf(GGUFWeights(path)), tokenizer=None, description="tiny")
        model.prefill_chunk = CHUNK
        return model

    def unpacked(model: Int4Model) -> list[bool]:
        return [getattr(layer[name], "_dense", None) is not None
                for layer in model.weights.layers for name in ("qkv", "out", "gate_up", "down")]

    ids = random_ids(9, CHUNK + 40)
    lazy, prepared = load(), load()
    expected = lazy.prefill(ids, lazy.new_cache())
    assert not any(unpacked(prepared))
    prepared.prepare_prefill()
    assert all(unpacked(prepared))
    assert torch.equal(prepared.prefill(ids, prepared.new_cache()), expected)
