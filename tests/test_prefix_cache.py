"""The server's prefix cache: a prompt that begins as a recent one did computes only the rest.

A hit answers as a cold request does, bit for bit: the logits, the greedy tokens and a seed's tokens,
on the exact and the speculative path. The cache keeps whole prefill chunks of recent prompts,
never more than its bound, never changes an entry a request reuses, and counts hits and misses.
"""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
import torch
from test_runtime_int4 import VOCAB, write_tiny_gguf

from hartonomous.backends.exact import ExactBackend
from hartonomous.engine import pick
from hartonomous.generation_config import GenerationConfig
from hartonomous.runtimes.gguf_weights import GGUFWeights
from hartonomous.runtimes.int4 import Int4Model, Int4Weights
from hartonomous.runtimes.prefix_cache import PrefixCache, PrefixCachedModel, with_prefix_cache
from hartonomous.server.runtime import Runtime, ServerConfig, SharedModel

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py

CHUNK = 64
KV_BYTES_PER_TOKEN = 2 * 2 * 1 * 32 * 4          # keys and values, 2 layers, 1 KV head of 32, float32


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Int4Model:
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf")
    model = Int4Model(Int4Weights.from_gguf(GGUFWeights(path)), tokenizer=None, description="tiny")
    model.prefill_chunk = CHUNK
    return model


def cached(model: Int4Model, max_mb: int = 16) -> PrefixCachedModel:
    wrapped = with_prefix_cache(model, max_mb)
    assert isinstance(wrapped, PrefixCachedModel)
    return wrapped


def random_ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, VOCAB, n).tolist()


def run(backend: ExactBackend, prompt: list[int], steps: int, temperature: float, seed: int) -> list[int]:
    """What a session picks: the shared sampler's distribution, the seed's uniform at each step."""
    sampler = GenerationConfig(max_new_tokens=steps, temperature=temperature, stop_at_eos=False).sampler
    state, out = backend.start(prompt), []
    for step in range(steps):
        token, _ = pick(backend.distribution(state, sampler), seed, step)
        out.append(token)
        backend.advance(state, token)
    return out


def test_a_prompt_extending_a_recent_one_gives_the_bits_of_a_cold_prefill(tiny):
    model = cached(tiny)
    first = random_ids(1, 3 * CHUNK + 10)
    model.prefill(first, model.new_cache())
    assert model.prefix_cache.stats()["misses"] == 1 and model.prefix_cache.stats()["entries"] == 1
    longer = first + random_ids(2, 32)
    warm, cold = model.new_cache(), tiny.new_cache()
    assert torch.equal(model.prefill(longer, warm), tiny.prefill(longer, cold))
    assert torch.equal(warm.k[:, :, :len(longer)], cold.k[:, :, :len(longer)])
    assert torch.equal(warm.v[:, :, :len(longer)], cold.v[:, :, :len(longer)])
    stats = model.prefix_cache.stats()
    assert (stats["hits"], stats["tokens_reused"]) == (1, 3 * CHUNK)


@pytest.mark.parametrize("temperature, seed", [(0.0, 0), (0.9, 7), (1.3, 12345)])
def test_a_hit_answers_as_a_cold_request_on_the_exact_and_the_speculative_path(tiny, temperature, seed):
    """The same tokens greedily and for a seed: a chat's next turn (the last prompt, its answer and
    a new message) and an editor's next keystroke, each asked warm and cold."""
    model = cached(tiny)
    warm, cold = ExactBackend(model), ExactBackend(tiny)
    turn = random_ids(3, 2 * CHUNK + 20)
    answer = run(warm, turn, 12, temperature, seed)
    assert answer == run(cold, turn, 12, temperature, seed)
    for prompt in (turn + answer + random_ids(4, 40), turn + random_ids(5, 3)):
        assert run(warm, prompt, 12, temperature, seed) == run(cold, prompt, 12, temperature, seed)
    assert model.prefix_cache.stats()["hits"] == 2
    speculative = warm.begin(turn + random_ids(6, 70))
    rows = warm.score_logits(speculative, answer[:3])
    plain = cold.start(turn + random_ids(6, 70))
    assert torch.equal(rows[0], plain.logits)
    assert model.prefix_cache.stats()["hits"] == 3


def test_the_same_prompt_again_recomputes_its_last_chunk_for_its_logits(tiny):
    model = cached(tiny)
    prompt = random_ids(7, 3 * CHUNK)
    first = model.prefill(prompt, model.new_cache())
    assert torch.equal(model.prefill(prompt, model.new_cache()), first)
    assert model.prefix_cache.stats()["tokens_reused"] == 2 * CHUNK


def test_a_request_that_reuses_an_entry_never_changes_it(tiny):
    """Decoding, a rejected draft and a rollback in the reusing request's cache leave the entry as
    it was stored (copy on reuse)."""
    model = cached(tiny)
    prompt = random_ids(8, 2 * CHUNK)
    model.prefill(prompt, model.new_cache())
    (entry,) = model.prefix_cache._entries.values()
    keys, values = entry.keys.clone(), entry.values.clone()
    cache = model.new_cache()
    model.prefill(prompt[:CHUNK] + random_ids(9, CHUNK + 5), cache)
    model.extend([5, 6, 7], cache, 3)
    cache.crop(CHUNK)
    model.decode_one_token(11, cache)
    assert torch.equal(entry.keys, keys) and torch.equal(entry.values, values)


def test_the_cache_holds_at_most_its_bound_and_forgets_the_least_recent_first():
    cache = PrefixCache(chunk=4, max_bytes=3 * (4 * 8 + 2 * 4 * 16 * 4))    # three entries of one chunk
    kv = torch.zeros(1, 1, 8, 16)
    for first in range(4):
        cache.store([first, 1, 2, 3], kv, kv)
    stats = cache.stats()
    assert stats["entries"] == 3 and stats["bytes"] <= stats["max_bytes"]
    assert cache.lookup([0, 1, 2, 3, 9]) == (None, 0)                    # the oldest went first
    entry, reused = cache.lookup([1, 1, 2, 3, 9])
    assert entry is not None and reused == 4
    cache.store([0, 1, 2, 3], kv, kv)                                    # evicts 2, the least recent now
    assert cache.lookup([2, 1, 2, 3, 9])[0] is None and cache.lookup([1, 1, 2, 3, 9])[0] is not None
    big = PrefixCache(chunk=4, max_bytes=100)
    big.store([0, 1, 2, 3], kv, kv)                                      # a prefix larger than the bound
    assert big.stats()["entries"] == 0 and big.stats()["bytes"] == 0


def test_a_prompt_that_extends_a_kept_one_replaces_it_and_shorter_ones_are_not_stored_twice():
    cache = PrefixCache(chunk=2, max_bytes=1 << 20)
    kv = torch.zeros(1, 1, 8, 4)
    cache.store([1, 2, 3, 4], kv, kv)
    cache.store([1, 2, 3, 4, 5, 6, 7], kv, kv)                           # keeps 6 tokens, drops the 4
    cache.store([1, 2, 3], kv, kv)                                       # already held
    assert cache.stats()["entries"] == 1
    assert cache.lookup([1, 2, 3, 4, 5, 6, 0])[1] == 6
    assert cache.lookup([1, 2, 3, 4, 5, 6])[1] == 4                      # the last token is always computed
    assert cache.lookup([1, 9, 9])[1] == 0 and cache.stats()["misses"] == 1


def test_concurrent_requests_each_get_the_bits_of_their_cold_prefill(tiny):
    model = SharedModel(cached(tiny))
    base = random_ids(10, 2 * CHUNK)
    prompts = [base + random_ids(20 + i, 10 + 17 * i) for i in range(6)] * 2
    expected = [tiny.prefill(p, tiny.new_cache()) for p in prompts]
    got: list = [None] * len(prompts)

    def ask(i: int) -> None:
        got[i] = model.prefill(prompts[i], model.new_cache())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(g, e) for g, e in zip(got, expected))
    stats = model.prefix_cache.stats()
    assert stats["hits"] + stats["misses"] == len(prompts) and stats["hits"] >= len(prompts) - 1


def test_runtimes_that_cannot_continue_a_prefill_and_a_zero_bound_go_without(tiny):
    class Plain:
        def prefill(self, ids, cache):
            raise AssertionError("not called")

    plain = Plain()
    assert with_prefix_cache(plain, 256) is plain
    assert with_prefix_cache(tiny, 0) is tiny


def test_the_server_wraps_its_model_and_reports_the_cache(tiny):
    runtime = Runtime(ServerConfig(prefix_cache_mb=8), exact_model=tiny)
    model = runtime.exact_model()
    model.prefill(random_ids(11, CHUNK + 1), model.new_cache())
    model.prefill(random_ids(11, CHUNK + 9), model.new_cache())
    stats = runtime.prefix_cache_stats()
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["max_bytes"] == 8 << 20
    assert stats["bytes"] >= CHUNK * KV_BYTES_PER_TOKEN
    assert Runtime(ServerConfig(prefix_cache_mb=0), exact_model=tiny).prefix_cache_stats() is None


@pytest.mark.integration
def test_on_smollm2_a_hit_gives_the_tokens_of_a_cold_request_greedily_and_for_a_seed():
    """The real model: a 300-token prompt after a 256-token one of the same code, 12 tokens; and the
    prefix computed on one thread serves a request on two with the bits of its cold prefill."""
    from test_runtime_int4 import smollm2_gguf

    from hartonomous.runtimes import load_exact_model

    smollm2_gguf()
    model = load_exact_model("int4", "smollm2", "cpu")
    ids = model.tokenizer.encode(open(__file__).read())[:300]
    warm = cached(model, 64)
    warm.prefill(ids[:256], warm.new_cache())
    for temperature, seed in ((0.0, 0), (0.8, 42)):
        assert run(ExactBackend(warm), ids, 12, temperature, seed) == run(ExactBackend(model), ids, 12, temperature, seed)
    assert warm.prefix_cache.stats()["tokens_reused"] == 2 * 256
    threads = torch.get_num_threads()         # the server's thread count changes between requests
    try:
        torch.set_num_threads(min(2, os.cpu_count() or 1))
        cold = model.prefill(ids, model.new_cache())
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(warm.prefill(ids, warm.new_cache()), cold)
