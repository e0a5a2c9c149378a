"""Risk and hybrid routing in the comparison report (issue 16; issue 22 item 4).

The atom set's risk predictor (hartonomous/risk.py, fitted by the build on the calibration half)
estimates per step the probability that the spatial top-1 differs from the exact model's argmax;
the hybrid path (hartonomous/backends/hybrid.py) sends a step to the exact model when that risk is
at or above a threshold. This module measures both on the report's scored positions:

- **ROC AUC** of the risk for "spatial top-1 is wrong" (the label is the report's own spatial top-1
  agreement at that position), with the risk the hybrid path computes at run time there
  (`SpatialBackend.signals`: SQL next_token_signals with the report's K and history weight).
- **The routing curve**: for each fraction f of a grid, the threshold at that quantile of the
  text's risks (the steps with risk >= threshold go to the exact model, as in the hybrid path),
  the fraction it actually routes, and the teacher-forced agreement with the exact argmax: an
  exact step agrees by definition, a spatial step when its top-1 is right. Beside it random
  routing at the same fraction (its expected value, f + (1 - f) x spatial top-1, not a draw) and
  the perfect router (the wrong steps first: min(1, f + spatial top-1)), a ceiling.
- **ms/token** of each router from per-step costs measured in the same run: the spatial step
  (SQL next_token, greedy, as SpatialBackend sends it), the routing signals (SQL
  next_token_signals), both per scored position, and the exact model's cached one-token step
  (ExactBackend: a forward of one token with the KV cache, then the greedy distribution). A
  risk-routed step pays the signals plus its path's step; threshold 0 and threshold > 1 compute
  no risk (HybridBackend), so the curve's endpoints cost exactly the pure paths; a random or
  perfect router pays no signals.

The pure functions (`risk_auc`, `risk_threshold`, `routing_curve`, `StepCosts`) are shared with the
build (projection/risk.py) and benchmarks/risk_hybrid.py.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from hartonomous.compare import intervals
from hartonomous.generation_config import SamplerArgs

if TYPE_CHECKING:               # annotations only: projection/risk.py imports this module, keep it light
    import psycopg

    from hartonomous.atomset import AtomSet
    from hartonomous.compare.fidelity import Fidelity
    from hartonomous.compare.progress import Progress

FRACTIONS = tuple(i / 10 for i in range(11))     # 0, 10 %, ..., 100 % of steps to the exact model
EXACT_STEPS = 64                                 # cached one-token forwards timed per report
GREEDY = SamplerArgs(temperature=0.0, top_k=None, top_p=1.0, repetition_penalty=1.0)
MISSING_RISK = 1.0      # a step without a risk (no candidates) ranks as riskiest: the exact model answers it


# --- the evaluation: pure functions of per-position risks and labels -----------------------------

def risk_auc(wrong: Sequence[bool] | np.ndarray, risk: Sequence[float] | np.ndarray) -> float | None:
    """ROC AUC of `risk` for `wrong` (ties count half); None when the labels are all one class.

    The Mann-Whitney form, (rank sum of the wrong steps - n1 (n1 + 1) / 2) / (n1 n0) with mid-ranks
    for ties: the same number as scikit-learn's roc_auc_score, fast enough to recompute on every
    bootstrap resample."""
    from scipy.stats import rankdata

    y = np.asarray(wrong, dtype=bool)
    n1 = int(y.sum())
    n0 = len(y) - n1
    if n1 == 0 or n0 == 0:
        return None
    ranks = rankdata(np.asarray(risk, dtype=np.float64))
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def with_missing_ranked_first(risk: Sequence[float | None] | np.ndarray) -> np.ndarray:
    """The risks as floats, a missing one (None or NaN: no candidates) as MISSING_RISK."""
    r = np.asarray([math.nan if v is None else v for v in risk], dtype=np.float64)
    return np.where(np.isnan(r), MISSING_RISK, r)


def risk_threshold(risk: np.ndarray, fraction: float) -> float:
    """The hybrid threshold that sends about `fraction` of these steps to the exact model.

    k = round(fraction x n) steps with the highest risk: the k-th highest risk (steps at or above
    it go to the exact model, so ties there send a few more); math.inf for k = 0 (every step
    spatial, no risk computed) and 0 for k = n (every step exact).
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    risk = np.asarray(risk, dtype=np.float64)
    k = int(round(fraction * len(risk)))
    if k == 0:
        return math.inf
    if k >= len(risk):
        return 0.0
    return float(np.sort(risk)[::-1][k - 1])


def routed_to_exact(risk: np.ndarray, threshold: float) -> np.ndarray:
    """Which steps the hybrid path sends to the exact model at `threshold` (risk >= threshold)."""
    return np.asarray(risk, dtype=np.float64) >= threshold


@dataclass(frozen=True)
class CurvePoint:
    """One fraction of the routing curve (agreements are means over the scored steps)."""

    fraction: float             # the grid's target share of exact steps
    threshold: float            # risk threshold giving it on this text (inf: all spatial, 0: all exact)
    fraction_exact: float       # the share the threshold actually routes (ties can add a few)
    agreement: float            # risk routing: mean of (routed to exact or spatial top-1 right)
    random_agreement: float     # random routing of fraction_exact, expected: f + (1 - f) x spatial top-1
    perfect_agreement: float    # the wrong steps first: min(1, f + spatial top-1)


def routing_curve(risk: Sequence[float] | np.ndarray, right: Sequence[bool] | np.ndarray,
                  fractions: Sequence[float] = FRACTIONS) -> list[CurvePoint]:
    """The risk, random and perfect routers at each fraction, on per-step risks (a missing one ranks as
    MISSING_RISK) and "spatial top-1 right"."""
    risk, right = with_missing_ranked_first(risk), np.asarray(right, dtype=bool)
    if risk.shape != right.shape or len(risk) == 0:
        raise ValueError(f"risk and right need the same non-zero length: {risk.shape} vs {right.shape}")
    top1 = float(right.mean())
    points = []
    for fraction in fractions:
        threshold = risk_threshold(risk, fraction)
        exact = routed_to_exact(risk, threshold)
        f = float(exact.mean())
        points.append(CurvePoint(float(fraction), threshold, f, float(np.mean(exact | right)),
                                 f + (1.0 - f) * top1, min(1.0, f + top1)))
    return points


@dataclass(frozen=True)
class StepCosts:
    """Per-step costs (ms) and what a router's step costs from them."""

    spatial_ms: float       # one spatial step: SQL next_token
    signals_ms: float       # the routing signals and risk: SQL next_token_signals
    exact_ms: float         # one exact step: a cached one-token forward

    def risk_routed_ms(self, threshold: float, fraction_exact: float) -> float:
        """Mean ms/step of the hybrid path at `threshold`, routing `fraction_exact` of the steps."""
        if threshold == 0:
            return self.exact_ms
        if threshold > 1:
            return self.spatial_ms
        return self.signals_ms + self.direct_ms(fraction_exact)

    def direct_ms(self, fraction_exact: float) -> float:
        """Mean ms/step of a router that computes nothing to decide (random, perfect)."""
        return (1.0 - fraction_exact) * self.spatial_ms + fraction_exact * self.exact_ms


# --- the measurement --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpatialSteps:
    """Per scored position: the risk the hybrid path computes, and the time of both SQL calls."""

    risk: np.ndarray          # NaN where next_token_signals gave no risk
    signals_ms: np.ndarray
    spatial_ms: np.ndarray


def measure_spatial_steps(conn: psycopg.Connection, atom_set: str, contexts: Sequence[Sequence[int]], tokenizer,
                          max_neighbors: int, history_weight: float | None,
                          on_step: Callable[[], None] | None = None) -> SpatialSteps:
    """At each context, what the hybrid path calls in this order: SpatialBackend.signals, then
    SpatialBackend.distribution (greedy), each timed by the wall clock around the call."""
    from hartonomous.backends.spatial import SpatialBackend, SpatialState

    backend = SpatialBackend(conn, atom_set, tokenizer=tokenizer, max_neighbors=max_neighbors,
                             history_weight=history_weight)
    risk, signals_ms, spatial_ms = [], [], []
    for context in contexts:
        state = SpatialState([int(t) for t in context])
        t0 = time.perf_counter()
        signals = backend.signals(state)
        t1 = time.perf_counter()
        backend.distribution(state, GREEDY)
        t2 = time.perf_counter()
        risk.append(math.nan if signals.risk is None else signals.risk)
        signals_ms.append(1000 * (t1 - t0))
        spatial_ms.append(1000 * (t2 - t1))
        if on_step:
            on_step()
    return SpatialSteps(np.asarray(risk, dtype=np.float64), np.asarray(signals_ms), np.asarray(spatial_ms))


def measure_exact_steps(model, tokenizer, ids: Sequence[int], steps: int = EXACT_STEPS,
                        on_step: Callable[[], None] | None = None) -> tuple[np.ndarray, tuple[int, int]]:
    """ms of each cached one-token step of the exact path over the last `steps` tokens of `ids`
    (prefill the rest, then per token: the greedy distribution and the KV-cached forward of that
    token, as ExactBackend does per exact step), and the context lengths they ran at."""
    from hartonomous.backends.exact import ExactBackend
    from hartonomous.runtimes.reference import ExactModel

    ids = [int(t) for t in ids]
    steps = max(min(steps, len(ids) - 1), 0)
    start = len(ids) - steps
    backend = ExactBackend(ExactModel(model, tokenizer))
    state = backend.start(ids[:start])
    ms = []
    for token in ids[start:]:
        t0 = time.perf_counter()
        backend.distribution(state, GREEDY)
        backend.advance(state, token)
        ms.append(1000 * (time.perf_counter() - t0))
        if on_step:
            on_step()
    return np.asarray(ms), (start, len(ids) - 1)


# --- the report section ------------------------------------------------------------------------------

def _cost(ms: np.ndarray, how: str) -> dict:
    from hartonomous.measure import percentile

    return {"ms_p50": percentile(ms, 50), "ms_p95": percentile(ms, 95), "n": int(len(ms)), "how": how}


def no_predictor(atom_set: str) -> dict:
    """The section of a set without a risk predictor."""
    return {"available": False,
            "note": f"atom set '{atom_set}' has no risk predictor (atom_sets.risk_model is null: token sets and "
                    "sets whose calibration half had a single outcome have none), so there is no risk to "
                    "score and no hybrid routing"}


def routing_section(conn: psycopg.Connection, info: AtomSet, fid: Fidelity, texts: dict[int, Sequence[int]], model,
                    tokenizer, *, max_neighbors: int, history_weight: float | None,
                    progress: Progress | None = None) -> dict:
    """The report's `routing` section for atom set `info` on the scored positions of `fid`
    (hartonomous.compare.fidelity.Fidelity); `texts` maps a text index to its scored token ids."""
    if info.risk_model is None:
        return no_predictor(info.name)
    n = fid.n
    contexts = [texts[i][:p + 1] for i, p in zip(fid.text_index, fid.position)]
    if progress:
        progress.stage("risk and routing: signals and spatial step per position", n)
    spatial = measure_spatial_steps(conn, info.name, contexts, tokenizer, max_neighbors, history_weight,
                                    on_step=progress.advance if progress else None)
    longest = max(texts.values(), key=len)
    if progress:
        progress.stage("risk and routing: exact one-token steps", min(EXACT_STEPS, len(longest) - 1))
    exact_ms, (lo, hi) = measure_exact_steps(model, tokenizer, longest,
                                             on_step=progress.advance if progress else None)
    step_costs = {
        "spatial": _cost(spatial.spatial_ms, "SQL next_token (greedy) as the spatial backend sends it, wall clock "
                                             "around the call, once per scored position"),
        "signals": _cost(spatial.signals_ms, "SQL next_token_signals (the risk), wall clock around the call, once "
                                             "per scored position, just before next_token"),
        "exact": _cost(exact_ms, f"the exact model's cached one-token step (greedy distribution, then the "
                                 f"KV-cached forward of one token) over contexts of {lo}–{hi} tokens of the "
                                 f"longest scored text"),
    }
    costs = StepCosts(*(step_costs[k]["ms_p50"] for k in ("spatial", "signals", "exact")))

    right = fid.paths["spatial"].array("top1") == 1.0
    missing = np.isnan(spatial.risk)
    risk = with_missing_ranked_first(spatial.risk)
    blocks = fid.blocks()                     # the report's resampling blocks (shorter for short texts)
    auc = intervals.bootstrap_interval(np.arange(n, dtype=np.float64), blocks,
                                       statistic=lambda idx: _auc_or_nan(~right, risk, idx))
    model_info = info.risk_model
    curve = []
    for point in routing_curve(risk, right):
        agree = (routed_to_exact(risk, point.threshold) | right).astype(np.float64)
        random_expected = point.fraction_exact + (1.0 - point.fraction_exact) * right.astype(np.float64)
        interior = 0 < point.fraction_exact < 1
        curve.append({
            "fraction": point.fraction, "threshold": point.threshold if math.isfinite(point.threshold) else None,
            "fraction_exact": point.fraction_exact,
            "agreement": intervals.bootstrap_interval(agree, blocks).as_dict(),
            "random_agreement": point.random_agreement, "perfect_agreement": point.perfect_agreement,
            "vs_random": intervals.paired_test(agree, random_expected, blocks, metric="top1",
                                               names=("risk routing", "random routing")).as_dict()
            if interior else None,
            "ms_per_token": costs.risk_routed_ms(point.threshold, point.fraction_exact),
            "random_ms_per_token": costs.direct_ms(point.fraction_exact),
        })
    return {
        "available": True,
        "positions": n,
        "spatial_top1": float(right.mean()),
        "missing_risk": int(missing.sum()),
        "risk_model": {"features": list(model_info.features), "positions": model_info.positions,
                       "base_rate": model_info.base_rate, "calibration_auc": model_info.calibration_auc},
        "roc_auc": auc.as_dict(),
        "interval_method": intervals.METHOD,
        "step_costs": step_costs,
        "random_routing": "expected value at the same fraction: f + (1 − f) × spatial top-1 (not a draw)",
        "curve": curve,
    }


def _auc_or_nan(wrong: np.ndarray, risk: np.ndarray, idx: np.ndarray) -> float:
    auc = risk_auc(wrong[idx.astype(np.int64)], risk[idx.astype(np.int64)])
    return math.nan if auc is None else auc
