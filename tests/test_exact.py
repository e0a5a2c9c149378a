"""The exact path: KV cache == no cache, greedy == transformers generate, seeded sampling, CUDA."""

from __future__ import annotations

import warnings

import pytest
from optional_parts import require_smollm2
import torch

from hartonomous.backends.exact import ExactBackend, ordered_distribution
from hartonomous.engine import Engine
from hartonomous.runtimes.reference import ExactModel
from hartonomous.generation_config import GenerationConfig
from tiny_model import tiny_model

PROMPT = "The capital of France is"


def tiny_exact(use_cache: bool = True, device: str = "cpu") -> ExactModel:
    model, tokenizer = tiny_model(0)
    return ExactModel(model.to(device), tokenizer, use_cache=use_cache)


def hf_greedy(model, tokenizer, prompt: str, max_new_tokens: int, **kwargs) -> list[int]:
    ids = torch.tensor([tokenizer.encode(prompt)], device=model.device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                         pad_token_id=tokenizer.eos_token_id, **kwargs)
    return out[0, ids.shape[1]:].tolist()


def test_cached_logits_equal_recomputed_logits():
    exact = tiny_exact()
    ids = exact.tokenizer.encode(PROMPT)
    cache = exact.new_cache()
    logits = exact.prefill(ids, cache)
    for token in [5, 77, 301, 12, 0, 150]:
        torch.testing.assert_close(logits, exact.full_logits(ids), rtol=1e-5, atol=1e-5)
        ids.append(token)
        logits = exact.decode_one_token(token, cache)
        assert cache.length == len(ids)
    torch.testing.assert_close(logits, exact.full_logits(ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_generation_equals_uncached(temperature):
    config = GenerationConfig(max_new_tokens=24, temperature=temperature, top_k=0, top_p=1.0, seed=5,
                              stop_at_eos=False)
    cached = Engine(ExactBackend(tiny_exact())).generate(PROMPT, config)
    uncached = Engine(ExactBackend(tiny_exact(use_cache=False))).generate(PROMPT, config)
    assert cached.token_ids == uncached.token_ids
    assert len(cached.token_ids) == 24


@pytest.mark.parametrize("repetition_penalty", [1.0, 1.3])
def test_greedy_equals_transformers_generate_on_the_tiny_model(repetition_penalty):
    model, tokenizer = tiny_model(0)
    expected = hf_greedy(model, tokenizer, PROMPT, 30, repetition_penalty=repetition_penalty)
    config = GenerationConfig(max_new_tokens=30, temperature=0.0, repetition_penalty=repetition_penalty)
    got = Engine(ExactBackend(tiny_exact())).generate(PROMPT, config)
    assert got.token_ids == expected


def test_cached_forwards_use_the_supported_cache_argument_without_warnings():
    """Prefill, one-token decode, extend and a tree forward pass the KV cache as transformers'
    current `cache` argument: no deprecation warning (the old one is removed in 5.40)."""
    exact = tiny_exact()
    ids = exact.tokenizer.encode(PROMPT)
    cache = exact.new_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exact.prefill(ids[:-2], cache)
        exact.decode_one_token(ids[-2], cache)
        exact.extend(ids[-1:] + [5, 6], cache, 3)
        exact.extend_tree([7], [[8, 9], [10]], cache)
    assert cache.length == len(ids) + 2 + 1 + 3


def test_ordered_distribution_sorts_by_probability_then_token_id():
    probs = torch.tensor([0.0, 0.25, 0.5, 0.0, 0.25])
    dist = ordered_distribution(probs)
    assert dist.token_ids == [2, 1, 4]
    assert dist.probabilities == [0.5, 0.25, 0.25]


def test_prefill_rejects_ids_outside_the_vocabulary():
    from hartonomous.errors import UserError

    exact = tiny_exact()
    with pytest.raises(UserError, match="outside the model's vocabulary"):
        exact.prefill([1, exact.vocab_size], exact.new_cache())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_greedy_and_seeded_sampling_match_cpu():
    torch.backends.cuda.matmul.allow_tf32 = False
    config = GenerationConfig(max_new_tokens=16, temperature=0.0, stop_at_eos=False)
    cpu = Engine(ExactBackend(tiny_exact())).generate(PROMPT, config)
    model, tokenizer = tiny_model(0)
    import copy

    gpu_exact = ExactModel(copy.deepcopy(model).to("cuda"), tokenizer)
    assert gpu_exact.device.type == "cuda"
    gpu = Engine(ExactBackend(gpu_exact)).generate(PROMPT, config)
    assert gpu.token_ids == cpu.token_ids
    sampled = config.with_options(temperature=1.0, seed=3)
    first = Engine(ExactBackend(gpu_exact)).generate(PROMPT, sampled)
    again = Engine(ExactBackend(gpu_exact)).generate(PROMPT, sampled)
    assert first.token_ids == again.token_ids


@pytest.mark.integration
def test_greedy_equals_transformers_generate_on_smollm2():
    from hartonomous.model import load_model, load_tokenizer

    require_smollm2()
    model, tokenizer = load_model("smollm2", "cpu"), load_tokenizer("smollm2")
    expected = hf_greedy(model, tokenizer, PROMPT, 24)
    engine = Engine(ExactBackend(ExactModel(model, tokenizer)))
    got = engine.generate(PROMPT, GenerationConfig(max_new_tokens=24, temperature=0.0))
    assert got.token_ids == expected
    assert got.text == tokenizer.decode(expected[:-1] if expected[-1] in engine.backend.eos_token_ids() else expected,
                                        clean_up_tokenization_spaces=False)
