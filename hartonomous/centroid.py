"""The context centroid: the one Python definition of `context_centroid` in SQL.

A context of n tokens with 3D positions p_0..p_{n-1} (oldest first) has centroid
    c = sum_k w_k p_{n-1-k} / sum_k w_k,   w_k = decay**k for k < window, else 0,
where k counts steps back from the newest token (k = 0 is the last token). `window=None`
means every token counts (the original clr_ComputeCentroid); `decay=1` means uniform weights.
The SQL function is tested against this module, and context atoms are keyed with it, stored ones
(`prefix_centroids`) and the history atoms `next_token` makes from the context itself
(`history_atoms`).
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


HISTORY_WINDOW_MAX = 4096   # the bound of next_token's history_window (SQL and atom_sets)


def validate_history(weight: float | None, window: int | None) -> None:
    """The checks SQL next_token makes on history_weight / history_window (None = the set's)."""
    if weight is not None and not (np.isfinite(weight) and weight >= 0):
        raise ValueError(f"history_weight must be a finite number >= 0, got {weight}")
    if window is not None and not 0 <= window <= HISTORY_WINDOW_MAX:
        raise ValueError(f"history_window must be between 0 and {HISTORY_WINDOW_MAX}, got {window}")


def history_atoms(context: list[int] | np.ndarray, positions: np.ndarray, window: int | None = None,
                  decay: float = 1.0, history_window: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """(keys, token ids) of the context's own history atoms, as SQL next_token makes them.

    `positions` holds the context tokens' positions (rows, oldest first). With n tokens and
    m = min(history_window, n - 1), prefix i = n - m .. n - 1 gives an atom keyed at the centroid
    of the first i tokens, whose token is the one that followed it, context[i] (0-based). Keys
    come oldest first; only the last m + window tokens are read when the window is finite.
    """
    validate_history(None, history_window)
    context = np.asarray(context)
    positions = np.asarray(positions, dtype=np.float64)
    n = len(context)
    if positions.shape[0] != n:
        raise ValueError(f"positions has {positions.shape[0]} rows for a context of {n} tokens")
    m = min(history_window, n - 1)
    if m <= 0:
        return np.empty((0, positions.shape[1])), np.empty(0, dtype=np.int64)
    start = 0 if window is None else max(0, n - m - window)
    keys = prefix_centroids(positions[start:n - 1], window, decay)[n - m - 1 - start:]
    return keys, context[n - m:].astype(np.int64)


DIRECT_WINDOW = 64   # windows up to this long are summed directly (as the native kernel does)


def direct_prefix_centroids(positions: np.ndarray, window: int, decay: float) -> np.ndarray:
    """prefix_centroids for a finite window by direct sums, the oldest element first, with weights
    decay**k (0 where k ln decay < -300): the native kernel's arithmetic (ext/hartonomous_kernel,
    centroid_direct), so a key computed here and one computed there are the same bits. O(T W)."""
    positions = np.asarray(positions, dtype=np.float64)
    T = positions.shape[0]
    sums = np.zeros_like(positions)
    norm = np.zeros(T)
    ln_decay = float(np.log(decay)) if decay != 1.0 else 0.0
    for k in range(min(window, T) - 1, -1, -1):          # oldest first: k steps back from the newest
        w = 1.0 if decay == 1.0 else (0.0 if k * ln_decay < -300.0 else decay ** k)
        sums[k:] += w * positions[:T - k]
        norm[k:] += w
    return sums / norm[:, None]


def prefix_centroids(positions: np.ndarray, window: int | None = None, decay: float = 1.0) -> np.ndarray:
    """Row t is the centroid of the context positions[: t + 1]; O(T) for a whole sequence (direct
    sums for windows of at most DIRECT_WINDOW tokens, bit for bit the native kernel's keys)."""
    validate(window, decay)
    positions = np.asarray(positions, dtype=np.float64)
    T = positions.shape[0]
    if T == 0:
        return positions.copy()
    if window is not None and window <= DIRECT_WINDOW:
        return direct_prefix_centroids(positions, window, decay)
    from scipy.signal import lfilter  # heavy import (seconds on a busy machine): only where the filter runs
    b = np.zeros(1 if window is None or window >= T else window + 1)
    b[0] = 1.0
    if window is not None and window < T:
        b[window] = -(decay ** window)
    a = np.array([1.0, -decay])
    sums = lfilter(b, a, positions, axis=0)
    norm = lfilter(b, a, np.ones(T))
    return sums / norm[:, None]

