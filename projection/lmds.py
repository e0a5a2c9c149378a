"""Classical MDS on landmarks, and Landmark MDS triangulation (de Silva & Tenenbaum, 2004).

Classical MDS of the L landmarks: B = -1/2 J D² J (J centres), top-k eigenpairs (λ_i, v_i),
landmark coordinates v_i √λ_i. Any other vector x is then triangulated from its squared
distances δ_x to the landmarks alone:

    y(x) = -1/2 L♯ (δ_x − δ_μ),   L♯ = rows v_i / √λ_i,   δ_μ = column means of D²

so a new vector projects exactly like the build's vectors, given the stored landmarks, L♯ and
δ_μ. A landmark triangulates to its own MDS coordinates.

With Euclidean distances (or cosine, i.e. Euclidean on unit vectors) the triangulation is an
affine map of x (the |x|² term is constant over landmarks and L♯ rows sum to zero): LMDS then
differs from PCA in *which* directions it keeps — the principal axes of the landmarks rather
than of all vectors — not in being non-linear.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hartonomous.errors import UserError
from projection.landmarks import squared_distances

METRICS = ("euclidean", "cosine")


def prepare(x: np.ndarray, metric: str) -> np.ndarray:
    """Vectors in the space whose Euclidean distance is `metric` (unit rows for cosine)."""
    if metric not in METRICS:
        raise UserError(f"metric must be one of {', '.join(METRICS)}, got '{metric}'")
    x = np.asarray(x, dtype=np.float64)
    if metric == "cosine":
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        return x / np.where(norms > 0, norms, 1.0)
    return x


def classical_mds(d2: np.ndarray, dims: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(coordinates n×dims, eigenvalues, eigenvectors n×dims) from squared distances d2."""
    d2 = np.asarray(d2, dtype=np.float64)
    n = d2.shape[0]
    if d2.shape != (n, n) or n < dims + 1:
        raise UserError(f"classical MDS into {dims}D needs a square matrix of at least {dims + 1} points")
    row = d2.mean(axis=0)
    b = -0.5 * (d2 - row[None, :] - row[:, None] + row.mean())
    values, vectors = np.linalg.eigh((b + b.T) / 2)
    top = np.argsort(values)[::-1][:dims]
    values, vectors = values[top], vectors[:, top]
    if not np.all(values > 1e-12 * max(1.0, abs(values[0]))):
        raise UserError(f"the landmarks span fewer than {dims} dimensions; use more or different landmarks")
    vectors = vectors * np.where(vectors[np.abs(vectors).argmax(axis=0), range(dims)] < 0, -1.0, 1.0)
    return vectors * np.sqrt(values), values, vectors


@dataclass
class LandmarkMDS:
    """A fitted Landmark MDS: triangulates any vector from its distances to the landmarks."""

    landmarks: np.ndarray  # L x d, in the prepared (metric) space
    pinv: np.ndarray  # dims x L, L♯
    mean_sq: np.ndarray  # L, δ_μ
    eigenvalues: np.ndarray
    metric: str = "euclidean"

    method = "lmds"

    @classmethod
    def fit(cls, x: np.ndarray, landmark_idx: np.ndarray, dims: int = 3, metric: str = "euclidean") -> "LandmarkMDS":
        marks = prepare(np.asarray(x)[np.asarray(landmark_idx)], metric)
        d2 = squared_distances(marks, marks)
        np.fill_diagonal(d2, 0.0)
        _, values, vectors = classical_mds(d2, dims)
        return cls(marks, (vectors / np.sqrt(values)).T, d2.mean(axis=0), values, metric)

    def transform(self, x: np.ndarray, batch: int = 8192) -> np.ndarray:
        """3D positions of the rows of x (n x d, in the original space)."""
        x = np.asarray(x)
        out = np.empty((len(x), self.pinv.shape[0]))
        for lo in range(0, len(x), batch):
            delta = squared_distances(prepare(x[lo:lo + batch], self.metric), self.landmarks)
            out[lo:lo + batch] = -0.5 * (delta - self.mean_sq[None, :]) @ self.pinv.T
        return out

    def params(self) -> dict:
        """What triangulation needs besides the landmark vectors (stored in `landmarks`)."""
        return {"method": self.method, "metric": self.metric, "dims": int(self.pinv.shape[0]),
                "landmarks": int(len(self.landmarks)), "eigenvalues": self.eigenvalues.tolist(),
                "pinv": self.pinv.tolist(), "mean_sq": self.mean_sq.tolist()}

    @classmethod
    def from_params(cls, params: dict, landmark_vectors: np.ndarray) -> "LandmarkMDS":
        """Rebuild from `params()` and the stored landmark vectors (in the original space)."""
        return cls(prepare(landmark_vectors, params["metric"]), np.asarray(params["pinv"]),
                   np.asarray(params["mean_sq"]), np.asarray(params["eigenvalues"]), params["metric"])
