"""Distributions from the database: the spatial path, and full-dimensional KNN on atom keys."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import psycopg

from hartonomous import sqlcalls
from hartonomous.compare.knn import vector_literal
from hartonomous.compare.metrics import Sparse
from hartonomous.generation_config import SamplerArgs
from hartonomous.sqlcalls import SpatialArgs

# The model's own distribution: T = 1, top-k and top-p off, no repetition penalty.
FULL_DISTRIBUTION = SamplerArgs(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)

# Ties are common (a soft-labelled position's k atoms share one key), so atom_id breaks them: without
# it the K-th neighbour depended on the scan order (a parallel scan's), and two identical sets scored
# differently.
KNN_KEYS = (
    "SELECT token_id, weight, key <-> %s::vector AS distance FROM atoms "
    "WHERE atom_set_id = %s AND key IS NOT NULL ORDER BY key <-> %s::vector, atom_id LIMIT %s"
)


def spatial_distribution(conn: psycopg.Connection, context: Sequence[int], atom_set: str,
                         max_neighbors: int = 100, history_weight: float | None = None,
                         memory: bool = False) -> Sparse:
    """next_token's full candidate distribution (top-k and top-p off, T = 1).

    history_weight None: the atom set's calibrated weight of the history atoms; 0: none.
    memory: the set's memory of past generations is read too (compare --memory; off by default).
    """
    args = SpatialArgs(max_neighbors=max_neighbors, history_weight=history_weight)
    rows = sqlcalls.next_token(conn, context, FULL_DISTRIBUTION, args, atom_set, memory=memory)
    if not rows:
        return Sparse.empty()
    arr = np.asarray(rows, dtype=np.float64)
    return Sparse(arr[:, 0].astype(np.int64), arr[:, 1])


def knn_distribution(conn: psycopg.Connection, query: np.ndarray, atom_set_id: int, k: int = 100,
                     bandwidth: float | None = None) -> tuple[Sparse, float]:
    """Exact KNN (pgvector, L2) on the atoms' full-dimensional keys, Gaussian kernel per token.

    Each neighbour a votes w_a * exp(-(d_a / h)^2) for its token; h is `bandwidth`, or the
    median distance of the K neighbours when None (a per-query scale: full-dimensional
    distances have no fixed unit). Returns the distribution and the h used. One full scan of the
    set's keys per call: compare scores through baselines.KeyKnn (compare.knn), which returns the same.
    """
    literal = vector_literal(query)
    rows = conn.execute(KNN_KEYS, (literal, atom_set_id, literal, k), prepare=True).fetchall()
    return knn_kernel(rows, bandwidth)


def knn_kernel(rows: Sequence[tuple], bandwidth: float | None = None) -> tuple[Sparse, float]:
    """knn_distribution's vote over (token_id, weight, distance) rows of the K neighbours."""
    if not rows:
        return Sparse.empty(), float("nan")
    arr = np.asarray(rows, dtype=np.float64)
    tokens, weights, dist = arr[:, 0].astype(np.int64), arr[:, 1], arr[:, 2]
    h = float(bandwidth) if bandwidth else float(np.median(dist))
    if not h > 0:
        h = 1.0  # every neighbour at distance 0: all kernels are 1
    log_votes = np.log(weights) - (dist / h) ** 2
    log_votes -= log_votes.max()
    ids, inverse = np.unique(tokens, return_inverse=True)
    mass = np.bincount(inverse, weights=np.exp(log_votes))
    return Sparse(ids, mass / mass.sum()), h
