"""The counting baseline in the store's place: (1 − λ) p_exact + λ p_count, λ from the same gate.

compare's "counting ⊕ exact" path asks what the augmented path's gate buys with the strongest
counting model (the ∞-gram, alone or with its in-context cache: hartonomous.compare.infinigram,
hartonomous.compare.cache) instead of the atom store. It uses the same logistic gate family
(gate.fit_gate), fitted the same way on the set's calibration split against the real next token.
`feature_row` mirrors gate.feature_row feature for feature, in FEATURES order:

- closeness -> the ∞-gram's suffix match length (tokens; deeper is closer, as the store's depth);
- exact_match -> 1 when that match is at least the set's centroid window (the store's whole key);
- ln_mass -> ln(1 + occurrences of the matched suffix) (how much the counts saw there);
- store_top, store_entropy -> the counting distribution's top probability and entropy (nats);
- history_share -> the cache's weight where the cache mixture used the cache (the context's own
  share, as the store's history atoms; 1 where the ∞-gram had nothing), else 0;
- memory_share -> 0 (counting keeps no memory of past generations);
- exact_top, exact_entropy, agree, exact_on_store_top -> exactly as gate.feature_row (the last:
  ln of the exact model's probability of the counting distribution's top token).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hartonomous.augment.gate import exact_side
from hartonomous.compare.cache import CachedNGram, longest_match, mix
from hartonomous.compare.infinigram import InfiniGram
from hartonomous.compare.metrics import Sparse, argmax


@dataclass(frozen=True)
class CountingStep:
    """One context's counting distribution and what its features read."""

    dist: Sparse
    match_length: int           # tokens of the ∞-gram's longest matched suffix
    occurrences: int            # labelled training positions where that suffix ends
    cache_share: float = 0.0    # the cache's weight in `dist` (0: the ∞-gram alone)


@dataclass(frozen=True)
class CountingModel:
    """The ∞-gram, alone (`cache` None) or mixed with the in-context cache as compare's "∞-gram +
    cache" path mixes it (the same λ and minimum suffix): `step` gives the same distribution as that
    path's predictor, with the match it came from."""

    name: str
    index: InfiniGram
    cache: CachedNGram | None = None

    def step(self, context: Sequence[int]) -> CountingStep:
        found = self.index.match(context)
        dist, share = found.dist, 0.0
        if self.cache is not None and self.cache.lam > 0:
            own = longest_match(context)
            if own is not None and own.length >= self.cache.min_suffix:
                dist = mix(found.dist, own.dist, self.cache.lam)
                share = 1.0 if len(found.dist) == 0 else float(self.cache.lam)
        return CountingStep(dist, found.length, found.occurrences, share)


def feature_row(step: CountingStep, exact_probs: np.ndarray, window: int | None) -> np.ndarray:
    """The gate's features (hartonomous.augment.gate.FEATURES order) for a counting step; `window` is the atom set's
    centroid window (None: no whole-key indicator, 0)."""
    if len(step.dist) == 0:
        return np.array([0.0] * 7 + exact_side(exact_probs, None))
    probs = step.dist.probs[step.dist.probs > 0]
    whole = float(window is not None and step.match_length >= window)
    return np.array([float(step.match_length), whole, math.log1p(max(step.occurrences, 0)),
                     float(step.dist.probs.max()), float(-(probs * np.log(probs)).sum()), float(step.cache_share),
                     0.0, *exact_side(exact_probs, argmax(step.dist))])

