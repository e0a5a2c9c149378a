"""The Python sampler: hand-computed vectors, transformers as the oracle, batching, devices, draws."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hartonomous.sampling import (
    logits_to_probs, next_token_rows, pick_by_uniform, pick_index, process_logits, sample,
    seeded_uniform, validate_sampler_args,
)

VECTORS = json.loads((Path(__file__).parent / "vectors" / "sampler_cases.json").read_text())
CASES = VECTORS["cases"]


def case_logits(case: dict) -> torch.Tensor:
    """ln(weight) for the case's tokens, -inf (no atom) elsewhere."""
    logits = torch.full((VECTORS["vocab_size"],), -math.inf, dtype=torch.float64)
    for token, weight in case["weights"].items():
        logits[int(token)] = math.log(weight)
    return logits


def sampler_args(case: dict) -> dict:
    return {k: case[k] for k in ("temperature", "top_k", "top_p", "repetition_penalty")}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_hand_computed_vectors(case: dict) -> None:
    rows = next_token_rows(case_logits(case), case["context"], **sampler_args(case))
    assert [r[0] for r in rows] == [e[0] for e in case["expected"]], case["why"]
    for (_, p, cum), (_, want_p, want_cum) in zip(rows, case["expected"]):
        assert p == pytest.approx(want_p, abs=1e-12)
        assert cum == pytest.approx(want_cum, abs=1e-12)
    for u, token in case["draws"]:
        assert pick_by_uniform([r[0] for r in rows], [r[1] for r in rows], u) == token


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_batched_pick_agrees_with_the_row_pick(case: dict) -> None:
    probs = logits_to_probs(case_logits(case), case["context"], **sampler_args(case))
    for u, token in case["draws"]:
        assert int(pick_index(probs, torch.tensor(u))) == token


@pytest.mark.parametrize("seed, step, hex_prefix, u", VECTORS["seeded_uniform"]["values"])
def test_seeded_uniform_is_the_documented_hash(seed: int, step: int, hex_prefix: str, u: float) -> None:
    assert seeded_uniform(seed, step) == u
    assert u == (int(hex_prefix, 16) >> 11) / 2**53


def test_seeded_uniform_rejects_out_of_range_seeds() -> None:
    with pytest.raises(ValueError, match="seed must fit in int64"):
        seeded_uniform(2**63, 0)


def _transformers_chain(logits: torch.Tensor, context: list[int], temperature: float, top_k: int,
                        top_p: float, penalty: float) -> torch.Tensor:
    from transformers.generation.logits_process import (
        RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
    )

    ids = torch.tensor([context], dtype=torch.long)
    scores = logits[None].clone()
    scores = RepetitionPenaltyLogitsProcessor(float(penalty))(ids, scores)
    scores = TemperatureLogitsWarper(float(temperature))(ids, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    return scores[0]


@st.composite
def sampler_problems(draw):
    vocab = draw(st.integers(2, 40))
    values = draw(st.lists(st.floats(-20, 20, allow_nan=False), min_size=vocab, max_size=vocab, unique=True))
    context = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8))
    temperature = draw(st.floats(0.05, 5.0))
    top_k = draw(st.integers(0, vocab + 2))
    top_p = draw(st.one_of(st.just(1.0), st.floats(0.01, 1.0)))
    penalty = draw(st.one_of(st.just(1.0), st.floats(0.5, 2.0)))
    return torch.tensor(values, dtype=torch.float64), context, temperature, top_k, top_p, penalty


def _near_a_boundary(logits, context, temperature, top_k, top_p, penalty) -> bool:
    """True when float rounding could legitimately decide a tie or the top-p cut differently."""
    z = process_logits(logits, context, temperature=temperature, repetition_penalty=penalty)
    if len(set(z.tolist())) < len(z):
        return True
    after_k = process_logits(logits, context, temperature=temperature, top_k=top_k, repetition_penalty=penalty)
    probs = torch.sort(torch.softmax(after_k, -1), descending=True).values
    before = torch.cumsum(probs, 0) - probs
    return bool(torch.any((before - top_p).abs() < 1e-9))


@settings(max_examples=300, deadline=None)
@given(sampler_problems())
def test_agrees_with_transformers_processors(problem) -> None:
    logits, context, temperature, top_k, top_p, penalty = problem
    assume(not _near_a_boundary(*problem))
    ours = process_logits(logits, context, temperature=temperature, top_k=top_k, top_p=top_p,
                          repetition_penalty=penalty)
    theirs = _transformers_chain(logits, context, temperature, top_k, top_p, penalty)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    kept = torch.isfinite(ours)
    torch.testing.assert_close(ours[kept], theirs[kept], rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.softmax(ours, -1), torch.softmax(theirs, -1), rtol=0, atol=1e-12)


# Ties, which the property test above excludes. Weights are chosen so that no cumulative mass
# lies near top_p: only the order among equal probabilities can decide what is kept.
def _log_weights(weights: list[float]) -> torch.Tensor:
    return torch.tensor(weights, dtype=torch.float64).log()


def _kept(scores: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(scores)).flatten().tolist())


# (weights by token id, top_k, top_p, what we keep, what transformers keeps)
TIES_AT_THE_TOP_P_CUT = [
    # p 0.1, 0.25, 0.25, 0.4: after token 3 (0.4) the cut falls inside the tie {1, 2}
    pytest.param([1, 2.5, 2.5, 4], 0, 0.5, {3, 1}, {3, 2}, id="pair-straddles-the-cut"),
    pytest.param([1, 2.5, 2.5, 4], 3, 0.5, {3, 1}, {3, 2}, id="pair-straddles-the-cut-after-top-k"),
    # three equal tokens, the cut after two of them: we keep the two lowest ids, they the two highest
    pytest.param([1, 1, 1], 0, 0.5, {0, 1}, {1, 2}, id="three-way-tie-keep-two"),
    # the always-kept first token is itself one of a tie
    pytest.param([1, 1], 0, 0.3, {0}, {1}, id="tie-for-the-top-keep-one"),
    pytest.param([0.5, 3, 0.5, 3, 3], 3, 0.2, {1}, {4}, id="tie-for-the-top-after-top-k"),
]


@pytest.mark.parametrize("weights, top_k, top_p, ours_kept, theirs_kept", TIES_AT_THE_TOP_P_CUT)
def test_top_p_ties_at_the_cut_keep_the_lower_id_where_transformers_keeps_the_higher(
        weights, top_k, top_p, ours_kept, theirs_kept) -> None:
    """The documented difference: same number kept, but the lowest ids of the tie, not the highest."""
    logits = _log_weights(weights)
    ours = process_logits(logits, [0], top_k=top_k, top_p=top_p)
    theirs = _transformers_chain(logits, [0], 1.0, top_k, top_p, 1.0)
    assert _kept(ours) == ours_kept
    assert _kept(theirs) == theirs_kept
    # the kept logits are the same numbers, on different ids
    assert sorted(ours[list(ours_kept)].tolist()) == sorted(theirs[list(theirs_kept)].tolist())
    # and the rows of next_token order the kept tie lower-id first, as the cut did
    rows = next_token_rows(logits, [0], top_k=top_k, top_p=top_p)
    assert {r[0] for r in rows} == ours_kept


TIES_WE_AGREE_ON = [
    # the whole tie {1, 2} inside the nucleus (mass before token 0 is 0.9 >= 0.8)
    pytest.param([1, 2.5, 2.5, 4], 0, 0.8, id="tie-inside-the-nucleus"),
    # the whole tie {1, 2} outside it (0.5 + 0.3 >= 0.6 before either)
    pytest.param([3, 1, 1, 5], 0, 0.6, id="tie-outside-the-nucleus"),
    # top-k keeps every token equal to the k-th largest: {1, 2, 3} for k = 2
    pytest.param([1, 3, 2, 2], 2, 1.0, id="tie-at-the-top-k-boundary"),
    # top-k (k = 3) keeps the boundary tie {2, 3}, then top-p (mass 0.69 before either) drops it whole
    pytest.param([3, 6, 2, 2, 0.5], 3, 0.6, id="top-k-boundary-tie-dropped-whole-by-top-p"),
    # every token equal: top-k keeps them all
    pytest.param([2, 2, 2, 2], 2, 1.0, id="all-equal-top-k"),
]


@pytest.mark.parametrize("weights, top_k, top_p", TIES_WE_AGREE_ON)
def test_ties_not_split_by_the_top_p_cut_agree_with_transformers(weights, top_k, top_p) -> None:
    logits = _log_weights(weights)
    ours = process_logits(logits, [0], top_k=top_k, top_p=top_p)
    theirs = _transformers_chain(logits, [0], 1.0, top_k, top_p, 1.0)
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))
    kept = torch.isfinite(ours)
    assert torch.equal(ours[kept], theirs[kept])


def test_greedy_is_one_hot_on_the_lowest_id_argmax() -> None:
    logits = torch.tensor([1.0, 3.0, 0.5, 3.0])
    probs = logits_to_probs(logits, temperature=0.0, top_k=1, top_p=0.5)
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]
    assert int(sample(probs, torch.Generator().manual_seed(0))) == 1


def test_greedy_applies_the_repetition_penalty_first() -> None:
    logits = torch.tensor([2.0, 1.5])
    assert logits_to_probs(logits, [0], temperature=0.0, repetition_penalty=2.0).tolist() == [0.0, 1.0]


def test_input_logits_are_not_modified() -> None:
    logits = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
    before = logits.clone()
    process_logits(logits, [[1, 2]], temperature=0.7, top_k=2, top_p=0.8, repetition_penalty=1.3)
    assert torch.equal(logits, before)


def test_a_batch_equals_its_rows() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 50, generator=gen, dtype=torch.float64) * 3
    contexts = [[1, 2, 3], [4], [5, 5, 6, 49]]
    args = dict(temperature=0.8, top_k=10, top_p=0.7, repetition_penalty=1.5)
    batch = logits_to_probs(logits, contexts, **args)
    for i in range(3):
        assert torch.equal(batch[i], logits_to_probs(logits[i], contexts[i], **args))


def test_padded_context_rows_equal_ragged_ones() -> None:
    logits = torch.tensor([[1.0, -1.0, 2.0], [0.5, -0.5, 1.5]])
    padded = torch.tensor([[0, 1], [2, -1]])
    ragged = [[0, 1], [2]]
    args = dict(repetition_penalty=2.0)
    assert torch.equal(process_logits(logits, padded, **args), process_logits(logits, ragged, **args))
    # token 1 in row 0 is negative: multiplied; token 2 in row 1 is positive: divided
    assert process_logits(logits, ragged, **args).tolist() == [[0.5, -2.0, 2.0], [0.5, -0.5, 0.75]]


def test_context_ids_outside_the_vocabulary_are_ignored() -> None:
    logits = torch.tensor([1.0, 2.0])
    assert process_logits(logits, [7, -3], repetition_penalty=2.0).tolist() == [1.0, 2.0]


def test_seeded_generator_reproduces_draws_and_follows_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64).expand(20000, 3)
    first = sample(probs, torch.Generator().manual_seed(7))
    again = sample(probs, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    freq = torch.bincount(first, minlength=3).double() / len(first)
    assert torch.allclose(freq, torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64), atol=0.015)


def test_pick_falls_back_to_the_last_positive_row_when_rounding_leaves_none() -> None:
    assert pick_by_uniform([4, 9, 2], [0.6, 0.3999999, 0.0], 0.99999995) == 9
    probs = torch.tensor([0.0, 0.6, 0.3999999, 0.0], dtype=torch.float64)
    assert int(pick_index(probs, torch.tensor(0.99999995))) == 2


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gives_the_cpu_distribution() -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 1000, generator=gen) * 4
    contexts = [[1, 2], [3], [999, 5, 5], [0]]
    args = dict(temperature=0.9, top_k=50, top_p=0.9, repetition_penalty=1.2)
    cpu = logits_to_probs(logits, contexts, **args)
    cuda = logits_to_probs(logits.cuda(), contexts, **args).cpu()
    torch.testing.assert_close(cuda, cpu, rtol=0, atol=1e-12)
    u = torch.rand(4, generator=gen, dtype=torch.float64)
    assert torch.equal(pick_index(cuda.cuda(), u.cuda()).cpu(), pick_index(cpu, u))


@pytest.mark.parametrize("kwargs, argument", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(temperature=math.inf), "temperature"),
    (dict(temperature=None), "temperature"),
    (dict(temperature=True), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(top_p=math.nan), "top_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(repetition_penalty=-1.0), "repetition_penalty"),
    (dict(repetition_penalty=math.nan), "repetition_penalty"),
    (dict(repetition_penalty=math.inf), "repetition_penalty"),
])
def test_bad_arguments_name_themselves(kwargs: dict, argument: str) -> None:
    args = dict(temperature=1.0, top_k=40, top_p=0.9, repetition_penalty=1.0) | kwargs
    with pytest.raises(ValueError, match=f"^{argument} must"):
        validate_sampler_args(**args)
    with pytest.raises(ValueError, match=f"^{argument} must"):
        process_logits(torch.zeros(3), **args)


def test_none_turns_top_k_and_top_p_off() -> None:
    logits = torch.tensor([0.0, 1.0, 2.0])
    assert torch.equal(process_logits(logits, top_k=None, top_p=None), logits.double())
    assert torch.equal(process_logits(logits, top_k=0, top_p=1.0), logits.double())
