"""Fit a 3D projection of the embedding matrix (Landmark MDS or PCA) and reload a stored one."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from hartonomous.errors import UserError
from projection.landmarks import select_landmarks
from projection.lmds import LandmarkMDS
from projection.pca import PCA

PROJECTIONS = ("lmds", "pca")


@dataclass
class FittedProjection:
    """A projection, the 3D position of every vector, and the landmark rows it used (LMDS)."""

    projector: LandmarkMDS | PCA
    positions: np.ndarray
    landmark_idx: np.ndarray | None
    seconds: float

    def params(self, **extra) -> dict:
        """JSON for atom_sets.projection_params."""
        return {**self.projector.params(), **extra}


def fit_projection(embeddings: np.ndarray, method: str = "lmds", landmarks: int = 512,
                   landmark_method: str = "kmeans++", metric: str = "euclidean", seed: int = 0,
                   dims: int = 3) -> FittedProjection:
    """Project every row of `embeddings` to `dims` dimensions with the chosen method."""
    start = time.perf_counter()
    if method == "lmds":
        idx = select_landmarks(embeddings, landmarks, landmark_method, seed)
        projector: LandmarkMDS | PCA = LandmarkMDS.fit(embeddings, idx, dims, metric)
    elif method == "pca":
        idx = None
        projector = PCA.fit(embeddings, dims, metric)
    else:
        raise UserError(f"--projection must be one of {', '.join(PROJECTIONS)}, got '{method}'")
    positions = projector.transform(embeddings)
    if not np.all(np.isfinite(positions)):
        raise UserError("the projection produced non-finite positions; check the model's embeddings")
    return FittedProjection(projector, positions, idx, time.perf_counter() - start)


def load_projector(params: dict, landmark_vectors: np.ndarray | None = None) -> LandmarkMDS | PCA:
    """The projector stored in projection_params (+ the `landmarks` table's vectors for LMDS)."""
    if params.get("method") == "lmds":
        if landmark_vectors is None:
            raise UserError("an LMDS projection needs its landmark vectors (the landmarks table)")
        return LandmarkMDS.from_params(params, landmark_vectors)
    if params.get("method") == "pca":
        return PCA.from_params(params)
    raise UserError(f"unknown projection method {params.get('method')!r} in projection_params")
