"""Landmark MDS, PCA, landmark selection and projection quality on synthetic known geometry."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes
from scipy.spatial.distance import pdist

from hartonomous.errors import UserError
from projection.landmarks import select_landmarks
from projection.lmds import LandmarkMDS, classical_mds
from projection.pca import PCA
from projection.project import fit_projection, load_projector
from projection.quality import projection_quality


def embedded_3d(n: int = 400, dim: int = 20, noise: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(3D points, the same points isometrically embedded in `dim` dimensions [+ noise off the 3D subspace])."""
    rng = np.random.default_rng(seed)
    points = rng.uniform(-1, 1, size=(n, 3)) * np.array([3.0, 2.0, 1.0])
    basis, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    high = points @ basis[:, :3].T + rng.normal(size=dim)
    if noise:
        high += noise * rng.normal(size=(n, dim - 3)) @ basis[:, 3:].T
    return points, high


def procrustes_error(truth: np.ndarray, found: np.ndarray) -> float:
    """Max distance after the best rotation/reflection and translation (no scaling)."""
    a, b = truth - truth.mean(0), found - found.mean(0)
    rotation, _ = orthogonal_procrustes(b, a)
    return float(np.abs(b @ rotation - a).max())


def test_classical_mds_of_a_3_4_5_triangle_keeps_its_sides() -> None:
    triangle = np.array([[0.0, 0.0], [3.0, 0.0], [0.0, 4.0]])
    d2 = np.square(triangle[:, None] - triangle[None]).sum(-1)
    coords, values, _ = classical_mds(d2, dims=2)
    assert pdist(coords) == pytest.approx([3.0, 4.0, 5.0])
    assert coords.mean(axis=0) == pytest.approx([0.0, 0.0], abs=1e-12)
    assert values.sum() == pytest.approx(np.square(triangle - triangle.mean(0)).sum())


def test_classical_mds_refuses_too_few_dimensions() -> None:
    line = np.array([[0.0], [1.0], [2.0], [3.0]])
    with pytest.raises(UserError, match="fewer than 3 dimensions"):
        classical_mds(np.square(line - line.T), dims=3)


@pytest.mark.parametrize("method", ["kmeans++", "fps", "random"])
def test_lmds_recovers_an_isometric_3d_configuration(method: str) -> None:
    points, high = embedded_3d()
    idx = select_landmarks(high, 40, method, seed=1)
    lmds = LandmarkMDS.fit(high, idx)
    found = lmds.transform(high)
    assert procrustes_error(points, found) < 1e-8
    assert pdist(found) == pytest.approx(pdist(points), abs=1e-8)


def test_lmds_with_noise_off_the_subspace_has_small_error() -> None:
    points, high = embedded_3d(noise=0.02)
    found = LandmarkMDS.fit(high, select_landmarks(high, 64, seed=0)).transform(high)
    assert procrustes_error(points, found) < 0.1
    assert np.corrcoef(pdist(found), pdist(points))[0, 1] > 0.999


def test_a_landmark_triangulates_to_its_own_mds_coordinates() -> None:
    _, high = embedded_3d(noise=0.3, seed=2)  # not exactly 3D: triangulation must still be consistent
    idx = select_landmarks(high, 30, seed=0)
    lmds = LandmarkMDS.fit(high, idx)
    d2 = np.square(high[idx][:, None] - high[idx][None]).sum(-1)
    coords, _, _ = classical_mds(d2)
    assert lmds.transform(high[idx]) == pytest.approx(coords, abs=1e-8)


def test_new_vectors_project_the_same_way_from_stored_params() -> None:
    _, high = embedded_3d(noise=0.1)
    fitted = fit_projection(high, "lmds", landmarks=32, seed=3)
    params = fitted.params()
    again = load_projector(params, high[fitted.landmark_idx].astype(np.float32))
    fresh = np.random.default_rng(9).normal(size=(5, high.shape[1]))
    assert again.transform(fresh) == pytest.approx(fitted.projector.transform(fresh), rel=1e-5, abs=1e-5)
    pca = fit_projection(high, "pca")
    assert load_projector(pca.params()).transform(fresh) == pytest.approx(pca.projector.transform(fresh))


def test_cosine_metric_ignores_vector_length() -> None:
    _, high = embedded_3d()
    idx = select_landmarks(high, 20, seed=0)
    lmds = LandmarkMDS.fit(high, idx, metric="cosine")
    assert lmds.transform(high[:10] * 7.5) == pytest.approx(lmds.transform(high[:10]), abs=1e-9)


def test_pca_recovers_a_3d_configuration_and_its_variance() -> None:
    points, high = embedded_3d()
    pca = PCA.fit(high)
    assert procrustes_error(points, pca.transform(high)) < 1e-8
    assert pca.explained_variance.sum() == pytest.approx(1.0)
    assert pca.explained_variance[0] > pca.explained_variance[1] > pca.explained_variance[2]


def test_fps_picks_the_farthest_row_each_time() -> None:
    line = np.array([[0.0], [1.0], [2.0], [3.0], [10.0]])
    first = int(np.random.default_rng(5).integers(len(line)))  # the seeded first pick
    idx = select_landmarks(line, 3, "fps", seed=5)
    assert idx[0] == first
    d = np.abs(line[:, 0] - line[first, 0])
    assert idx[1] == int(np.argmax(d))


def test_kmeanspp_never_picks_a_duplicate_and_says_when_too_few_are_distinct() -> None:
    rows = np.repeat(np.eye(5), 10, axis=0)
    idx = select_landmarks(rows, 5, "kmeans++", seed=0)
    assert len({tuple(rows[i]) for i in idx}) == 5
    with pytest.raises(UserError, match="only 5 distinct"):
        select_landmarks(rows, 6, "kmeans++", seed=0)
    assert (select_landmarks(rows, 5, seed=4) == select_landmarks(rows, 5, seed=4)).all()


def test_bad_landmark_options_are_user_errors() -> None:
    with pytest.raises(UserError, match="landmark method"):
        select_landmarks(np.eye(4), 2, "bogus")
    with pytest.raises(UserError, match="--landmarks"):
        select_landmarks(np.eye(4), 5)
    with pytest.raises(UserError, match="--projection"):
        fit_projection(np.eye(4), "tsne")


def test_quality_is_perfect_for_an_isometry_and_poor_for_noise() -> None:
    points, high = embedded_3d(n=300)
    perfect = projection_quality(high, points, sample=300)
    assert perfect["trustworthiness"] == pytest.approx(1.0)
    assert perfect["recall_at_10"] == pytest.approx(1.0)
    scrambled = np.random.default_rng(0).permutation(points)
    poor = projection_quality(high, scrambled, sample=300)
    assert poor["trustworthiness"] < 0.6
    assert poor["recall_at_10"] < 0.15
