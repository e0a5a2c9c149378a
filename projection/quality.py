"""How well 3D positions keep the embedding space's neighbourhoods.

- trustworthiness (sklearn, Venna & Kaski): on a seeded sample, are 3D neighbours also
  full-dimensional neighbours? 1 is perfect, ~0.5 is random.
- recall@k: for seeded sample queries, the fraction of each query's k nearest full-dimensional
  neighbours (among *all* vectors) that are also among its k nearest 3D neighbours.
Both use the projection's metric for the full-dimensional distances.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree
from sklearn.manifold import trustworthiness

from projection.landmarks import squared_distances
from projection.lmds import prepare


def knn_recall(full: np.ndarray, low: np.ndarray, queries: np.ndarray, k: int = 10, batch: int = 512) -> float:
    """Mean |kNN_full(q) ∩ kNN_low(q)| / k over the query rows (self excluded)."""
    tree = cKDTree(low)
    _, low_nn = tree.query(low[queries], k=k + 1)
    hits = 0
    for lo in range(0, len(queries), batch):
        q = queries[lo:lo + batch]
        d2 = squared_distances(full[q], full)
        d2[np.arange(len(q)), q] = np.inf
        full_nn = np.argpartition(d2, k, axis=1)[:, :k]
        for row, query in enumerate(q):
            low_set = set(low_nn[lo + row].tolist()) - {int(query)}
            hits += len(low_set & set(full_nn[row].tolist()))
    return hits / (k * len(queries))


def projection_quality(embeddings: np.ndarray, positions: np.ndarray, metric: str = "euclidean",
                       sample: int = 2000, k: int = 10, seed: int = 0) -> dict:
    """{'trustworthiness', 'recall_at_10', ...} on a seeded sample of the rows."""
    full = prepare(embeddings, metric)
    n = len(full)
    rng = np.random.default_rng(seed)
    idx = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    k_eff = max(1, min(k, len(idx) // 2 - 1))
    trust = trustworthiness(full[idx], np.asarray(positions)[idx], n_neighbors=k_eff)
    recall = knn_recall(full, np.asarray(positions, dtype=np.float64), idx, k=min(k, n - 1))
    return {"trustworthiness": float(trust), f"recall_at_{k}": float(recall), "sample": int(len(idx)),
            "k": int(k), "metric": metric, "seed": int(seed)}
