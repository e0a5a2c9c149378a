"""History atoms of held-out positions, and the history weight chosen on the calibration half.

SQL `next_token` adds the context's own history as atoms (sql/020_next_token.sql, item 4;
hartonomous.centroid.history_atoms is the NumPy definition): for a context of n tokens and
m = min(history_window, n - 1), each prefix of i = n - m .. n - 1 tokens gives an atom at that
prefix's centroid with the token that followed it, weighing `history_weight`. A held-out chunk
position t (context = tokens 0..t, centroid P[t]) therefore has the history atoms
(P[j], chunk[j + 1]) for j = max(0, t - H) .. t - 1, where P are the chunk's prefix centroids.
Those are computed here for all positions at once and join each position's stored KNN atoms
(projection.calibrate.with_history), so the build scores exactly what next_token computes.

The weight is chosen on a grid with the bandwidth re-fitted at every weight: history atoms sit
at the centroids of the text's own earlier contexts, typically closer to the query than the
stored atoms, so the best h moves with the weight, and a fixed h would bias the choice towards 0.
Two criteria pick the (weight, h) pair (`--calibrate-by`):

- `top1` (the default since commit 8cc461e): every (weight, h) point scored on the calibration half
  (each weight's whole bandwidth curve) is a candidate; the best calibration top-1 agreement
  with the exact argmax wins, and candidates within TOP1_TOLERANCE of it count as tied and are
  ranked by log-likelihood (then the smaller weight, the smaller h). Top-1 is the report's
  headline metric; the tolerance (5 positions in 1,000) keeps the choice from chasing single
  positions of noise and prefers the better-calibrated distribution among near-equals.
- `loglik` (the default before commit 8cc461e): each weight's h and then the weight by the bandwidth objective
  (log-likelihood of the exact argmax by default). It favours spreading mass: at 20K tokens it
  chose weight 0.3 with a 12x wider h, which lowered calibration and test top-1 (docs/fidelity.md).
"""

from __future__ import annotations

from collections.abc import Callable

from dataclasses import dataclass

import numpy as np

from hartonomous.centroid import prefix_centroids
from projection import calibrate as cal

HISTORY_GRID = (0.0, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
CRITERIA = ("top1", "loglik")
DEFAULT_CRITERION = "top1"
TOP1_TOLERANCE = 0.005  # calibration top-1 within this of the best counts as a tie (broken by log-likelihood)
CRITERION_DEFINITIONS = {
    "top1": "the (history weight, h) point with the best calibration top-1 agreement with the exact argmax; "
            f"points within {TOP1_TOLERANCE} of it tie and go to the higher log-likelihood, then the smaller "
            "weight, then the smaller h",
    "loglik": "h at each weight and then the weight by --bandwidth-objective (log-likelihood of the exact argmax "
              "by default; ties: top-1, then the smaller weight)",
}
DEFAULT_HISTORY_WINDOW = 512
REFIT_OCTAVES = (-4, 4)  # the bandwidth grid around the stored-only h, at each history weight


@dataclass(frozen=True)
class HistoryPairs:
    """Every (held-out position, history atom) pair: the position's index, the atom's token, distance."""

    query: np.ndarray
    tokens: np.ndarray
    distances: np.ndarray


def history_pairs(chunks: list[np.ndarray], token_positions: np.ndarray, window: int | None, decay: float,
                  history_window: int) -> HistoryPairs:
    """History atoms of every atom position (t = 0..n-2 of each chunk, indexed like context_keys)."""
    queries, tokens, distances = [], [], []
    offset = 0
    for chunk in chunks:
        prefix = prefix_centroids(np.asarray(token_positions, dtype=np.float64)[chunk], window, decay)
        t = np.arange(len(chunk) - 1)
        m = np.minimum(t, history_window)
        q = np.repeat(t, m)
        back = np.arange(len(q)) - np.repeat(np.cumsum(m) - m, m)  # 0..m_t-1 within each position
        j = q - 1 - back
        queries.append(q + offset)
        tokens.append(chunk[j + 1])
        distances.append(np.linalg.norm(prefix[q] - prefix[j], axis=1))
        offset += len(t)
    if not queries:
        return HistoryPairs(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    return HistoryPairs(np.concatenate(queries).astype(np.int64), np.concatenate(tokens).astype(np.int64),
                        np.concatenate(distances))


@dataclass(frozen=True)
class HistoryChoice:
    """The chosen weight and the record of its final (h, scores); every weight's calibration
    record; one summary row per weight (its point under the criterion); with `top1`, every
    (weight, h) candidate scored."""

    weight: float
    final: dict
    records: list[dict]
    grid: list[dict]
    criterion: str
    candidates: list[dict]


def select_top1(points: list[dict], tolerance: float = TOP1_TOLERANCE) -> dict:
    """The point with the best top-1, where points within `tolerance` of the best top-1 tie and the
    tie goes to the higher log-likelihood, then the smaller history weight, then the smaller h."""
    if not points:
        raise ValueError("no calibration points to choose from")
    best = max(p["top1"] for p in points)
    near = [p for p in points if p["top1"] >= best - tolerance - 1e-12]
    return max(near, key=lambda p: (p["log_likelihood"], -p["history_weight"], -p["h"]))


def candidate_points(records: list[dict], fixed_h: bool) -> list[dict]:
    """Every scored (weight, h) point: each record's bandwidth curve, or its one point when h was given."""
    points = []
    for r in records:
        curve = [r] if fixed_h or not r.get("curve") else r["curve"]
        points += [{"history_weight": float(r["history_weight"]), "h": float(c["h"]), "top1": float(c["top1"]),
                    "log_likelihood": float(c["log_likelihood"])} for c in curve]
    return points


def choose_history_weight(stored: cal.Neighbours, stored_calibration: dict, pairs: HistoryPairs | None,
                          targets: np.ndarray, kernel: str, vocab_size: int, objective: str,
                          grid: tuple[float, ...] = HISTORY_GRID, bandwidth: float | None = None,
                          criterion: str = "loglik", only: float | None = None,
                          advance: Callable[[int], None] | None = None) -> HistoryChoice:
    """Score every weight of `grid` (h re-fitted at each by `objective`, or the given `bandwidth`)
    and keep the best (weight, h) by `criterion` (module docstring); with `only`, that weight is
    kept (the others are scored for the record) and the criterion picks its h. Weight 0 is the
    stored-only calibration; `pairs` may be None when the grid is (0,)."""
    if criterion not in CRITERIA:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    combined = cal.with_history(stored, pairs.query, pairs.tokens, pairs.distances) if any(grid) else stored
    records: list[dict] = []
    for weight in grid:
        if weight == 0:
            record = stored_calibration
        elif bandwidth is not None:
            record = cal.given_bandwidth(combined, {}, targets, bandwidth, kernel, vocab_size, weight)
        else:
            record = cal.calibrate_bandwidth(combined, targets, kernel, vocab_size, objective, weight,
                                             centre=stored_calibration["h"], octaves=REFIT_OCTAVES)
        records.append({**record, "history_weight": float(weight)})
        if advance is not None:
            advance(1)
    allowed = [r for r in records if only is None or r["history_weight"] == only]

    if criterion == "loglik":
        def rank(r: dict) -> tuple[float, float, float]:
            first = r["log_likelihood"] if objective == "log-likelihood" else r["top1"]
            second = r["top1"] if objective == "log-likelihood" else r["log_likelihood"]
            return first, second, -r["history_weight"]

        final = max(allowed, key=rank)
        rows = [{"history_weight": r["history_weight"], "h": r["h"], "top1": r["top1"],
                 "log_likelihood": r["log_likelihood"], "coverage": r["coverage"]} for r in records]
        return HistoryChoice(final["history_weight"], final, records, rows, criterion, [])

    fixed_h = bandwidth is not None
    candidates = candidate_points(records, fixed_h)
    chosen = select_top1([c for c in candidates if only is None or c["history_weight"] == only])
    weight = chosen["history_weight"]
    final = _rescored(next(r for r in records if r["history_weight"] == weight), stored if weight == 0 else combined,
                      targets, chosen["h"], kernel, vocab_size)
    rows = []
    for r in records:
        best = select_top1(candidate_points([r], fixed_h))
        rows.append(best)
    return HistoryChoice(weight, final, records, rows, criterion, candidates)


def _rescored(record: dict, nb: cal.Neighbours, targets: np.ndarray, h: float, kernel: str, vocab_size: int) -> dict:
    """`record` (one weight's calibration) with its scores at the chosen h."""
    s = cal.score(nb, targets, h, kernel, vocab_size, history_weight=record["history_weight"])
    return {**record, "h": float(h), "top1": s.top1, "log_likelihood": s.log_likelihood, "coverage": s.coverage,
            "criterion": "top1", "top1_tolerance": TOP1_TOLERANCE}
