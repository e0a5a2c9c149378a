"""The in-context cache: continue what the context already said, mixed with the distilled n-gram.

`longest_match` finds the longest suffix of the context that occurred earlier in the same context
and the tokens that followed it there; every earlier occurrence of that longest suffix votes once
for its following token. This is counting only (prompt lookup, what induction heads do), and it
reads exactly what the spatial path's history atoms read: the context. "4-gram + cache" is
therefore the fair counting baseline for a spatial path that uses the context's own history.

Mixture: p = (1 - λ) p_ngram + λ p_cache when the cache matched a suffix of at least `min_suffix`
tokens, p_ngram alone otherwise. `fit_mixture` picks λ and `min_suffix` on labelled calibration
text (never on the scored text).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hartonomous.compare.metrics import SMOOTHING_EPSILON, Sparse, argmax, smoothed_prob

Predictor = Callable[[Sequence[int]], Sparse]

LAMBDA_GRID = tuple(round(0.1 * i, 1) for i in range(11))   # 0.0, 0.1, ..., 1.0
MIN_SUFFIX_GRID = (1, 2, 3, 4)
DEFAULT_LAMBDA, DEFAULT_MIN_SUFFIX = 0.5, 2                  # only when there is nothing to fit on


@dataclass(frozen=True)
class CacheMatch:
    """The longest earlier-occurring suffix of a context and what followed it."""

    length: int          # tokens in the suffix
    occurrences: int     # earlier occurrences of it (each votes once)
    dist: Sparse         # votes for the following tokens, normalised


def longest_match(context: Sequence[int]) -> CacheMatch | None:
    """The longest suffix of `context` that also ends at an earlier position j (so that the token
    context[j + 1] after it exists; occurrences may overlap the suffix itself). None when even the
    last token never occurred before."""
    c = np.asarray(context, dtype=np.int64)
    t = len(c) - 1
    if t < 1:
        return None
    active = np.flatnonzero(c[:t] == c[t])       # earlier ends j of a length-1 match
    if len(active) == 0:
        return None
    length = 1
    while True:                                  # extend every match by one token to the left
        longer = active[active - length >= 0]
        longer = longer[c[longer - length] == c[t - length]]
        if len(longer) == 0:
            break
        active, length = longer, length + 1
    ids, votes = np.unique(c[active + 1], return_counts=True)
    return CacheMatch(length, len(active), Sparse(ids, votes / votes.sum()))


def mix(base: Sparse, cache: Sparse, lam: float) -> Sparse:
    """(1 - lam) * base + lam * cache over the union of supports, renormalised (an empty base
    leaves the cache alone)."""
    ids = np.union1d(base.ids, cache.ids)
    probs = (1.0 - lam) * _on(ids, base) + lam * _on(ids, cache)
    keep = probs > 0
    total = probs[keep].sum()
    if total <= 0:
        return Sparse.empty()
    return Sparse(ids[keep], probs[keep] / total)


def _on(ids: np.ndarray, dist: Sparse) -> np.ndarray:
    """dist's probabilities on the sorted `ids` (0 where dist has none)."""
    out = np.zeros(len(ids))
    if len(dist):
        out[np.searchsorted(ids, dist.ids)] = dist.probs
    return out


@dataclass(frozen=True)
class CachedNGram:
    """An n-gram predictor mixed with the in-context cache."""

    ngram: Predictor
    lam: float
    min_suffix: int = 1

    def predict(self, context: Sequence[int]) -> Sparse:
        base = self.ngram(context)
        if self.lam <= 0:
            return base
        match = longest_match(context)
        if match is None or match.length < self.min_suffix:
            return base
        return mix(base, match.dist, self.lam)


@dataclass
class MixtureFit:
    """The chosen λ and minimum suffix length, and every grid point's score on the calibration text."""

    lam: float
    min_suffix: int
    positions: int
    grid: list[dict] = field(default_factory=list)   # {lambda, min_suffix, top1, log_likelihood}


def fit_mixture(ngram: Predictor, sequences: Sequence[Sequence[int]], labels: Sequence[Sequence[int]],
                vocab_size: int, lambdas: Sequence[float] = LAMBDA_GRID,
                min_suffixes: Sequence[int] = MIN_SUFFIX_GRID, eps: float = SMOOTHING_EPSILON) -> MixtureFit:
    """Grid search over (λ, min_suffix) on labelled text: labels[i][t] is the exact argmax after
    sequences[i][: t + 1]. The winner has the highest top-1 agreement with the labels; ties go to
    the higher mean log-likelihood of the label (smoothed with eps, as the report's NLL), then to
    the smaller λ and the shorter minimum suffix."""
    hits, logs, lengths = [], [], []          # per position: one value per λ, and the match length
    base_hits, base_logs = [], []             # per position: the n-gram alone
    for seq, lab in zip(sequences, labels, strict=True):
        seq = [int(x) for x in seq]
        if len(seq) != len(lab):
            raise ValueError("each label sequence must be as long as its token sequence")
        for t, label in enumerate(lab):
            context = seq[: t + 1]
            base, match = ngram(context), longest_match(context)
            base_hits.append(float(argmax(base) == int(label)))
            base_logs.append(math.log(smoothed_prob(base, int(label), vocab_size, eps)))
            dists = [mix(base, match.dist, lam) if match else base for lam in lambdas]
            hits.append([float(argmax(d) == int(label)) for d in dists])
            logs.append([math.log(smoothed_prob(d, int(label), vocab_size, eps)) for d in dists])
            lengths.append(match.length if match else 0)
    if not hits:
        raise ValueError("no calibration positions")
    hit, log, length = np.asarray(hits), np.asarray(logs), np.asarray(lengths)
    base_hit, base_log = np.asarray(base_hits), np.asarray(base_logs)
    grid = []
    for s in min_suffixes:
        used = length >= s                    # shorter matches: the n-gram alone
        for k, lam in enumerate(lambdas):
            grid.append({"lambda": float(lam), "min_suffix": int(s),
                         "top1": float(np.where(used, hit[:, k], base_hit).mean()),
                         "log_likelihood": float(np.where(used, log[:, k], base_log).mean())})
    best = min(grid, key=lambda g: (-g["top1"], -g["log_likelihood"], g["lambda"], g["min_suffix"]))
    return MixtureFit(best["lambda"], best["min_suffix"], len(hit), grid)

