"""The kernel step of `next_token`: neighbour distances -> per-token logits (NumPy reference).

Each atom a, a stored KNN neighbour or one of the context's own history atoms
(`centroid.history_atoms`, weight history_weight), with weight w_a at distance d_a from the
context centroid contributes
    gaussian:     w_a * exp(-d_a^2 / h^2)   (h = bandwidth; h = 1 is the original exp(-d^2))
    exponential:  w_a * exp(-d_a / h)       (the original's exp(-d) score)
and a token's logit is log(sum of its atoms' contributions), computed with log-sum-exp.
The SQL function computes exactly this; tests compare the two.
"""

from __future__ import annotations

import numpy as np
from scipy.special import logsumexp

KERNELS = ("gaussian", "exponential")


def log_contributions(distances: np.ndarray, weights: np.ndarray | None = None,
                      kernel: str = "gaussian", bandwidth: float = 1.0) -> np.ndarray:
    """log(w_a * K(d_a)) for every atom."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    if not bandwidth > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth}")
    d = np.asarray(distances, dtype=np.float64)
    log_w = np.zeros_like(d) if weights is None else np.log(np.asarray(weights, dtype=np.float64))
    if kernel == "gaussian":
        return log_w - (d / bandwidth) ** 2
    return log_w - d / bandwidth


def token_logits(token_ids: np.ndarray, distances: np.ndarray, weights: np.ndarray | None = None,
                 kernel: str = "gaussian", bandwidth: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(unique token ids ascending, their logits) from the K nearest atoms."""
    token_ids = np.asarray(token_ids)
    contrib = log_contributions(distances, weights, kernel, bandwidth)
    unique, inverse = np.unique(token_ids, return_inverse=True)
    logits = np.array([logsumexp(contrib[inverse == i]) for i in range(len(unique))])
    return unique.astype(np.int64), logits
