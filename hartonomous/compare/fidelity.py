"""Teacher-forced fidelity: every approximation against the exact distribution, position by position.

At position t of a text with tokens x_0..x_n the context is x_0..x_t and the target is x_{t+1}.
Each approximation (the spatial path, each baseline) is a function of the context returning a
sparse distribution; it is scored against the exact model's full distribution at T = 1.

Every summary carries a 95 % interval of its mean (`ci95`, hartonomous.compare.intervals): the
positions are resampled in blocks of consecutive positions of one text (`Fidelity.blocks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hartonomous.compare import intervals
from hartonomous.compare import metrics as m
from hartonomous.compare.signals import SIGNALS, signals
from hartonomous.measure import percentile

Predictor = Callable[[Sequence[int]], m.Sparse]

METRICS = ("top1", "top10_overlap", "mass_covered", "exact_p_of_argmax", "js", "pearson",
           "pearson_full_vocab", "nll", "target_in_support", "candidates")


def score(exact: m.Exact, dist: m.Sparse, target: int, eps: float = m.SMOOTHING_EPSILON) -> dict[str, float]:
    """Every per-position metric of one approximation (nll is smoothed with eps)."""
    vocab = exact.vocab_size
    return {
        "top1": float(m.top1_agreement(exact, dist)),
        "top10_overlap": m.top_k_overlap(exact, dist),
        "mass_covered": m.mass_covered(exact, dist),
        "exact_p_of_argmax": m.exact_prob_of_argmax(exact, dist),
        "js": m.js_to_exact(exact, dist),
        "pearson": m.pearson_union(exact, dist),
        "pearson_full_vocab": m.pearson_full_vocab(exact, dist),
        "nll": -math.log(m.smoothed_prob(dist, target, vocab, eps)),
        "target_in_support": float(m.in_support(dist, target)),
        "candidates": float(len(dist)),
    }


@dataclass
class Column:
    """Per-position values of one path, column-wise."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, row: dict[str, float]) -> None:
        for key, value in row.items():
            self.values.setdefault(key, []).append(float(value))

    def array(self, key: str) -> np.ndarray:
        return np.asarray(self.values.get(key, []), dtype=np.float64)


@dataclass
class Fidelity:
    """Per-position results: where each position is, the exact path, and every approximation."""

    text_index: list[int] = field(default_factory=list)
    position: list[int] = field(default_factory=list)
    target: list[int] = field(default_factory=list)
    exact_argmax: list[int] = field(default_factory=list)
    spatial_argmax: list[int | None] = field(default_factory=list)
    spatial_top_p: list[float] = field(default_factory=list)   # its top probability (0: no candidates)
    exact: Column = field(default_factory=Column)          # nll + entropy signals
    spatial_signals: Column = field(default_factory=Column)
    paths: dict[str, Column] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.position)

    @property
    def block(self) -> int:
        """Positions per resampling block for this many scored positions (intervals.block_length)."""
        return intervals.block_length(self.n)

    def blocks(self) -> np.ndarray:
        """The resampling block of every scored position (the same for every path: paired tests)."""
        return intervals.blocks_of(self.text_index, self.position, self.block)


def evaluate_text(fid: Fidelity, text_index: int, ids: Sequence[int], exact_log_probs,
                  predictors: dict[str, Predictor], eps: float = m.SMOOTHING_EPSILON,
                  on_position: Callable[[], None] | None = None) -> None:
    """Score every position of one text; `predictors` must include 'spatial'."""
    if "spatial" not in predictors:
        raise ValueError("predictors must include 'spatial'")
    ids = [int(t) for t in ids]
    for predict in predictors.values():
        prepare = getattr(predict, "prepare", None)   # a predictor that searches all positions at once
        if prepare is not None:
            prepare(ids)
    rows = exact_log_probs.numpy() if hasattr(exact_log_probs, "numpy") else np.asarray(exact_log_probs)
    for t in range(len(ids) - 1):
        log_p = rows[t].astype(np.float64)
        probs = np.exp(log_p)
        probs /= probs.sum()
        exact = m.Exact(probs)
        target = ids[t + 1]
        context = ids[: t + 1]
        fid.text_index.append(text_index)
        fid.position.append(t)
        fid.target.append(target)
        fid.exact_argmax.append(exact.argmax)
        exact_nll = float(-log_p[target])
        fid.exact.add({"nll": exact_nll, **signals(probs, exact_nll).as_dict()})
        for name, predict in predictors.items():
            dist = predict(context)
            row = score(exact, dist, target, eps)
            fid.paths.setdefault(name, Column()).add(row)
            if name == "spatial":
                fid.spatial_argmax.append(m.argmax(dist))
                fid.spatial_top_p.append(float(dist.probs.max()) if len(dist) else 0.0)
                fid.spatial_signals.add(_sparse_signals(dist, row["nll"]))
        if on_position:
            on_position()


def _sparse_signals(dist: m.Sparse, nll: float) -> dict[str, float]:
    if len(dist) == 0:
        return {name: float("nan") for name in SIGNALS}
    return signals(dist.probs, nll).as_dict()


def ci95(interval: intervals.Interval) -> list[float] | None:
    """[low, high] of an interval, None where it has none (no values, or fewer than 2 blocks)."""
    return None if interval.low is None else [interval.low, interval.high]


def distribution(values: np.ndarray, groups: np.ndarray | None = None) -> dict:
    """Summary of a per-position metric; NaNs (undefined positions) are counted, not averaged.

    `ci95` is the block-bootstrap interval of the mean, `groups` each value's block (None: each
    value its own block)."""
    values = np.asarray(values, dtype=np.float64)
    ok = values[np.isfinite(values)]
    out = {"n": int(len(ok)), "undefined": int(len(values) - len(ok))}
    if len(ok) == 0:
        return {**out, **{k: None for k in ("mean", "median", "p05", "p25", "p75", "p95", "min", "max", "ci95")}}
    q = [percentile(ok, p) for p in (5, 25, 50, 75, 95)]
    return {**out, "mean": float(ok.mean()), "median": q[2], "p05": q[0], "p25": q[1], "p75": q[3], "p95": q[4],
            "min": float(ok.min()), "max": float(ok.max()),
            "ci95": ci95(intervals.bootstrap_interval(values, groups))}


def perplexity_ci95(nll: np.ndarray, groups: np.ndarray | None = None) -> list[float] | None:
    """The interval of exp(mean NLL): the mean NLL's interval through exp (a monotone map)."""
    return ci95(intervals.bootstrap_interval(nll, groups, transform=math.exp))


def summarise_path(col: Column, groups: np.ndarray | None = None) -> dict:
    """Every metric's distribution plus the perplexity and its interval, for one path."""
    out = {name: distribution(col.array(name), groups) for name in METRICS}
    out["perplexity"] = m.perplexity(col.array("nll"))
    out["perplexity_ci95"] = perplexity_ci95(col.array("nll"), groups)
    return out


def summarise_signals(col: Column, groups: np.ndarray | None = None) -> dict:
    return {name: distribution(col.array(name), groups) for name in SIGNALS}


POSITION_BINS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def by_position(fid: Fidelity, metric: str = "top1") -> dict[str, list]:
    """Mean of `metric` per path, binned by context length (t + 1) in powers of two."""
    lengths = np.asarray(fid.position) + 1
    bins: list[dict] = []
    edges = [b for b in POSITION_BINS if b <= max(lengths.max(initial=1), 1)] + [math.inf]
    for lo, hi in zip(edges[:-1], edges[1:]):
        mask = (lengths >= lo) & (lengths < hi)
        if not mask.any():
            continue
        entry = {"from": int(lo), "to": None if hi == math.inf else int(hi - 1), "n": int(mask.sum())}
        entry["values"] = {name: float(col.array(metric)[mask].mean()) for name, col in fid.paths.items()}
        bins.append(entry)
    return {"metric": metric, "bins": bins}
