"""The atom store's own next-token distribution and its features, one row per prefix (SQL
store_distribution, sql/090_store.sql): what a gate mixing the store with another model reads.

`StoreStep` is one row; `store_step` is the same arithmetic in NumPy (on hartonomous.kernel) for one
prefix's candidate atoms, the reference the tests hold SQL to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SOURCES = ("stored", "history", "memory")   # a candidate atom's source, as store_step takes it
LSE_CUTOFF = -744.0       # exp() below this exponent counts as 0 (as in SQL and C)
SOFTMAX_CUTOFF = -700.0   # the softmax's cutoff (next_token's)


@dataclass(frozen=True)
class StoreStep:
    """One prefix's p_store (token ids ascending, probabilities summing to 1) and its features;
    with no candidate: empty lists, candidates 0, matched_mass 0, the rest None."""

    prefix_length: int
    token_ids: list[int]
    probabilities: list[float]
    nearest_bandwidths: float | None   # D / bandwidth, D the nearest candidate's distance
    rung: int | None                    # backoff: floor(ln(D / h) / ln decay); None at D ~ 0 or other kernels
    matched_mass: float                 # sum of the counting candidates' w K(d)
    candidates: int                     # candidate atoms that count (backoff: inside the radius)
    top_probability: float | None
    entropy: float | None               # Shannon, nats
    stored_share: float | None          # shares of matched_mass by source, summing to 1
    history_share: float | None
    memory_share: float | None


def store_step(token_ids: Sequence[int], distances: Sequence[float], weights: Sequence[float],
               sources: Sequence[str], kernel: str, bandwidth: float, decay: float | None = None,
               prefix_length: int = 0) -> StoreStep:
    """store_distribution's row from one prefix's candidate atoms (every KNN row and history atom,
    no search radius): their tokens, distances to the centroid, weights and sources ('stored',
    'history' or 'memory'); `decay` is the set's centroid decay (the backoff kernel's ladder)."""
    from hartonomous.kernel import backoff_radius, backoff_tolerance, log_contributions, token_logits

    tokens = np.asarray(token_ids, dtype=np.int64)
    d = np.asarray(distances, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    src = np.asarray(sources, dtype=object)
    if not set(src.tolist()) <= set(SOURCES):
        raise ValueError(f"sources must be among {SOURCES}, got {sorted(set(src.tolist()) - set(SOURCES))}")
    if len(tokens) == 0:
        return StoreStep(prefix_length, [], [], None, None, 0.0, 0, None, None, None, None, None)
    nearest = float(d.min())
    rung = None
    radius = None
    if kernel == "backoff":
        if decay is None:
            raise ValueError("the backoff kernel needs the atom set's centroid decay")
        radius = backoff_radius(nearest, bandwidth, decay)
        if nearest > backoff_tolerance(bandwidth):
            rung = int(np.floor(np.log(nearest / bandwidth) / np.log(decay)))
    c = log_contributions(d, w, kernel, bandwidth, radius=radius)
    counts = np.isfinite(c)
    c, src = c[counts], src[counts]
    top = c.max()
    e = np.where(c - top < LSE_CUTOFF, 0.0, np.exp(c - top))
    total = e.sum()
    lse = top + np.log(total)
    ids, logits = token_logits(tokens, d, w, kernel, bandwidth, decay)
    dz = logits - logits.max()
    p = np.where(dz < SOFTMAX_CUTOFF, 0.0, np.exp(dz))
    p = p / p.sum()
    positive = p[p > 0]
    shares = [float(e[src == s].sum() / total) for s in SOURCES]
    return StoreStep(prefix_length, [int(t) for t in ids], [float(x) for x in p], nearest / bandwidth, rung,
                     0.0 if lse < LSE_CUTOFF else float(np.exp(lse)), int(counts.sum()), float(p.max()),
                     float(-(positive * np.log(positive)).sum()), *shares)
