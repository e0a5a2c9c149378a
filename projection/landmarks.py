"""Seeded landmark selection over the rows of an embedding matrix.

- `kmeans++`: D² sampling (Arthur & Vassilvitskii 2007): each new landmark is drawn with
  probability proportional to its squared distance from the nearest landmark so far. Spread
  out, but not dominated by the few most extreme rows. The default.
- `fps`: farthest-point sampling (the row farthest from every landmark so far; deterministic
  after the seeded first pick). Covers the hull; tends to pick outliers.
- `random`: uniform without replacement.
"""

from __future__ import annotations

import numpy as np

from hartonomous.errors import UserError

METHODS = ("kmeans++", "fps", "random")


def squared_distances(x: np.ndarray, centers: np.ndarray) -> np.ndarray:
    """(n, m) squared Euclidean distances, clamped at 0, computed in float64."""
    x = np.asarray(x, dtype=np.float64)
    centers = np.asarray(centers, dtype=np.float64)
    d2 = (x * x).sum(1)[:, None] - 2.0 * x @ centers.T + (centers * centers).sum(1)[None, :]
    return np.maximum(d2, 0.0)


def select_landmarks(x: np.ndarray, count: int, method: str = "kmeans++", seed: int = 0) -> np.ndarray:
    """Row indices of `count` distinct landmarks of `x`, reproducible for a given seed."""
    n = len(x)
    if method not in METHODS:
        raise UserError(f"landmark method must be one of {', '.join(METHODS)}, got '{method}'")
    if not 1 <= count <= n:
        raise UserError(f"--landmarks must be between 1 and the number of vectors ({n}), got {count}")
    rng = np.random.default_rng(seed)
    if method == "random":
        return np.sort(rng.choice(n, size=count, replace=False))
    x = np.asarray(x, dtype=np.float32)
    norms = (x.astype(np.float64) ** 2).sum(1)
    chosen = [int(rng.integers(n))]
    nearest = _sq_dist_to(x, norms, chosen[0])
    nearest[chosen[0]] = 0.0
    for _ in range(count - 1):
        if method == "fps":
            pick = int(np.argmax(nearest))
        else:
            total = nearest.sum()
            if total <= 0:  # every row coincides with a landmark already
                break
            pick = int(np.searchsorted(np.cumsum(nearest), rng.random() * total, side="right"))
            pick = min(pick, n - 1)
        if nearest[pick] <= 0:
            break
        chosen.append(pick)
        nearest = np.minimum(nearest, _sq_dist_to(x, norms, pick))
        nearest[pick] = 0.0
    if len(chosen) < count:
        raise UserError(f"only {len(chosen)} distinct vectors are available; use --landmarks {len(chosen)} or fewer")
    return np.array(chosen, dtype=np.int64)


def _sq_dist_to(x: np.ndarray, norms: np.ndarray, i: int) -> np.ndarray:
    dots = (x @ x[i]).astype(np.float64)
    return np.maximum(norms - 2.0 * dots + norms[i], 0.0)
