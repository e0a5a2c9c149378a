"""The report's 95 % intervals and paired tests (hartonomous/compare/intervals.py).

Coverage is checked where the truth is known: synthetic per-position values drawn from a known
rate, repeated many times; a 95 % interval must contain the true rate about 95 % of the time.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hartonomous.compare.intervals import blocks_of, bootstrap_interval, paired_test

REPEATS = 300


def _coverage(draw, truth: float, groups=None, resamples: int = 500) -> float:
    rng = np.random.default_rng(12345)
    hits = 0
    for r in range(REPEATS):
        values = draw(rng)
        iv = bootstrap_interval(values, groups, resamples=resamples, seed=r)
        hits += iv.low <= truth <= iv.high
    return hits / REPEATS


def test_the_interval_of_a_top1_rate_covers_the_true_rate_about_95_percent_of_the_time() -> None:
    coverage = _coverage(lambda rng: (rng.random(500) < 0.3).astype(float), 0.3)
    assert 0.91 <= coverage <= 0.98


def test_blocks_keep_coverage_where_neighbouring_positions_are_correlated_and_single_positions_do_not() -> None:
    """Each run of 32 positions shares one outcome (an extreme correlation): resampling single positions
    then undercovers badly, resampling the blocks does not."""
    position = np.arange(640)
    groups = blocks_of(np.zeros(640, dtype=int), position)

    def draw(rng):
        return np.repeat((rng.random(20) < 0.3).astype(float), 32)

    assert 0.88 <= _coverage(draw, 0.3, groups) <= 0.99
    assert _coverage(draw, 0.3, None) < 0.6


def test_blocks_are_runs_of_consecutive_positions_within_one_text() -> None:
    groups = blocks_of([0, 0, 0, 1, 1], [0, 31, 32, 0, 40], block=32)
    assert groups[0] == groups[1]
    assert len({groups[1], groups[2], groups[3], groups[4]}) == 4


def test_undefined_positions_are_left_out_and_counted() -> None:
    iv = bootstrap_interval([1.0, float("nan"), 0.0, 1.0])
    assert iv.n == 3
    assert iv.estimate == pytest.approx(2 / 3)
    assert 0.0 <= iv.low <= iv.estimate <= iv.high <= 1.0


def test_no_defined_position_gives_no_interval() -> None:
    iv = bootstrap_interval([float("nan")])
    assert (iv.estimate, iv.low, iv.high, iv.n) == (None, None, None, 0)


def test_a_monotone_transform_maps_the_estimate_and_both_ends() -> None:
    nll = np.random.default_rng(0).exponential(2.0, 400)
    plain = bootstrap_interval(nll)
    ppl = bootstrap_interval(nll, transform=math.exp)
    assert ppl.estimate == pytest.approx(math.exp(plain.estimate))
    assert (ppl.low, ppl.high) == pytest.approx((math.exp(plain.low), math.exp(plain.high)))


def test_a_custom_statistic_is_bootstrapped_too() -> None:
    values = np.random.default_rng(1).normal(0.0, 1.0, 300)
    iv = bootstrap_interval(values, statistic=np.median, resamples=300)
    assert iv.estimate == pytest.approx(float(np.median(values)))
    assert iv.low < iv.estimate < iv.high


def test_the_same_values_always_give_the_same_interval() -> None:
    values = (np.random.default_rng(3).random(1000) < 0.4).astype(float)
    assert bootstrap_interval(values) == bootstrap_interval(values)


def test_a_clearly_better_path_is_ahead_and_its_mirror_behind() -> None:
    rng = np.random.default_rng(7)
    b = (rng.random(2000) < 0.30).astype(float)
    a = np.maximum(b, (rng.random(2000) < 0.15).astype(float))     # b's hits plus ~10 % more
    test = paired_test(a, b, metric="top1", names=("spatial", "trigram"))
    assert test.verdict == "ahead" and test.low > 0 and test.p_value < 0.05
    assert test.wording.startswith("ahead by")
    mirror = paired_test(b, a, metric="top1")
    assert mirror.verdict == "behind" and mirror.high < 0


def test_for_a_divergence_lower_is_better() -> None:
    rng = np.random.default_rng(8)
    b = rng.random(1000) + 0.5
    a = b - 0.2
    assert paired_test(a, b, metric="js").verdict == "ahead"


def test_identical_paths_show_no_difference_and_name_n() -> None:
    a = (np.random.default_rng(9).random(700) < 0.3).astype(float)
    test = paired_test(a, a.copy(), metric="top1")
    assert test.verdict == "no difference" and test.p_value == 1.0
    assert "no difference at n = 700" in test.wording


def test_paths_with_the_same_rate_rarely_differ() -> None:
    """Under the null (two independent paths, same true rate) the test says 'no difference' ~95 % of the time."""
    rng = np.random.default_rng(11)
    calls = [paired_test((rng.random(400) < 0.3).astype(float), (rng.random(400) < 0.3).astype(float),
                         resamples=400, seed=r).verdict for r in range(200)]
    assert calls.count("no difference") / len(calls) >= 0.9


def test_paired_values_must_be_on_the_same_positions() -> None:
    with pytest.raises(ValueError, match="same positions"):
        paired_test([1.0, 0.0], [1.0])


def test_blocks_stay_32_long_while_there_are_20_of_them_and_shorten_below() -> None:
    from hartonomous.compare.intervals import BLOCK, MIN_BLOCKS, block_length

    assert (BLOCK, MIN_BLOCKS) == (32, 20)
    assert block_length(2000) == block_length(640) == 32      # 640 = 20 blocks of 32
    assert block_length(639) == 31                            # 639 // 20
    assert block_length(200) == 10 and block_length(30) == 1 and block_length(0) == 1


def test_a_single_block_gives_no_interval_and_no_verdict() -> None:
    """One block cannot show how blocks vary: no interval, rather than a zero-width one."""
    one = bootstrap_interval([1.0, 0.0, 1.0], [0, 0, 0])
    assert one.estimate == pytest.approx(2 / 3) and (one.low, one.high, one.blocks) == (None, None, 1)
    test = paired_test([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0, 0, 0], metric="top1")
    assert (test.verdict, test.low, test.p_value, test.difference) == ("no difference", None, None, 1.0)
    assert test.wording.startswith("no difference at n = 3")


def test_a_p_value_no_resample_reached_is_worded_as_a_bound() -> None:
    test = paired_test(np.ones(100), np.zeros(100), metric="top1")
    assert test.p_value == 0.0 and "p < 0.0005" in test.wording and "p = 0" not in test.wording


def test_a_timing_median_gets_a_bootstrap_interval_over_whole_generations() -> None:
    from hartonomous.compare.generation import median_ci95

    rng = np.random.default_rng(5)
    runs = [rng.lognormal(mean=0.0 + 0.2 * r, sigma=0.3, size=30) for r in range(6)]    # six generations
    values = np.concatenate(runs).tolist()
    groups = [r for r, run in enumerate(runs) for _ in run]
    low, high = median_ci95(values, groups)
    assert low <= float(np.median(values)) <= high
    # Resampling generations sees the spread between runs; resampling steps alone is narrower.
    step_low, step_high = median_ci95(values)
    assert high - low > step_high - step_low
    assert median_ci95(values[:30], groups[:30]) is None      # one generation: no interval
    assert median_ci95([]) is None
