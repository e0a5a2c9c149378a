"""The baselines' predictors: distilled n-grams (no geometry), the 4-gram mixed with an in-context
cache, and full-dimensional KNN on atom keys.

All learn from the atom set's own build corpus and the exact model's labels on it, so they
answer "what would the same data buy without the 3D projection?"; the cache also reads the
context itself, as the spatial path's history atoms do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import psycopg

from hartonomous.centroid import context_centroid
from hartonomous.atomset import AtomSet
from hartonomous.compare import cache, ngram, spatial
from hartonomous.compare.metrics import Sparse

Predictor = Callable[[Sequence[int]], Sparse]


@dataclass
class Distillation:
    """Where the n-gram baselines' training pairs came from (or why there are none)."""

    available: bool
    source: str | None = None
    tokens: int = 0
    note: str = ""

    def as_dict(self) -> dict:
        return {"available": self.available, "source": self.source, "tokens": self.tokens, "note": self.note}


CACHE_PATH = "4-gram + cache"
CALIBRATION_MAX_TOKENS = 8192   # of the calibration half, for fitting the cache mixture


@dataclass
class CacheMixture:
    """The report's `baselines.cache` section: how "4-gram + cache" was mixed and where λ was fitted."""

    available: bool
    lam: float | None = None
    min_suffix: int | None = None
    fitted_on: str | None = None          # 'calibration' (the holdout's calibration half) or None
    positions: int = 0
    grid: list[dict] | None = None
    note: str = ""

    def as_dict(self) -> dict:
        return {"available": self.available, "lambda": self.lam, "min_suffix": self.min_suffix,
                "fitted_on": self.fitted_on, "calibration_positions": self.positions,
                "criterion": "top-1 agreement with the exact argmax, ties by mean log-likelihood of it",
                "grid": self.grid or [], "note": self.note}


def cache_mixture(ngram_predict: Predictor, calibration: tuple[list[int], np.ndarray] | None, chunk: int,
                  vocab_size: int) -> tuple[Predictor, CacheMixture]:
    """The 4-gram mixed with the in-context cache, λ and the minimum suffix fitted on the calibration
    tokens and their exact labels (contexts restart every `chunk` tokens, as in the scored texts);
    without calibration text, the documented defaults."""
    if calibration is None or not calibration[0]:
        lam, min_suffix = cache.DEFAULT_LAMBDA, cache.DEFAULT_MIN_SUFFIX
        section = CacheMixture(True, lam, min_suffix, None, 0, [],
                               f"not fitted (the atom set records no calibration half of a holdout): "
                               f"defaults λ = {lam:g}, minimum suffix {min_suffix}")
    else:
        ids, labels = calibration
        starts = range(0, len(ids), chunk)
        fit = cache.fit_mixture(ngram_predict, [ids[lo:lo + chunk] for lo in starts],
                                [labels[lo:lo + chunk] for lo in starts], vocab_size)
        lam, min_suffix = fit.lam, fit.min_suffix
        section = CacheMixture(True, lam, min_suffix, "calibration", fit.positions, fit.grid,
                               f"λ and the minimum suffix fitted on {fit.positions} positions of the holdout's "
                               f"calibration half (contexts of up to {chunk} tokens), never on the scored text")
    return cache.CachedNGram(ngram_predict, lam, min_suffix).predict, section


class CorpusUnavailable(LookupError):
    """The build corpus cannot be recovered; the message says why (shown in the report)."""


CorpusLoader = Callable[[AtomSet], tuple[str, str]]


def build_corpus(info: AtomSet) -> tuple[str, str]:
    """(source, training text) when the build recorded the text itself in stats.corpus.text."""
    entry = info.stats.corpus
    if entry is not None and entry.text:
        return entry.source or "the build corpus", entry.text
    raise CorpusUnavailable("the atom set records no build corpus text (stats.corpus)")


def build_tokens(info: AtomSet) -> int | None:
    """How many training tokens the build distilled (context sets) or would have (token sets)."""
    entry = info.stats.corpus
    if entry is None:
        return None
    value = entry.train_tokens or entry.max_tokens
    return int(value) if value else None


def context_length(info: AtomSet, default: int = 512) -> int:
    """The chunk length the builder's teacher forcing used (stats.corpus.context_length)."""
    entry = info.stats.corpus
    return int(entry.context_length) if entry is not None and entry.context_length else default


def ngram_predictors(ids: list[int], labels: np.ndarray, chunk: int) -> dict[str, Predictor]:
    """Unigram, bigram, trigram, 4-gram (backoff) fitted per chunk (contexts restart at chunk starts)."""
    starts = range(0, len(ids), chunk)
    models = ngram.fit_all([ids[lo:lo + chunk] for lo in starts], [labels[lo:lo + chunk] for lo in starts])
    return {name: model.predict for name, model in models.items()}


def knn_predictor(conn: psycopg.Connection, info: AtomSet, embeddings: np.ndarray,
                  k: int = 100) -> Predictor:
    """Full-dimensional KNN on the atoms' `key` column: the query key is the context centroid of
    the tokens' full-dimensional embeddings with the set's window and decay (the key definition
    of context atoms), matched by exact L2 search (pgvector, no index)."""
    bandwidth = info.stats.key_bandwidth

    def predict(context: Sequence[int]) -> Sparse:
        window = info.centroid_window
        recent = list(context)[-window:] if window else list(context)
        query = context_centroid(embeddings[np.asarray(recent)], window, info.centroid_decay)
        dist, _ = spatial.knn_distribution(conn, query, info.id, k, bandwidth)
        return dist

    return predict
