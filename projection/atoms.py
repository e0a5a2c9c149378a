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
scores exactly like the separate atoms (the kernel sum is linear in the weights). The context atoms
and merging live in hartonomous.atomset.context (the runtime's index updates use them too).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hartonomous.atomset import AtomRows
from hartonomous.atomset.context import (TARGETS, context_atoms, context_keys, context_values,  # noqa: F401
                                         merge_atoms)
from hartonomous.atomset.write import CORPUS, SELF_DISTILLED


def token_atoms(positions: np.ndarray, embeddings: np.ndarray | None = None) -> AtomRows:
    """One atom per vocabulary token at its own position (the original design)."""
    n = len(positions)
    return AtomRows(np.arange(n, dtype=np.int64), np.asarray(positions, dtype=np.float64),
                    None, None if embeddings is None else np.asarray(embeddings, dtype=np.float32))


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


