"""Per-position fidelity metrics between the exact distribution and a sparse approximation.

The exact distribution is a dense probability vector over the whole vocabulary (softmax of
the model's logits at T = 1; every entry is > 0). An approximation (the spatial path or a
baseline) is sparse: the token ids it returned and their probabilities; every other token
has probability 0. All logarithms are natural (nats). Ties are broken as `next_token` orders
its rows: by probability descending, then token id ascending.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SMOOTHING_EPSILON = 1e-3
"""Spatial perplexity uses p' = (1 - eps) * p + eps / V, so tokens outside the candidate set
get eps / V instead of 0 (which would make the perplexity infinite)."""

PEARSON_NUCLEUS = 0.99
"""The exact distribution's support for Pearson: its smallest top set with >= 99% of the mass."""

TOP_K_OVERLAP = 10


@dataclass(frozen=True)
class Sparse:
    """A sparse distribution: token ids and their probabilities (zero elsewhere)."""

    ids: np.ndarray
    probs: np.ndarray

    @classmethod
    def of(cls, ids, probs) -> "Sparse":
        ids = np.asarray(ids, dtype=np.int64)
        probs = np.asarray(probs, dtype=np.float64)
        if ids.shape != probs.shape or ids.ndim != 1:
            raise ValueError("ids and probs must be 1-D arrays of the same length")
        if len(np.unique(ids)) != len(ids):
            raise ValueError("token ids in a sparse distribution must be unique")
        return cls(ids, probs)

    @classmethod
    def empty(cls) -> "Sparse":
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0))

    def __len__(self) -> int:
        return len(self.ids)

    def dense(self, vocab_size: int) -> np.ndarray:
        out = np.zeros(vocab_size)
        out[self.ids] = self.probs
        return out


def ranked(ids: np.ndarray, probs: np.ndarray, k: int | None = None) -> np.ndarray:
    """Token ids ordered by probability descending, then token id ascending (the first k only)."""
    ids, probs = np.asarray(ids), np.asarray(probs)
    if k is not None and len(ids) > 4 * k:
        part = np.argpartition(-probs, k - 1)[:k]
        keep = np.flatnonzero(probs >= probs[part].min())  # every tie at the k-th value
        ids, probs = ids[keep], probs[keep]
    order = np.lexsort((ids, -probs))
    return ids[order] if k is None else ids[order][:k]


def exact_ranked(exact: np.ndarray, k: int) -> np.ndarray:
    """The exact distribution's top-k token ids, ties by lower id."""
    k = min(k, len(exact))
    part = np.argpartition(-exact, k - 1)[:k]
    kth = exact[part].min()
    candidates = np.flatnonzero(exact >= kth)  # every tie at the boundary, then cut by id
    return ranked(candidates, exact[candidates])[:k]


def argmax(dist: Sparse) -> int | None:
    """The approximation's top token, lowest id on ties (None for an empty distribution)."""
    if not len(dist):
        return None
    return int(dist.ids[dist.probs == dist.probs.max()].min())


class Exact:
    """The exact distribution at one position, with what every comparison reuses."""

    def __init__(self, probs: np.ndarray, nucleus_p: float = PEARSON_NUCLEUS):
        self.probs = np.asarray(probs, dtype=np.float64)
        self.vocab_size = len(self.probs)
        self.argmax = int(np.argmax(self.probs))
        self.top10 = set(exact_ranked(self.probs, TOP_K_OVERLAP).tolist())
        self.nucleus = nucleus(self.probs, nucleus_p)
        self.sum_sq = float((self.probs * self.probs).sum())
        self.mean = float(self.probs.sum()) / self.vocab_size


def _exact(exact) -> Exact:
    return exact if isinstance(exact, Exact) else Exact(exact)


def top1_agreement(exact, dist: Sparse) -> bool:
    """Whether the approximation's argmax is the exact argmax (lowest id on ties)."""
    return argmax(dist) == _exact(exact).argmax


def top_k_overlap(exact, dist: Sparse, k: int = TOP_K_OVERLAP) -> float:
    """|top-k(approx) ∩ top-k(exact)| / k; a candidate set smaller than k counts as missing the rest."""
    mine = set(ranked(dist.ids, dist.probs, k).tolist())
    theirs = _exact(exact).top10 if k == TOP_K_OVERLAP else set(exact_ranked(_exact(exact).probs, k).tolist())
    return len(mine & theirs) / k


def mass_covered(exact, dist: Sparse) -> float:
    """Exact probability mass of the approximation's candidate set (tokens with p > 0)."""
    return float(_exact(exact).probs[dist.ids[dist.probs > 0]].sum())


def exact_prob_of_argmax(exact, dist: Sparse) -> float:
    """The exact probability of the approximation's top token (0 for an empty distribution)."""
    top = argmax(dist)
    return 0.0 if top is None else float(_exact(exact).probs[top])


def _kl_terms(p: np.ndarray, m: np.ndarray) -> float:
    nz = p > 0
    return float(np.sum(p[nz] * (np.log(p[nz]) - np.log(m[nz]))))


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon divergence in nats between two dense distributions (0 ≤ JS ≤ ln 2)."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    m = 0.5 * (p + q)
    return max(0.0, 0.5 * _kl_terms(p, m) + 0.5 * _kl_terms(q, m))


def js_to_exact(exact, dist: Sparse) -> float:
    """JS divergence (nats) between the exact distribution p and the approximation q.

    Computed on q's support only: off it m = p / 2, so those tokens add p ln 2 to KL(p || m).
    Equal to `js_divergence(p, q.dense(V))`.
    """
    p_all = _exact(exact).probs
    keep = dist.probs > 0
    ids, q = dist.ids[keep], dist.probs[keep]
    p = p_all[ids]
    m = 0.5 * (p + q)
    off_support = max(0.0, float(p_all.sum()) - float(p.sum()))
    kl_pm = off_support * math.log(2.0) + _kl_terms(p, m)
    kl_qm = _kl_terms(q, m)
    return max(0.0, 0.5 * kl_pm + 0.5 * kl_qm)


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two equal-length vectors; NaN when either is constant."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denom = math.sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    if len(x) < 2 or denom == 0.0:
        return float("nan")
    return float(np.clip(float((dx * dy).sum()) / denom, -1.0, 1.0))


def nucleus(exact: np.ndarray, p: float = PEARSON_NUCLEUS) -> np.ndarray:
    """The smallest set of top exact tokens whose mass reaches p (at least one token), most likely first.

    Sorts only a growing top-k (argpartition), not the whole vocabulary.
    """
    exact = np.asarray(exact, dtype=np.float64)
    n = len(exact)
    k = min(n, 64)
    while True:
        top = exact_ranked(exact, k) if k < n else np.argsort(-exact, kind="stable")
        before = np.cumsum(exact[top]) - exact[top]
        inside = top[before < p] if p < 1 else top
        if len(inside) < len(top) or k >= n:
            return inside
        k = min(n, k * 4)


def union_support(exact, dist: Sparse) -> np.ndarray:
    """Token ids (ascending) in the approximation's candidate set or in the exact top-p nucleus."""
    ex = _exact(exact)
    mask = np.zeros(ex.vocab_size, dtype=bool)
    mask[dist.ids[dist.probs > 0]] = True
    mask[ex.nucleus] = True
    return np.flatnonzero(mask)


def pearson_union(exact, dist: Sparse) -> float:
    """Pearson over the union of supports: candidate set ∪ exact top-0.99 nucleus.

    The values are the unrenormalised exact probabilities and the approximation's
    probabilities (0 where it has none) on those tokens; NaN when the union has < 2 tokens.
    """
    ex = _exact(exact)
    support = union_support(ex, dist)
    return pearson(ex.probs[support], dist.dense(ex.vocab_size)[support])


def pearson_full_vocab(exact, dist: Sparse) -> float:
    """Pearson over every token of the vocabulary (the approximation is 0 off its support)."""
    ex = _exact(exact)
    v = ex.vocab_size
    mean_q = float(dist.probs.sum()) / v
    cov = float((ex.probs[dist.ids] * dist.probs).sum()) - v * ex.mean * mean_q
    var_p = ex.sum_sq - v * ex.mean ** 2
    var_q = float((dist.probs * dist.probs).sum()) - v * mean_q ** 2
    if v < 2 or var_p <= 0 or var_q <= 1e-300:
        return float("nan")
    return float(np.clip(cov / math.sqrt(var_p * var_q), -1.0, 1.0))


def smoothed_prob(dist: Sparse, token: int, vocab_size: int, eps: float = SMOOTHING_EPSILON) -> float:
    """p'(token) = (1 - eps) * p(token) + eps / V."""
    hit = dist.probs[dist.ids == token]
    p = float(hit[0]) if len(hit) else 0.0
    return (1.0 - eps) * p + eps / vocab_size


def in_support(dist: Sparse, token: int) -> bool:
    return bool(np.any((dist.ids == token) & (dist.probs > 0)))


def perplexity(nlls: np.ndarray) -> float:
    """exp(mean NLL) in nats; NaN for no positions."""
    nlls = np.asarray(nlls, dtype=np.float64)
    return float(math.exp(nlls.mean())) if len(nlls) else float("nan")
