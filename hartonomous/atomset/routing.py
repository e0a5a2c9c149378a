"""Routing keys: which lattice cell an atom lies in, so a Citus cluster can keep a cell on one shard.

On a lattice set (projection/lattice.py) every token sits on an integer cell and a key is the
decayed mean of the window's token positions, so a key lies within `spread` = decay x (the widest
axis range of the token positions) of its last token's cell on each axis. With spread < 1/2 the
cell is the key's rounded coordinates, and an atom of another cell is provably at least
1 - spread - (the centre's own offset from its cell) away from any centre: sql/015_knn.sql uses
that to answer a KNN from one cell where the answer is provably whole (docs/scale-out.md).

`atoms.route` is the cell's code (`ht_route_cell` in SQL computes the same) on such a set, and the
atom's id elsewhere (spread evenly over the shards). One home for the rule on the Python side.
"""

from __future__ import annotations

import numpy as np

OFFSET = 1 << 20          # each rounded coordinate + OFFSET fits in 21 bits
MAX_SPREAD = 0.5
# Keys are sums of weighted positions, so they sit within route_spread of their cell only up to
# rounding (~1e-14); this much is allowed, well inside the 1e-9 the routed KNN keeps to spare.
ROUNDING = 1e-12


def route_spread(token_positions: np.ndarray, centroid_decay: float, centroid_window: int | None) -> float | None:
    """decay x the widest axis range of the token positions, where every position is an integer
    cell and that is below 1/2; None where keys cannot be proven to stay in their cells."""
    positions = np.asarray(token_positions, dtype=np.float64)
    if centroid_window is None or len(positions) == 0 or not np.all(np.isfinite(positions)):
        return None
    if not np.array_equal(positions, np.rint(positions)) or np.abs(positions).max() >= OFFSET - 1:
        return None
    spread = float(centroid_decay * (positions.max(axis=0) - positions.min(axis=0)).max())
    return spread if 0.0 < spread < MAX_SPREAD else None


def route_cells(positions: np.ndarray) -> np.ndarray:
    """The cell code of each point (int64): rounded coordinates (half to even, as PostgreSQL's
    round(float8)) packed 21 bits each; ht_route_cell in SQL."""
    cells = np.rint(np.asarray(positions, dtype=np.float64)).astype(np.int64) + OFFSET
    return (cells[:, 0] << 42) + (cells[:, 1] << 21) + cells[:, 2]


def atom_routes(positions: np.ndarray, spread: float | None) -> np.ndarray | None:
    """The atoms' cell codes where every atom lies within `spread` of its cell's centre on each
    axis; None otherwise (no spread, or atoms that are not the set's keys): the set does not route."""
    if spread is None:
        return None
    positions = np.asarray(positions, dtype=np.float64)
    if len(positions) and np.abs(positions - np.rint(positions)).max() > spread + ROUNDING:
        return None
    return route_cells(positions)
