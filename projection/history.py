"""History atoms of held-out positions, and the history weight chosen on the calibration half.

SQL `next_token` adds the context's own history as atoms (sql/020_next_token.sql, item 4;
hartonomous.centroid.history_atoms is the NumPy definition): for a context of n tokens and
m = min(history_window, n - 1), each prefix of i = n - m .. n - 1 tokens gives an atom at that
prefix's centroid with the token that followed it, weighing `history_weight`. A held-out chunk
position t (context = tokens 0..t, centroid P[t]) therefore has the history atoms
(P[j], chunk[j + 1]) for j = max(0, t - H) .. t - 1, where P are the chunk's prefix centroids.
Those are computed here for all positions at once and join each position's stored KNN atoms
(projection.calibrate.with_history), so the build scores exactly what next_token computes.

The weight is chosen on a grid by the bandwidth objective (held-out log-likelihood of the exact
argmax by default), with the bandwidth re-fitted at every weight: history atoms sit at the
centroids of the text's own earlier contexts, typically closer to the query than the stored
atoms, so the best h moves with the weight, and a fixed h would bias the choice towards 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hartonomous.centroid import prefix_centroids
from projection import calibrate as cal

HISTORY_GRID = (0.0, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)
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
    """The chosen weight, every weight's calibration record (h and scores), and their summary rows."""

    weight: float
    records: list[dict]
    grid: list[dict]


def choose_history_weight(stored: cal.Neighbours, stored_calibration: dict, pairs: HistoryPairs,
                          targets: np.ndarray, kernel: str, vocab_size: int, objective: str,
                          grid: tuple[float, ...] = HISTORY_GRID, bandwidth: float | None = None) -> HistoryChoice:
    """Score every weight of `grid` (h re-fitted at each, or the given `bandwidth`) and keep the
    best by `objective` (ties: the smaller weight). Weight 0 is the stored-only calibration."""
    combined = cal.with_history(stored, pairs.query, pairs.tokens, pairs.distances)
    records: list[tuple[float, dict]] = []
    for weight in grid:
        if weight == 0:
            record = stored_calibration
        elif bandwidth is not None:
            record = cal.given_bandwidth(combined, {}, targets, bandwidth, kernel, vocab_size, weight)
        else:
            record = cal.calibrate_bandwidth(combined, targets, kernel, vocab_size, objective, weight,
                                             centre=stored_calibration["h"], octaves=REFIT_OCTAVES)
        records.append((weight, {**record, "history_weight": weight}))

    def rank(item: tuple[float, dict]) -> tuple[float, float, float]:
        r = item[1]
        first = r["log_likelihood"] if objective == "log-likelihood" else r["top1"]
        second = r["top1"] if objective == "log-likelihood" else r["log_likelihood"]
        return first, second, -item[0]

    weight, _ = max(records, key=rank)
    rows = [{"history_weight": w, "h": r["h"], "top1": r["top1"], "log_likelihood": r["log_likelihood"],
             "coverage": r["coverage"]} for w, r in records]
    return HistoryChoice(float(weight), [r for _, r in records], rows)
