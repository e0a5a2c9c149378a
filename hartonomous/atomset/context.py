"""Context atoms of chunks of text (key = context centroid, value = the next token) and merging.

Shared by the offline build (projection/atoms.py, which re-exports them) and the runtime's index
updates (hartonomous/repository/chunking.py), so that a file's atoms are computed by one
implementation whether a set is built whole or updated file by file. A context atom for position
t of a chunk (t = 0 .. n-2) has key = the centroid of the chunk's tokens 0..t, exactly as SQL
`context_centroid` computes it (hartonomous.centroid); value = the exact model's argmax after token
t (`target='argmax'`) or the corpus's own token t+1 (`target='corpus'`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hartonomous.atomset.write import AtomRows
from hartonomous.centroid import prefix_centroids
from hartonomous.errors import UserError

TARGETS = ("argmax", "corpus")  # one atom per position; 'soft' (top-k atoms) is projection.atoms.soft_context_atoms


def context_keys(chunks: list[np.ndarray], token_vectors: np.ndarray, window: int | None,
                 decay: float, dtype=np.float64, advance: Callable[[int], None] | None = None) -> np.ndarray:
    """Centroid keys of every atom position (t = 0..n-2 of each chunk), stacked; `advance(1)` after each chunk."""
    parts = []
    for c in chunks:
        parts.append(prefix_centroids(token_vectors[c], window, decay)[:-1].astype(dtype, copy=False))
        if advance is not None:
            advance(1)
    return np.concatenate(parts) if parts else np.zeros((0, token_vectors.shape[1]), dtype=dtype)


def context_values(chunks: list[np.ndarray], argmax: list[np.ndarray] | None, target: str) -> np.ndarray:
    """The value (next token) of every atom position, stacked like `context_keys`."""
    if target not in TARGETS:
        raise UserError(f"--target must be one of {', '.join(TARGETS)}, got '{target}'")
    if target == "corpus":
        return np.concatenate([c[1:] for c in chunks]).astype(np.int64)
    if argmax is None:
        raise UserError("--target argmax needs the exact model's argmax labels")
    return np.concatenate([a[:-1] for a in argmax]).astype(np.int64)


def context_atoms(chunks: list[np.ndarray], argmax: list[np.ndarray] | None, token_positions: np.ndarray,
                  window: int | None, decay: float, target: str = "argmax",
                  token_embeddings: np.ndarray | None = None, advance: Callable[[int], None] | None = None) -> AtomRows:
    """Context atoms of every chunk; full-dimensional keys too when token_embeddings is given."""
    values = context_values(chunks, argmax, target)
    keys = context_keys(chunks, np.asarray(token_positions, dtype=np.float64), window, decay, advance=advance)
    full = None
    if token_embeddings is not None:
        full = context_keys(chunks, np.asarray(token_embeddings), window, decay, np.float32)
    return AtomRows(values, keys, None, full)


def merge_atoms(atoms: AtomRows, radius: float) -> AtomRows:
    """Merge atoms of the same token whose 3D keys share a grid cube of diagonal `radius`.

    radius 0 merges exact duplicates only (lossless for the kernel sum: one atom of weight w
    at a point scores like w atoms there). A merged atom sits at the weighted mean of its
    members, with their summed weight (and the weighted mean of their full keys); its source is
    the source that holds most of that weight (ties: the lower code, the corpus's).
    """
    if radius < 0 or not np.isfinite(radius):
        raise UserError(f"--merge-radius must be >= 0, got {radius}")
    pos = np.asarray(atoms.positions, dtype=np.float64)
    weights = np.ones(len(pos)) if atoms.weights is None else np.asarray(atoms.weights, dtype=np.float64)
    if radius == 0:
        cells = pos
    else:
        cells = np.floor((pos - pos.min(axis=0)) / (radius / np.sqrt(3.0)))
    keys = np.column_stack([np.asarray(atoms.token_ids, dtype=np.float64), cells])
    _, first, group, counts = np.unique(keys, axis=0, return_index=True, return_inverse=True,
                                        return_counts=True)
    group = group.reshape(-1)
    if len(counts) == len(pos):
        return atoms
    total = np.bincount(group, weights=weights)
    merged_pos = np.column_stack([np.bincount(group, weights=weights * pos[:, j]) for j in range(3)]) / total[:, None]
    if radius == 0:  # keep the exact coordinates (a mean of equal floats may round)
        merged_pos = pos[first]
    tokens = np.asarray(atoms.token_ids, dtype=np.int64)[first]
    sources = None
    if atoms.sources is not None:       # the source holding most of each merged atom's weight
        codes = np.asarray(atoms.sources, dtype=np.int64)
        kinds = int(codes.max()) + 1
        by_source = np.bincount(group * kinds + codes, weights=weights, minlength=len(counts) * kinds)
        sources = by_source.reshape(len(counts), kinds).argmax(axis=1).astype(np.int16)   # ties: the lower code
    full = None
    if atoms.keys is not None:
        order = np.argsort(group, kind="stable")
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        full = np.empty((len(counts), atoms.keys.shape[1]), dtype=np.float32)
        for lo in range(0, atoms.keys.shape[1], 64):  # column blocks bound the float64 temporaries
            block = np.asarray(atoms.keys[order, lo:lo + 64], dtype=np.float64) * weights[order, None]
            full[:, lo:lo + 64] = np.add.reduceat(block, starts, axis=0) / total[:, None]
    return AtomRows(tokens, merged_pos, total, full, sources)
