"""Z-order (Morton) sort of 3D points, so the GiST index is built over spatially local pages."""

from __future__ import annotations

import numpy as np


def _spread(v: np.ndarray) -> np.ndarray:
    """Spread the low 21 bits of v so two zero bits separate each."""
    v = v.astype(np.uint64) & np.uint64(0x1FFFFF)
    v = (v | (v << np.uint64(32))) & np.uint64(0x1F00000000FFFF)
    v = (v | (v << np.uint64(16))) & np.uint64(0x1F0000FF0000FF)
    v = (v | (v << np.uint64(8))) & np.uint64(0x100F00F00F00F00F)
    v = (v | (v << np.uint64(4))) & np.uint64(0x10C30C30C30C30C3)
    v = (v | (v << np.uint64(2))) & np.uint64(0x1249249249249249)
    return v


def morton_codes(points: np.ndarray) -> np.ndarray:
    points = np.asarray(points, dtype=np.float64)
    lo, hi = points.min(axis=0), points.max(axis=0)
    scale = np.where(hi > lo, (2**21 - 1) / np.where(hi > lo, hi - lo, 1.0), 0.0)
    q = ((points - lo) * scale).astype(np.uint64)
    return _spread(q[:, 0]) | (_spread(q[:, 1]) << np.uint64(1)) | (_spread(q[:, 2]) << np.uint64(2))


def morton_order(points: np.ndarray) -> np.ndarray:
    """Indices that sort `points` along the Z-order curve."""
    if len(points) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.argsort(morton_codes(points), kind="stable")
