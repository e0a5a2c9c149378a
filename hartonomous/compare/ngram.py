"""The backoff n-grams: the ∞-gram's index with the context suffix capped at n - 1 tokens.

An order-n model predicts the label mass at the **longest context suffix of at most n - 1 tokens
that ends at a labelled training position**, normalised (backoff to shorter suffixes, down to the
unigram: the label distribution of the whole training text, which always answers). The labels are
the atom set's own (hartonomous.compare.labels), so a count is a sum of label weights: soft top-k
probabilities, or 1 per argmax or corpus label. Contexts restart at every training chunk, as they
did for the labels. All orders read one hartonomous.compare.infinigram.InfiniGram index (a suffix
array, not dictionaries of counters), so they cost nothing beyond the ∞-gram.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hartonomous.compare.infinigram import InfiniGram
from hartonomous.compare.labels import from_sequences
from hartonomous.compare.metrics import Sparse

ORDERS = {"unigram": 1, "bigram": 2, "trigram": 3, "4-gram": 4}


@dataclass(frozen=True)
class NGram:
    """Backoff n-gram of one order over a shared ∞-gram index."""

    index: InfiniGram
    order: int

    def __post_init__(self) -> None:
        if self.order < 1:
            raise ValueError(f"order must be >= 1, got {self.order}")

    def backoff_order(self, context: Sequence[int]) -> int:
        """The n-gram order actually used for this context (1 = unigram; 0 = no labels at all)."""
        match = self.index.match(context, self.order - 1)
        return match.length + 1 if match.occurrences else 0

    def predict(self, context: Sequence[int]) -> Sparse:
        return self.index.predict(context, self.order - 1)


def ngrams(index: InfiniGram) -> dict[str, NGram]:
    """Unigram, bigram, trigram and 4-gram over one index."""
    return {name: NGram(index, order) for name, order in ORDERS.items()}


def fit_all(sequences: list[Sequence[int]], labels: list[Sequence[int]]) -> dict[str, NGram]:
    """The four n-grams of hand-made labels: labels[i][t] is the one label after sequences[i][: t + 1]."""
    return ngrams(InfiniGram(from_sequences(sequences, labels)))
