"""The baselines' predictors: distilled n-grams (no geometry) and full-dimensional KNN on atom keys.

Both learn from the atom set's own build corpus and the exact model's labels on it, so they
answer "what would the same data buy without the 3D projection?".
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg

from hartonomous import teacher
from hartonomous.centroid import context_centroid
from hartonomous.atomset import AtomSet
from hartonomous.compare import ngram, spatial
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


def cached_labels(model, model_name: str, ids: list[int], chunk: int, cache_dir: Path | None,
                  progress: Callable[[int], None] | None = None) -> np.ndarray:
    """The exact argmax after every prefix within each `chunk`-token window, cached by content hash."""
    key = f"{model_name}|{chunk}|".encode() + np.asarray(ids, np.int64).tobytes()
    path = cache_dir / f"labels-{hashlib.sha256(key).hexdigest()[:20]}.npy" if cache_dir else None
    if path is not None and path.is_file():
        labels = np.load(path)
        if len(labels) == len(ids):
            if progress:
                progress(len(ids))
            return labels
    labels = teacher.argmax_labels(model, ids, window=chunk, progress=progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, labels)
    return labels


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
