"""The context centroid: the one Python definition of `context_centroid` in SQL.

A context of n tokens with 3D positions p_0..p_{n-1} (oldest first) has centroid
    c = sum_k w_k p_{n-1-k} / sum_k w_k,   w_k = decay**k for k < window, else 0,
where k counts steps back from the newest token (k = 0 is the last token). `window=None`
means every token counts (the original clr_ComputeCentroid); `decay=1` means uniform weights.
The SQL function is tested against this module, and context atoms are keyed with it.
"""

from __future__ import annotations

import numpy as np


def validate(window: int | None, decay: float) -> None:
    if window is not None and window < 1:
        raise ValueError(f"window must be >= 1 or None (all tokens), got {window}")
    if not (0.0 < decay <= 1.0):
        raise ValueError(f"decay must be in (0, 1], got {decay}")


def centroid_weights(n: int, window: int | None = None, decay: float = 1.0) -> np.ndarray:
    """Weight of each of n context tokens, oldest first."""
    validate(window, decay)
    steps_back = np.arange(n - 1, -1, -1, dtype=np.float64)
    weights = decay ** steps_back
    if window is not None:
        weights[steps_back >= window] = 0.0
    return weights


def context_centroid(positions: np.ndarray, window: int | None = None, decay: float = 1.0) -> np.ndarray:
    """Weighted mean of the context tokens' positions (rows of `positions`, oldest first)."""
    positions = np.asarray(positions, dtype=np.float64)
    if positions.ndim != 2 or positions.shape[0] == 0:
        raise ValueError("positions must be a non-empty (n, dim) array")
    weights = centroid_weights(positions.shape[0], window, decay)
    return weights @ positions / weights.sum()


def prefix_centroids(positions: np.ndarray, window: int | None = None, decay: float = 1.0) -> np.ndarray:
    """Row t is the centroid of the context positions[: t + 1]; O(T) for a whole sequence."""
    from scipy.signal import lfilter  # heavy import; only builds need it

    validate(window, decay)
    positions = np.asarray(positions, dtype=np.float64)
    T = positions.shape[0]
    if T == 0:
        return positions.copy()
    b = np.zeros(1 if window is None or window >= T else window + 1)
    b[0] = 1.0
    if window is not None and window < T:
        b[window] = -(decay ** window)
    a = np.array([1.0, -decay])
    sums = lfilter(b, a, positions, axis=0)
    norm = lfilter(b, a, np.ones(T))
    return sums / norm[:, None]

