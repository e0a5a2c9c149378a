"""The backoff ∞-gram (infini-gram, Liu et al. 2024) on a suffix array: the strongest counting baseline.

For a context, the ∞-gram finds the **longest suffix of the context that occurs in the training
text** at a labelled position (any length: no order is fixed) and predicts the label mass that
followed its occurrences there, normalised. The labels are the atom set's own (hartonomous.compare.
labels: soft top-k mass, the exact argmax or the corpus's next token), so a count is a sum of label
weights. An empty context, or one whose last token never occurs labelled, gets the label
distribution of the whole training text. Capping the suffix at n - 1 tokens gives the backoff
n-gram (hartonomous.compare.ngram): the n-grams and the ∞-gram share one index.

Index. The training chunks are joined with a separator between them (a match never crosses a
chunk start, because every training context restarted there) and the joined text is **reversed**:
a suffix of the context, reversed, is then a prefix of suffixes of the reversed text, and all
suffixes that start with it are one contiguous range of the suffix array. Extending the match by
one more context token narrows the range by two binary searches (bisect on the symbol at that
depth), so the longest match costs O(L log N) for a match of L tokens. The labels are stored in
suffix-array order, so the label mass of a range is a contiguous slice, summed with numpy.

Suffix array: prefix doubling with numpy (`suffix_array`): the ranks of the prefixes of length 2w
are the ranks of (rank of the first w symbols, rank of the next w), sorted with one argsort of an
int64 key per round; rounds stop when every rank is distinct, after ⌈log2(L_max + 1)⌉ rounds for a
longest repeat of L_max symbols. Time O(N log N · rounds); peak memory about 50 bytes per token
(five int64 arrays). The index then keeps the reversed text and the suffix array (int32 each when
N < 2^31) and the labels: k ids (int32) and k weights (float32) per position, plus one int64 count
per position; 16 + 8k bytes per token (24 at k = 1, 80 at k = 8). Measured build times and memory:
docs/compare.md.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from hartonomous.compare.labels import TrainingLabels
from hartonomous.compare.metrics import Sparse

SEPARATOR = -1      # between two chunks of the joined text: never equal to a context token
END = -2            # past the end of a suffix: sorts before every symbol (a prefix sorts first)
MEMO_MIN_RANGE = 256  # distributions of ranges at least this long are kept (frequent short suffixes)
MEMO_MAX = 4096
DENSE_FROM = 1 << 16  # label entries from which a range is summed with a dense bincount instead of np.unique

Predictor = Callable[[Sequence[int]], Sparse]


def suffix_array(text: np.ndarray) -> np.ndarray:
    """The start positions of `text`'s suffixes in lexicographic order (int64), a suffix before every
    longer suffix it is a prefix of. Prefix doubling with numpy argsort (see the module docstring)."""
    text = np.asarray(text)
    n = len(text)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    rank = np.unique(text, return_inverse=True)[1].reshape(-1).astype(np.int64) + 1   # 0: past the end
    width = 1
    while True:
        key = rank * (n + 1)
        key[: n - width] += rank[width:]
        order = np.argsort(key)
        key = key[order]
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        del key
        rank[order] = np.cumsum(new)
        if rank[order[-1]] == n:   # every prefix of length 2 * width is distinct: the order is final
            return order
        width *= 2


@dataclass(frozen=True)
class Match:
    """The longest suffix of a context with a labelled occurrence in the training text."""

    length: int          # tokens in the suffix (0: the whole text's label distribution)
    occurrences: int     # labelled positions where it ends
    dist: Sparse         # their label mass, normalised


class InfiniGram:
    """A suffix array over the reversed training text with the labels in suffix-array order."""

    def __init__(self, labels: TrainingLabels):
        chunks = [np.asarray(c, dtype=np.int64) for c in labels.chunks]
        if any(len(c) and c.min() < 0 for c in chunks):
            raise ValueError("token ids must be >= 0")
        pieces: list[np.ndarray] = []
        for chunk in chunks:
            pieces += [chunk, np.array([SEPARATOR])]
        text = np.concatenate(pieces[:-1]) if pieces else np.zeros(0, dtype=np.int64)
        n = len(text)
        small = n < 2**31 - 1
        self._n = n
        self._text = text[::-1].astype(np.int32 if small else np.int64)       # reversed
        del text
        sa = suffix_array(self._text)
        # the joined text's position j is position n - 1 - j of the reversed one; where does it sort?
        where = np.empty(n, dtype=np.int64)
        where[sa] = np.arange(n)
        k = labels.k
        self._ids = np.zeros((n, k), dtype=np.int32)
        self._mass = np.zeros((n, k), dtype=np.float32)
        start = 0
        for chunk, ids, mass in zip(chunks, labels.ids, labels.mass, strict=True):   # chunk by chunk: no copies
            slots = where[n - 1 - (start + np.arange(len(ids)))]
            self._ids[slots], self._mass[slots] = ids, mass
            start += len(chunk) + 1
        del where
        self._sa = sa.astype(np.int32 if small else np.int64)
        del sa
        self._labelled = np.concatenate([[0], np.cumsum(self._mass.sum(axis=1) > 0)])
        self._memo: dict[tuple[int, int], Sparse] = {}
        self.tokens, self.positions, self.k = int(sum(len(c) for c in chunks)), labels.positions, int(k)

    @property
    def nbytes(self) -> int:
        """Memory held by the index's arrays."""
        return int(sum(a.nbytes for a in (self._text, self._sa, self._ids, self._mass, self._labelled)))

    def _narrow(self, lo: int, hi: int, depth: int, token: int) -> tuple[int, int]:
        """Of the suffixes sa[lo:hi] (which share their first `depth` symbols), those whose next symbol
        is `token`: a contiguous sub-range, found by two binary searches."""
        sa, text, n = self._sa, self._text, self._n

        def symbol(i: int) -> int:
            at = int(sa[i]) + depth
            return int(text[at]) if at < n else END

        first = bisect_left(range(n), token, lo, hi, key=symbol)
        return first, bisect_right(range(n), token, first, hi, key=symbol)

    def _count(self, lo: int, hi: int) -> int:
        return int(self._labelled[hi] - self._labelled[lo])

    def _distribution(self, lo: int, hi: int) -> Sparse:
        """The label mass of the suffix-array range [lo, hi), normalised."""
        memo = hi - lo >= MEMO_MIN_RANGE
        if memo and (lo, hi) in self._memo:
            return self._memo[(lo, hi)]
        ids, mass = self._ids[lo:hi].ravel(), self._mass[lo:hi].ravel().astype(np.float64)
        if len(ids) >= DENSE_FROM:
            total = np.bincount(ids, weights=mass)
            uniq = np.arange(len(total))
        else:
            uniq, inverse = np.unique(ids, return_inverse=True)
            total = np.bincount(inverse.reshape(-1), weights=mass, minlength=len(uniq))
        keep = total > 0
        dist = Sparse(uniq[keep].astype(np.int64), total[keep] / total[keep].sum()) if keep.any() else Sparse.empty()
        if memo and len(self._memo) < MEMO_MAX:
            self._memo[(lo, hi)] = dist
        return dist

    def match(self, context: Sequence[int], max_suffix: int | None = None) -> Match:
        """The longest suffix of `context` (at most `max_suffix` tokens; None: any length) that ends at a
        labelled training position, with the label mass that followed it."""
        tokens = [int(t) for t in context]
        limit = len(tokens) if max_suffix is None else min(max_suffix, len(tokens))
        lo, hi, length = 0, self._n, 0
        while length < limit:
            narrower = self._narrow(lo, hi, length, tokens[-1 - length])
            if self._count(*narrower) == 0:   # no labelled occurrence: no longer suffix has one either
                break
            (lo, hi), length = narrower, length + 1
        count = self._count(lo, hi)
        return Match(length, count, self._distribution(lo, hi) if count else Sparse.empty())

    def predict(self, context: Sequence[int], max_suffix: int | None = None) -> Sparse:
        return self.match(context, max_suffix).dist

    def bounded(self, max_suffix: int | None) -> Predictor:
        """predict with the suffix capped at `max_suffix` tokens (None: the ∞-gram itself)."""
        return lambda context: self.predict(context, max_suffix)
