"""NumPy/torch reference of SQL next_token: centroid.py + brute-force KNN + history atoms +
kernel.py + sampling.py.

Used by tests/test_sql_next_token.py; `near_a_boundary` tells when float rounding may legitimately
decide a tie or a cut differently in two implementations, so random tests can skip those cases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from hartonomous import centroid, kernel
from hartonomous.sampling import next_token_rows, process_logits

EPS = 1e-9


@dataclass
class AtomSetData:
    """The arrays a hand-made atom set was written from."""

    name: str
    token_positions: np.ndarray
    atom_tokens: np.ndarray
    atom_positions: np.ndarray
    atom_weights: np.ndarray
    kernel: str = "gaussian"
    bandwidth: float = 1.0
    window: int | None = None
    decay: float = 1.0
    history_weight: float = 0.0      # the atom set's own (atom_sets.history_weight)
    history_window: int = 512
    atom_sources: np.ndarray | None = None   # atoms.source codes (None: every atom the corpus's)

    @property
    def vocab_size(self) -> int:
        return len(self.token_positions)


@dataclass
class Candidates:
    """The atoms next_token scores for one context: stored KNN neighbours, then history atoms."""

    tokens: np.ndarray
    distances: np.ndarray
    weights: np.ndarray
    history: np.ndarray          # True for history atoms
    nearest_stored: float        # distance to the nearest stored atom (before search_radius)
    near: bool                   # a KNN or radius cut within EPS of a distance
    index: np.ndarray | None = None   # each candidate's row in the set's atom arrays; -1 for history atoms


def reference_candidates(s: AtomSetData, context: list[int], search_radius: float | None, max_neighbors: int,
                         history_weight: float | None = None, history_window: int | None = None) -> Candidates:
    """next_token items 2-4: centroid, brute-force KNN, history atoms, search_radius.

    history_weight / history_window None mean the set's own, as NULL does in SQL. max_neighbors
    limits the stored atoms only; search_radius applies to stored and history atoms alike.
    """
    positions = s.token_positions[context]
    c = centroid.context_centroid(positions, s.window, s.decay)
    d = np.sqrt(((s.atom_positions - c) ** 2).sum(axis=1))
    order = np.argsort(d, kind="stable")
    ds = d[order]
    near = bool(max_neighbors < len(ds) and ds[max_neighbors] - ds[max_neighbors - 1] < EPS)
    nearest = order[:max_neighbors]
    tokens, dist, weights = s.atom_tokens[nearest], d[nearest], s.atom_weights[nearest]
    index = np.asarray(nearest, dtype=np.int64)
    history = np.zeros(len(tokens), dtype=bool)
    weight = s.history_weight if history_weight is None else history_weight
    window = s.history_window if history_window is None else history_window
    if weight > 0:
        keys, key_tokens = centroid.history_atoms(context, positions, s.window, s.decay, window)
        tokens = np.concatenate([tokens, key_tokens])
        dist = np.concatenate([dist, np.sqrt(((keys - c) ** 2).sum(axis=1))])
        weights = np.concatenate([weights, np.full(len(keys), float(weight))])
        history = np.concatenate([history, np.ones(len(keys), dtype=bool)])
        index = np.concatenate([index, np.full(len(keys), -1, dtype=np.int64)])
    if search_radius is not None:
        near |= bool(np.any(np.abs(dist - search_radius) < EPS))
        keep = dist <= search_radius
        tokens, dist, weights, history, index = tokens[keep], dist[keep], weights[keep], history[keep], index[keep]
    return Candidates(tokens, dist, weights, history, float(ds[0]), near, index)


def reference_rows(s: AtomSetData, context: list[int], temperature: float, top_k: int | None,
                   top_p: float | None, search_radius: float | None, max_neighbors: int,
                   repetition_penalty: float, history_weight: float | None = None,
                   history_window: int | None = None) -> tuple[list[tuple[int, float, float]], bool]:
    """(next_token's rows, whether the case sits within EPS of a decision boundary)."""
    cand = reference_candidates(s, context, search_radius, max_neighbors, history_weight, history_window)
    near = cand.near or backoff_cut_is_close(s, cand)
    if len(cand.tokens) == 0:
        return [], near
    ids, logits = kernel.token_logits(cand.tokens, cand.distances, cand.weights, s.kernel, s.bandwidth, s.decay)
    dense = torch.full((s.vocab_size,), -math.inf, dtype=torch.float64)
    dense[torch.as_tensor(ids)] = torch.as_tensor(logits)
    args = dict(temperature=temperature, top_k=top_k, top_p=top_p, repetition_penalty=repetition_penalty)
    near |= near_a_boundary(dense, context, **args)
    return next_token_rows(dense, context, **args), near


def backoff_cut_is_close(s: AtomSetData, cand: Candidates) -> bool:
    """The backoff kernel keeps the candidates within its radius R: a cut within EPS of a distance
    is rounding's to decide. History atoms count even at |d - R| = 0: SQL computes their keys by
    running sums, which agree with the centroid to rounding, not bit for bit (sql/010), so a history
    key that equals the context's centroid in exact arithmetic (a context repeating with a period
    that divides the window) may lie at 0 here and at 1e-17 there. Candidates well within the
    tolerance (kernel.backoff_tolerance) count as 0 in every implementation and are not close."""
    if s.kernel != "backoff" or len(cand.distances) == 0:
        return False
    gap = np.abs(cand.distances - kernel.backoff_radius(cand.distances.min(), s.bandwidth, s.decay))
    counted_as_zero = cand.distances <= kernel.backoff_tolerance(s.bandwidth) / 2   # kept everywhere
    return bool(np.any((gap < EPS) & ~counted_as_zero & (cand.history | (gap > 0))))


def near_a_boundary(logits: torch.Tensor, context: list[int], *, temperature: float, top_k: int | None,
                    top_p: float | None, repetition_penalty: float) -> bool:
    """Processed logits within EPS of each other, or a top-p 'mass before' within EPS of p."""
    t = temperature if temperature > 0 else 1.0
    z = process_logits(logits, context, temperature=t, repetition_penalty=repetition_penalty)
    finite = torch.sort(z[torch.isfinite(z)]).values
    if torch.any(finite[1:] - finite[:-1] < EPS):
        return True
    if temperature == 0 or top_p is None or top_p >= 1:
        return False
    after_k = process_logits(logits, context, temperature=t, top_k=top_k,
                             repetition_penalty=repetition_penalty)
    probs = torch.sort(torch.softmax(after_k, -1), descending=True).values
    before = torch.cumsum(probs, 0) - probs
    return bool(torch.any((before - top_p).abs() < EPS))
