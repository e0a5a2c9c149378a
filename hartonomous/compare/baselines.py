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

from hartonomous.centroid import context_centroid
from hartonomous.compare import ngram, spatial, teacher
from hartonomous.compare.atomset import AtomSetInfo
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


def build_corpus(info: AtomSetInfo) -> tuple[str, str] | None:
    """(source, text) of the corpus the set was built from, when the builder recorded it."""
    for key in ("corpus", "build_corpus", "train"):
        entry = info.stats.get(key)
        if isinstance(entry, dict) and entry.get("text"):
            return str(entry.get("source") or key), str(entry["text"])
        if isinstance(entry, dict) and entry.get("path") and Path(entry["path"]).is_file():
            return str(entry["path"]), Path(entry["path"]).read_text(encoding="utf-8")
    return None


def cached_labels(model, model_name: str, ids: list[int], cache_dir: Path | None,
                  progress: Callable[[int], None] | None = None, window: int = 512) -> np.ndarray:
    """The exact argmax after every prefix of the corpus, cached on disk by content hash."""
    digest = hashlib.sha256(f"{model_name}|{window}|".encode() + np.asarray(ids, np.int64).tobytes()).hexdigest()[:20]
    path = cache_dir / f"labels-{digest}.npy" if cache_dir else None
    if path is not None and path.is_file():
        labels = np.load(path)
        if len(labels) == len(ids):
            if progress:
                progress(len(ids))
            return labels
    labels = teacher.argmax_labels(model, ids, window=window, progress=progress)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, labels)
    return labels


def ngram_predictors(ids: list[int], labels: np.ndarray) -> dict[str, Predictor]:
    """Unigram, bigram, trigram, 4-gram (backoff) fitted on one corpus's (context, label) pairs."""
    models = ngram.fit_all([ids], [labels])
    return {name: model.predict for name, model in models.items()}


def knn_predictor(conn: psycopg.Connection, info: AtomSetInfo, embeddings: np.ndarray,
                  k: int = 100) -> Predictor:
    """Full-dimensional KNN on the atoms' `key` column: the query key is the context centroid of
    the tokens' full-dimensional embeddings with the set's window and decay (the key definition
    of context atoms), matched by exact L2 search (pgvector, no index)."""
    bandwidth = info.stats.get("key_bandwidth")

    def predict(context: Sequence[int]) -> Sparse:
        window = info.centroid_window
        recent = list(context)[-window:] if window else list(context)
        query = context_centroid(embeddings[np.asarray(recent)], window, info.centroid_decay)
        dist, _ = spatial.knn_distribution(conn, query, info.id, k, bandwidth)
        return dist

    return predict
