"""Token atoms and context atoms (key = context centroid, value = next token), and merging.

A context atom for position t of a chunk (t = 0 .. n-2) has
    key   = the centroid of the chunk's tokens 0..t, exactly as SQL `context_centroid`
            computes it (hartonomous.centroid, the atom set's window and decay);
    value = the exact model's argmax after token t (`target='argmax'`), or the corpus's own
            token t+1 (`target='corpus'`).
Soft distillation (`target='soft'`, soft_context_atoms) keeps the exact model's top-k next
tokens at each key instead, one atom each, weighing its probability p: the kernel sum then
votes with the model's distribution rather than its argmax. `target='mixed'` (projection/stages.py)
is soft atoms on the first chunks and corpus atoms on the rest (concat_atoms), merged together. Identical (key, token) pairs are
merged by merge_atoms like any others: one atom whose weight is the SUM of their weights, which
scores exactly like the separate atoms (the kernel sum is linear in the weights).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hartonomous.centroid import prefix_centroids
from hartonomous.errors import UserError
from hartonomous.atomset import AtomRows
from hartonomous.atomset.write import CORPUS, SELF_DISTILLED

TARGETS = ("argmax", "corpus")  # one atom per position; 'soft' (top-k atoms) is soft_context_atoms


def token_atoms(positions: np.ndarray, embeddings: np.ndarray | None = None) -> AtomRows:
    """One atom per vocabulary token at its own position (the original design)."""
    n = len(positions)
    return AtomRows(np.arange(n, dtype=np.int64), np.asarray(positions, dtype=np.float64),
                    None, None if embeddings is None else np.asarray(embeddings, dtype=np.float32))


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


def continuation_atoms(sequences: list[np.ndarray], prompt_tokens: int, token_positions: np.ndarray,
                       window: int | None, decay: float, token_embeddings: np.ndarray | None = None,
                       advance: Callable[[int], None] | None = None) -> AtomRows:
    """Corpus-labelled atoms of prompt + continuation sequences at the continuation's positions only
    (t >= prompt_tokens - 1: the atoms whose next token the model wrote; hartonomous/corpus/self_distill.py)."""
    rows = context_atoms(sequences, None, token_positions, window, decay, "corpus", token_embeddings, advance)
    keep = np.concatenate([np.arange(len(s) - 1) >= prompt_tokens - 1 for s in sequences])
    return AtomRows(rows.token_ids[keep], rows.positions[keep], None, None if rows.keys is None else rows.keys[keep],
                    np.full(int(keep.sum()), SELF_DISTILLED, dtype=np.int16))


def soft_context_atoms(chunks: list[np.ndarray], top_ids: list[np.ndarray], top_probs: list[np.ndarray],
                       token_positions: np.ndarray, window: int | None, decay: float,
                       token_embeddings: np.ndarray | None = None,
                       advance: Callable[[int], None] | None = None) -> AtomRows:
    """k atoms per position t = 0..n-2 of each chunk, all at its context centroid: the exact
    model's top-k next tokens after token t, each weighing its probability (probabilities that
    underflow to 0 are left out: atom weights are > 0)."""
    ids = np.concatenate([i[:-1] for i in top_ids]).astype(np.int64)
    probs = np.concatenate([p[:-1] for p in top_probs]).astype(np.float64)
    if ids.shape != probs.shape or ids.ndim != 2:
        raise ValueError("top_ids and top_probs must be (n, k) arrays of the same shape per chunk")
    k = ids.shape[1]
    keep = (probs > 0).ravel()
    keys = np.repeat(context_keys(chunks, np.asarray(token_positions, dtype=np.float64), window, decay,
                                  advance=advance), k, axis=0)
    full = None
    if token_embeddings is not None:
        full = np.repeat(context_keys(chunks, np.asarray(token_embeddings), window, decay, np.float32), k,
                         axis=0)[keep]
    return AtomRows(ids.ravel()[keep], keys[keep], probs.ravel()[keep], full)


def concat_atoms(parts: list[AtomRows]) -> AtomRows:
    """One AtomRows of several (weights 1 where a part has none; full keys only if every part has them;
    sources the corpus's where a part has none, and none at all when no part has any)."""
    weights = [np.ones(len(p.token_ids)) if p.weights is None else np.asarray(p.weights, dtype=np.float64)
               for p in parts]
    keys = None if any(p.keys is None for p in parts) else np.concatenate([p.keys for p in parts])
    sources = None
    if any(p.sources is not None for p in parts):
        sources = np.concatenate([np.full(len(p.token_ids), CORPUS, dtype=np.int16) if p.sources is None
                                  else np.asarray(p.sources, dtype=np.int16) for p in parts])
    return AtomRows(np.concatenate([p.token_ids for p in parts]).astype(np.int64),
                    np.concatenate([p.positions for p in parts]), np.concatenate(weights), keys, sources)


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
