"""The in-context cache baseline and its mixture with the n-gram: hand-computed cases (no database)."""

from __future__ import annotations

import math

import pytest

from hartonomous.compare import metrics as m
from hartonomous.compare.cache import CachedNGram, fit_mixture, longest_match, mix


def sparse(mapping: dict[int, float]) -> m.Sparse:
    return m.Sparse.of(list(mapping), list(mapping.values()))


def as_dict(dist: m.Sparse) -> dict[int, float]:
    return dict(zip(dist.ids.tolist(), dist.probs.tolist()))


def constant(mapping: dict[int, float]):
    """An n-gram stand-in that predicts the same distribution for every context."""
    return lambda context: sparse(mapping)


def test_no_match_without_an_earlier_occurrence_of_the_last_token():
    assert longest_match([]) is None
    assert longest_match([5]) is None            # nothing before the last token
    assert longest_match([1, 2, 3]) is None      # 3 never occurred before


def test_the_longest_suffix_predicts_the_token_that_followed_it():
    # [1, 2] occurred at positions 0-1 and was followed by 3
    match = longest_match([1, 2, 3, 1, 2])
    assert (match.length, match.occurrences) == (2, 1)
    assert as_dict(match.dist) == {3: 1.0}


def test_every_earlier_occurrence_of_the_longest_suffix_votes():
    # [7, 1] occurred twice before the end, followed once by 2 and once by 3
    match = longest_match([7, 1, 2, 7, 1, 3, 7, 1])
    assert (match.length, match.occurrences) == (2, 2)
    assert as_dict(match.dist) == {2: 0.5, 3: 0.5}


def test_a_longer_match_beats_a_more_frequent_shorter_one():
    # "1" was followed by 8 twice and by 9 once, but only "4 1" (followed by 9) matches 2 tokens
    match = longest_match([4, 1, 9, 5, 1, 8, 5, 1, 8, 4, 1])
    assert (match.length, match.occurrences) == (2, 1)
    assert as_dict(match.dist) == {9: 1.0}


def test_an_occurrence_may_overlap_the_suffix_itself():
    # [3, 3] ends at position 1 and is followed by the final 3
    match = longest_match([3, 3, 3])
    assert (match.length, match.occurrences) == (2, 1)
    assert as_dict(match.dist) == {3: 1.0}


def test_mix_is_a_convex_combination_over_the_union_of_supports():
    mixed = mix(sparse({1: 0.5, 2: 0.5}), sparse({2: 1.0}), 0.25)
    assert as_dict(mixed) == pytest.approx({1: 0.375, 2: 0.625})
    assert as_dict(mix(sparse({1: 0.5, 2: 0.5}), sparse({2: 1.0}), 0.0)) == {1: 0.5, 2: 0.5}
    assert as_dict(mix(m.Sparse.empty(), sparse({4: 1.0}), 0.3)) == {4: 1.0}   # no n-gram: the cache alone


def test_cached_ngram_uses_the_cache_only_for_long_enough_matches():
    ngram = constant({9: 1.0})
    context = [1, 2, 3, 1, 2]                                # cache: length 2, {3: 1}
    assert as_dict(CachedNGram(ngram, 0.5, min_suffix=2).predict(context)) == {3: 0.5, 9: 0.5}
    assert as_dict(CachedNGram(ngram, 0.5, min_suffix=3).predict(context)) == {9: 1.0}
    assert as_dict(CachedNGram(ngram, 0.5).predict([1, 2, 3])) == {9: 1.0}    # no match: the n-gram alone
    assert as_dict(CachedNGram(ngram, 0.0).predict(context)) == {9: 1.0}


def test_fit_picks_the_top1_best_lambda_and_minimum_suffix():
    """The n-gram always says 0. Matches by position: none, none, length 1 ({2}), 2 ({1}), 3 ({2}),
    4 ({1}). The labels follow the cache where the match has 2+ tokens and the n-gram elsewhere, so
    min_suffix 2 with any λ > 0.5 hits all 6 (at λ = 0.5 the tie goes to token 0); λ = 1 gives the
    labels the most probability, so it wins the tie on log-likelihood."""
    ngram, seq, labels = constant({0: 1.0}), [1, 2, 1, 2, 1, 2], [0, 0, 0, 1, 2, 1]
    fit = fit_mixture(ngram, [seq], [labels], vocab_size=10, eps=0.1)
    assert (fit.lam, fit.min_suffix, fit.positions) == (1.0, 2, 6)
    grid = {(g["lambda"], g["min_suffix"]): g for g in fit.grid}
    assert grid[(0.0, 1)]["top1"] == pytest.approx(3 / 6)       # the n-gram alone: positions 0, 1, 2
    assert grid[(0.5, 2)]["top1"] == pytest.approx(3 / 6)       # ties at 0.5 go to the lower id, 0
    assert grid[(0.6, 2)]["top1"] == pytest.approx(6 / 6)
    assert grid[(0.6, 1)]["top1"] == pytest.approx(5 / 6)       # position 2 follows the wrong cache
    assert grid[(0.9, 4)]["top1"] == pytest.approx(4 / 6)       # only position 5 uses the cache
    # λ = 1, min_suffix 2: p(label) = 1 everywhere (the n-gram at positions 0-2, the cache at 3-5);
    # min_suffix 1 also lets the wrong cache answer position 2, where p(label) = 0. Smoothed: 0.9 p + 0.1/10.
    hit, miss = math.log(0.9 + 0.01), math.log(0.01)
    assert grid[(1.0, 2)]["log_likelihood"] == pytest.approx(hit)
    assert grid[(1.0, 1)]["log_likelihood"] == pytest.approx((5 * hit + miss) / 6)
    assert len(fit.grid) == 11 * 4


def test_fit_keeps_the_ngram_alone_when_the_cache_never_helps():
    ngram, seq = constant({0: 1.0}), [1, 2, 1, 2, 1, 2]
    fit = fit_mixture(ngram, [seq], [[0] * 6], vocab_size=10)
    assert (fit.lam, fit.min_suffix) == (0.0, 1)


def test_fit_restarts_the_context_in_each_sequence():
    # Two sequences [5, 6] and [5, 6]: no match inside either (the second does not see the first)
    fit = fit_mixture(constant({0: 1.0}), [[5, 6], [5, 6]], [[0, 0], [0, 6]], vocab_size=10)
    assert all(g["top1"] == pytest.approx(3 / 4) for g in fit.grid)
    with pytest.raises(ValueError):
        fit_mixture(constant({0: 1.0}), [[1, 2]], [[0]], vocab_size=10)


def test_cache_mixture_fits_per_chunk_and_falls_back_to_documented_defaults():
    """baselines.cache_mixture cuts the calibration tokens into contexts of `chunk` tokens (as long as the
    scored ones) and fits there; with no calibration text it uses the defaults and says so."""
    import numpy as np

    from hartonomous.compare.baselines import cache_mixture
    from hartonomous.compare.cache import DEFAULT_LAMBDA, DEFAULT_MIN_SUFFIX

    ngram = constant({0: 1.0})
    predict, section = cache_mixture(ngram, ([1, 2, 1, 2, 1, 2], np.array([0, 0, 0, 1, 2, 1])), 6, 10)
    assert (section.lam, section.min_suffix, section.fitted_on, section.positions) == (1.0, 2, "calibration", 6)
    assert as_dict(predict([1, 2, 3, 1, 2])) == {3: 1.0}
    # In chunks of 3 the contexts restart: [1, 2, 1] and [2, 1, 2] have 1-token matches only, one wrong
    # (says 2, label 0) and one right (says 1, label 1). Every grid point hits 3 of 6; λ = 0.5 gives
    # both labels p = 0.5 instead of 1 and ~0, so it wins on log-likelihood.
    _, short = cache_mixture(ngram, ([1, 2, 1, 2, 1, 2], np.array([0, 0, 0, 1, 2, 1])), 3, 10)
    assert {g["top1"] for g in short.grid} == {0.5}
    assert (short.lam, short.min_suffix, short.positions) == (0.5, 1, 6)
    predict, fallback = cache_mixture(ngram, None, 6, 10)
    assert (fallback.lam, fallback.min_suffix, fallback.fitted_on) == (DEFAULT_LAMBDA, DEFAULT_MIN_SUFFIX, None)
    assert "not fitted" in fallback.note
    assert as_dict(predict([1, 2, 3, 1, 2])) == {0: 0.5, 3: 0.5}
