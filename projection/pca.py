"""PCA to 3D: the baseline projection (`--projection pca`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from projection.lmds import prepare


@dataclass
class PCA:
    """Centre, then project on the top principal axes of all vectors."""

    mean: np.ndarray
    components: np.ndarray  # dims x d
    explained_variance: np.ndarray
    metric: str = "euclidean"

    method = "pca"

    @classmethod
    def fit(cls, x: np.ndarray, dims: int = 3, metric: str = "euclidean") -> "PCA":
        x = prepare(x, metric)
        mean = x.mean(axis=0)
        cov = np.cov(x - mean, rowvar=False)
        values, vectors = np.linalg.eigh(cov)
        top = np.argsort(values)[::-1][:dims]
        vectors = vectors[:, top] * np.where(vectors[np.abs(vectors[:, top]).argmax(axis=0), top] < 0, -1.0, 1.0)
        total = float(values.sum())
        return cls(mean, vectors.T, values[top] / total if total > 0 else values[top], metric)

    def transform(self, x: np.ndarray) -> np.ndarray:
        return (prepare(x, self.metric) - self.mean) @ self.components.T

    def params(self) -> dict:
        return {"method": self.method, "metric": self.metric, "dims": int(len(self.components)),
                "explained_variance_ratio": self.explained_variance.tolist(),
                "mean": self.mean.tolist(), "components": self.components.tolist()}

    @classmethod
    def from_params(cls, params: dict) -> "PCA":
        return cls(np.asarray(params["mean"]), np.asarray(params["components"]),
                   np.asarray(params["explained_variance_ratio"]), params["metric"])
