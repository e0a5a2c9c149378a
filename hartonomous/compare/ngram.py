"""n-gram predictors distilled from the exact model's labels: the no-geometry baselines.

Training pairs come from a corpus run through the exact model with teacher forcing: at each
position t the context is the corpus tokens up to t and the label is the exact model's argmax
for the next token (the same label a context atom stores). An order-n model counts labels per
context of the last n-1 tokens. Prediction backs off: it uses the longest context suffix
(at most n-1 tokens) seen in training and returns the label counts there, normalised; the
unigram (n = 1) is the label histogram of the whole corpus and always answers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

import numpy as np

from hartonomous.compare.metrics import Sparse

ORDERS = {"unigram": 1, "bigram": 2, "trigram": 3, "4-gram": 4}


class DistilledNGram:
    """Label counts per context suffix of up to `order - 1` tokens, with backoff."""

    def __init__(self, order: int):
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        self.order = order
        self.counts: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        self.pairs = 0
        self._cache: dict[tuple[int, ...], Sparse] = {}

    def fit(self, sequences: Iterable[Sequence[int]], labels: Iterable[Sequence[int]]) -> "DistilledNGram":
        """labels[i][t] is the exact argmax after sequences[i][: t + 1]."""
        for seq, lab in zip(sequences, labels, strict=True):
            seq, lab = [int(x) for x in seq], [int(x) for x in lab]
            if len(seq) != len(lab):
                raise ValueError("each label sequence must be as long as its token sequence")
            self._cache.clear()
            for t, label in enumerate(lab):
                for n in range(self.order):
                    if n > t + 1:
                        break
                    self.counts[tuple(seq[t + 1 - n:t + 1])][label] += 1
                self.pairs += 1
        return self

    def backoff_order(self, context: Sequence[int]) -> int:
        """The n-gram order actually used for this context (1 = unigram)."""
        for n in range(min(self.order - 1, len(context)), -1, -1):
            if tuple(context[len(context) - n:]) in self.counts:
                return n + 1
        return 0

    def predict(self, context: Sequence[int]) -> Sparse:
        """Normalised label counts at the longest seen context suffix (empty if never fitted)."""
        context = [int(x) for x in context]
        n = self.backoff_order(context)
        if n == 0:
            return Sparse.empty()
        key = tuple(context[len(context) - (n - 1):]) if n > 1 else ()
        cached = self._cache.get(key)
        if cached is None:
            counter = self.counts[key]
            ids = np.fromiter(counter.keys(), dtype=np.int64, count=len(counter))
            counts = np.fromiter(counter.values(), dtype=np.float64, count=len(counter))
            cached = Sparse(ids, counts / counts.sum())
            if len(self._cache) < 4096:
                self._cache[key] = cached
        return cached


    def truncated(self, order: int) -> "DistilledNGram":
        """The same counts used only up to a lower order (shares memory with self)."""
        if not 1 <= order <= self.order:
            raise ValueError(f"order must be in 1..{self.order}, got {order}")
        view = DistilledNGram(order)
        view.counts, view.pairs = self.counts, self.pairs
        return view


def fit_all(sequences: list[Sequence[int]], labels: list[Sequence[int]]) -> dict[str, DistilledNGram]:
    """Unigram, bigram, trigram and 4-gram (with backoff) fitted on the same pairs."""
    full = DistilledNGram(max(ORDERS.values())).fit(sequences, labels)
    return {name: full.truncated(order) for name, order in ORDERS.items()}
