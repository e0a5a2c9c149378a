"""The kernel step of `next_token`: neighbour distances -> per-token logits (NumPy reference).

Each atom a, a stored KNN neighbour or one of the context's own history atoms
(`centroid.history_atoms`, weight history_weight), with weight w_a at distance d_a from the
context centroid contributes
    gaussian:     w_a * exp(-d_a^2 / h^2)   (h = bandwidth; h = 1 is the original exp(-d^2))
    exponential:  w_a * exp(-d_a / h)       (the original's exp(-d) score)
    backoff:      w_a if d_a <= R, else nothing, where R = h * decay^j is the smallest radius of
                  the ladder h, h*decay, h*decay^2, ... (j = floor(ln(D / h) / ln decay), any integer)
                  that holds the nearest candidate, at distance D, and never below the tolerance
                  t = min(1e-12 h, 1e-14) (`backoff_tolerance`); D within t counts as 0, and R is
                  then t itself
and a token's logit is log(sum of its atoms' contributions), computed with log-sum-exp.

The backoff kernel is for deep keys (projection/lattice.py): there a key contracts by `decay` per
token back, so the candidates sharing the longest suffix with the context are the nearest, and
they all lie inside one rung of the ladder while shorter matches lie outside it. Counting the
atoms inside that rung is the backoff ∞-gram: the longest match's counts, nothing from shorter
ones. A Gaussian of fixed h instead fixes the match length it counts (docs/fidelity.md).
The tolerance absorbs rounding where it would otherwise decide the cut: a history key that equals
the centroid in exact arithmetic (a context repeating with a period that divides the window) lies at
0 in one implementation and at ~1e-17 in another (SQL keys come from running sums); both are kept.
It is capped at 1e-14 so that it never merges matches the keys can tell apart: on the lattice
(coordinates up to 18, contraction 1/128) a mismatch k tokens back moves the key by at least
~128^-k, 2e-13 at k = 6, well above it; at k = 7 (1.8e-15) the move is at the level of float64
rounding of the keys' coordinates (~4e-15) and cannot be told from a whole-window match anyway.
The SQL function computes exactly this; tests compare the two.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

KERNELS = ("gaussian", "exponential", "backoff")


BACKOFF_TOLERANCE = 1e-12   # relative to the bandwidth, capped at BACKOFF_TOLERANCE_CAP: the same in SQL
BACKOFF_TOLERANCE_CAP = 1e-14   # (ht_backoff_radius) and C (backoff_tolerance)


def backoff_tolerance(bandwidth: float) -> float:
    """t = min(bandwidth * 1e-12, 1e-14): a nearest distance within it counts as 0."""
    return min(bandwidth * BACKOFF_TOLERANCE, BACKOFF_TOLERANCE_CAP)


def backoff_radius(nearest: np.ndarray | float, bandwidth: float, decay: float) -> np.ndarray:
    """R = max(t, bandwidth * decay^floor(ln(D / bandwidth) / ln decay)) for each nearest distance D,
    t = backoff_tolerance(bandwidth); R = t where D <= t (D counts as 0)."""
    if not 0.0 < decay < 1.0:
        raise ValueError(f"the backoff kernel needs a centroid decay in (0, 1), got {decay}")
    d = np.asarray(nearest, dtype=np.float64)
    tolerance = backoff_tolerance(bandwidth)
    away = d > tolerance
    rung = np.floor(np.log(np.where(away, d, bandwidth) / bandwidth) / np.log(decay))
    return np.where(away, np.maximum(tolerance, bandwidth * np.power(decay, rung)), tolerance)


def log_contributions(distances: np.ndarray, weights: np.ndarray | None = None,
                      kernel: str = "gaussian", bandwidth: float = 1.0, *, radius: np.ndarray | float | None = None
                      ) -> np.ndarray:
    """log(w_a * K(d_a)) for every atom; the backoff kernel needs each atom's `radius`
    (backoff_radius of its query's nearest candidate) and gives -inf outside it."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    d = np.asarray(distances, dtype=np.float64)
    log_w = np.zeros_like(d) if weights is None else np.log(np.asarray(weights, dtype=np.float64))
    if kernel == "gaussian":
        return log_w - (d / bandwidth) ** 2
    if kernel == "exponential":
        return log_w - d / bandwidth
    if radius is None:
        raise ValueError("the backoff kernel needs the radius of each atom's query (backoff_radius)")
    return np.where(d <= radius, log_w, -np.inf)


def token_logits(token_ids: np.ndarray, distances: np.ndarray, weights: np.ndarray | None = None,
                 kernel: str = "gaussian", bandwidth: float = 1.0, decay: float | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(unique token ids ascending, their logits) from one query's candidate atoms; tokens whose
    atoms all fall outside the backoff radius are left out."""
    token_ids = np.asarray(token_ids)
    radius = None
    if kernel == "backoff":
        if decay is None:
            raise ValueError("the backoff kernel needs the atom set's centroid decay")
        radius = backoff_radius(np.min(distances) if len(distances) else 0.0, bandwidth, decay)
    contrib = log_contributions(distances, weights, kernel, bandwidth, radius=radius)
    keep = np.isfinite(contrib) | (kernel != "backoff")
    token_ids, contrib = token_ids[keep], contrib[keep]
    unique, inverse = np.unique(token_ids, return_inverse=True)
    logits = np.array([logsumexp(contrib[inverse == i]) for i in range(len(unique))])
    return unique.astype(np.int64), logits
