"""95 % intervals and paired tests for the comparison report: a block bootstrap over positions.

Neighbouring positions of one text are not independent (the same sentence, the same topic), so
resampling single positions would give intervals that are too narrow. The report resamples
*blocks*: runs of `BLOCK` consecutive scored positions of one text, drawn with replacement
(a cluster bootstrap). Everything is seeded and summed in a fixed order (no BLAS), so the same
per-position values always give the same interval, byte for byte.

Blocks need company: with a handful of blocks a bootstrap cannot see how much the blocks vary.
`block_length(n)` keeps `BLOCK` when n gives at least `MIN_BLOCKS` blocks of it and shortens the
blocks otherwise (down to single positions), and a sample of fewer than 2 blocks gets no
interval and no verdict at all.

- `bootstrap_interval`: the percentile interval of a statistic (by default the mean) of one path;
  it always contains its estimate (rounding alone could put a constant's mean one ulp outside).
- `paired_test`: the difference of two paths scored on the *same* positions. The blocks are
  resampled jointly for both, the interval is the percentile interval of the mean difference and
  the two-sided p-value is twice the share of resampled differences on the far side of zero, so
  "the interval excludes 0" and "p < 0.05" say the same (up to the resolution of the resamples).
  The verdict words it: "ahead", "behind" or "no difference at n = …".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 2000
BLOCK = 32          # consecutive scored positions of one text per resampled block
MIN_BLOCKS = 20     # block_length shortens the blocks below this many
SEED = 0


def method(block: int = BLOCK) -> str:
    """How the intervals were computed, in one phrase (for the report)."""
    blocks = (f"blocks of {block} consecutive positions of one text" if block > 1
              else "blocks of 1 position: single positions resampled")
    return f"block bootstrap over positions ({blocks}, {RESAMPLES} resamples, percentile interval)"


METHOD = method(BLOCK)

# Which way is better, per metric of hartonomous.compare.fidelity (and the report's extras).
HIGHER_IS_BETTER = {"top1": True, "top10_overlap": True, "mass_covered": True, "exact_p_of_argmax": True,
                    "pearson": True, "pearson_full_vocab": True, "target_in_support": True,
                    "js": False, "nll": False, "perplexity": False}


@dataclass(frozen=True)
class Interval:
    """A statistic with its 95 % interval; `n` counts the positions where the metric is defined."""

    estimate: float | None
    low: float | None
    high: float | None
    n: int
    blocks: int

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PairedTest:
    """Path a against path b on the same positions: mean difference a - b, its interval, p, verdict."""

    metric: str
    a: str
    b: str
    difference: float | None
    low: float | None
    high: float | None
    p_value: float | None
    n: int
    blocks: int
    verdict: str          # "ahead" | "behind" | "no difference" (a relative to b; direction of "better")
    wording: str          # e.g. "ahead by 0.031 [0.012, 0.050], p = 0.002, n = 2000"

    def as_dict(self) -> dict:
        return asdict(self)


def blocks_of(text_index: Sequence[int], position: Sequence[int], block: int = BLOCK) -> np.ndarray:
    """The resampling block of every scored position: (text, position // block), numbered 0..G-1."""
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    keys = np.stack([np.asarray(text_index, dtype=np.int64), np.asarray(position, dtype=np.int64) // block])
    if keys.shape[1] == 0:
        return np.zeros(0, dtype=np.int64)
    _, ids = np.unique(keys, axis=1, return_inverse=True)
    return ids.reshape(-1).astype(np.int64)


def block_length(positions: int, block: int = BLOCK, min_blocks: int = MIN_BLOCKS) -> int:
    """`block`, or shorter so that `positions` give at least `min_blocks` blocks (at least 1)."""
    if positions >= block * min_blocks:
        return block
    return max(1, min(block, positions // min_blocks))


def _groups(n: int, groups: Sequence[int] | np.ndarray | None) -> np.ndarray:
    """Block ids for n values; None = every value its own block (the plain bootstrap)."""
    if groups is None:
        return np.arange(n, dtype=np.int64)
    g = np.asarray(groups, dtype=np.int64)
    if g.shape != (n,):
        raise ValueError(f"groups must give one block per value: {g.shape} vs ({n},)")
    return g


def _block_draws(groups: np.ndarray, resamples: int, seed: int) -> tuple[np.ndarray, int]:
    """(weights[resample, block], number of blocks): how often each block is drawn in each resample."""
    _, dense = np.unique(groups, return_inverse=True)
    g = int(dense.max()) + 1 if len(dense) else 0
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, g, size=(resamples, g)) if g else np.zeros((resamples, 0), dtype=np.int64)
    weights = np.zeros((resamples, g), dtype=np.float64)
    np.add.at(weights, (np.arange(resamples)[:, None], draws), 1.0)
    return weights, g


def _resampled_means(values: np.ndarray, groups: np.ndarray, resamples: int, seed: int) -> tuple[np.ndarray, int]:
    """The mean of `values` in each block-bootstrap resample (blocks weighted by how often drawn)."""
    _, dense = np.unique(groups, return_inverse=True)
    weights, g = _block_draws(groups, resamples, seed)
    sums = np.bincount(dense, weights=values, minlength=g)
    counts = np.bincount(dense, minlength=g).astype(np.float64)
    # Elementwise products summed by numpy (a fixed order), not a BLAS product whose order may
    # depend on the thread count: the same values give the same bits on any run.
    totals, sizes = (weights * sums).sum(axis=1), (weights * counts).sum(axis=1)
    return totals / np.maximum(sizes, 1.0), g


def _percentiles(samples: np.ndarray, confidence: float, estimate: float) -> tuple[float, float]:
    """The percentile interval, widened to contain `estimate` (rounding alone can put a constant's
    mean one ulp outside the means of its resamples)."""
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(samples, [tail, 100.0 - tail])
    return min(float(low), estimate), max(float(high), estimate)


def bootstrap_interval(values: Sequence[float] | np.ndarray, groups: Sequence[int] | np.ndarray | None = None, *,
                       statistic: Callable[[np.ndarray], float] | None = None,
                       transform: Callable[[float], float] | None = None,
                       resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = SEED) -> Interval:
    """The block-bootstrap percentile interval of `statistic` (default: the mean) of `values`.

    NaN values (positions where a metric is undefined) are left out before resampling. A monotone
    `transform` is applied to the estimate and both ends (e.g. exp of a mean NLL = a perplexity).
    Fewer than 2 blocks give the estimate with no interval (low = high = None).
    `statistic` (any function of the resampled values) is slower than the default mean.
    """
    v = np.asarray(values, dtype=np.float64)
    g = _groups(len(v), groups)
    ok = np.isfinite(v)
    v, g = v[ok], g[ok]
    if len(v) == 0:
        return Interval(None, None, None, 0, 0)
    if statistic is None:
        estimate = float(v.mean())
        samples, n_blocks = _resampled_means(v, g, resamples, seed)
    else:
        estimate = float(statistic(v))
        samples, n_blocks = _resampled_statistic(v, g, statistic, resamples, seed)
    if n_blocks < 2:
        return Interval(transform(estimate) if transform else estimate, None, None, int(len(v)), n_blocks)
    low, high = _percentiles(samples, confidence, estimate)
    if transform is not None:
        estimate, low, high = transform(estimate), transform(low), transform(high)
    return Interval(estimate, low, high, int(len(v)), n_blocks)


def _resampled_statistic(values: np.ndarray, groups: np.ndarray, statistic, resamples: int,
                         seed: int) -> tuple[np.ndarray, int]:
    _, dense = np.unique(groups, return_inverse=True)
    members = [np.flatnonzero(dense == b) for b in range(int(dense.max()) + 1)]
    rng = np.random.default_rng(seed)
    out = np.empty(resamples)
    for r in range(resamples):
        pick = rng.integers(0, len(members), size=len(members))
        out[r] = statistic(values[np.concatenate([members[b] for b in pick])])
    return out[np.isfinite(out)], len(members)


def paired_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                groups: Sequence[int] | np.ndarray | None = None, *, metric: str = "top1",
                names: tuple[str, str] = ("a", "b"), higher_is_better: bool | None = None,
                resamples: int = RESAMPLES, confidence: float = CONFIDENCE, seed: int = SEED) -> PairedTest:
    """Paired block bootstrap of mean(a - b) over the positions where both are defined.

    The verdict is "ahead" when the interval of the difference lies on the better side of 0 (by
    `higher_is_better`, default from HIGHER_IS_BETTER), "behind" when on the worse side, and
    "no difference" otherwise; the p-value is consistent with it (p < 1 - confidence exactly when
    the interval excludes 0, up to the resolution of the resamples). Fewer than 2 blocks: no
    interval, no p-value, "no difference".
    """
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape:
        raise ValueError(f"paired values must be on the same positions: {x.shape} vs {y.shape}")
    g = _groups(len(x), groups)
    better_up = HIGHER_IS_BETTER.get(metric, True) if higher_is_better is None else higher_is_better
    ok = np.isfinite(x) & np.isfinite(y)
    d, g = x[ok] - y[ok], g[ok]
    n = int(len(d))
    if n == 0:
        return PairedTest(metric, *names, None, None, None, None, 0, 0, "no difference",
                          "no positions where both are defined")
    samples, n_blocks = _resampled_means(d, g, resamples, seed)
    diff = float(d.mean())
    if n_blocks < 2:
        return PairedTest(metric, *names, diff, None, None, None, n, n_blocks, "no difference",
                          f"no difference at n = {n} (difference {diff:+.3g}; {n_blocks} block: too few to test)")
    low, high = _percentiles(samples, confidence, diff)
    p = min(1.0, 2.0 * min(float(np.mean(samples <= 0.0)), float(np.mean(samples >= 0.0))))
    if np.all(d == 0):
        p = 1.0
    alpha = 1.0 - confidence
    p_text = f"p < {1.0 / resamples:.1g}" if p == 0 else f"p = {p:.2g}"    # no resample crossed 0
    if low > 0 or high < 0:
        up = low > 0
        verdict = "ahead" if up == better_up else "behind"
        wording = f"{verdict} by {abs(diff):.3g} (difference {diff:+.3g} [{low:+.3g}, {high:+.3g}], {p_text}, n = {n})"
    else:
        verdict = "no difference"
        wording = (f"no difference at n = {n} (difference {diff:+.3g} [{low:+.3g}, {high:+.3g}], "
                   f"{p_text} ≥ {alpha:.2g})")
    return PairedTest(metric, names[0], names[1], diff, low, high, p, n, n_blocks, verdict, wording)
