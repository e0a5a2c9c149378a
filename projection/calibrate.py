"""Kernel bandwidth calibration on held-out text: the spatial distribution of `next_token`, in NumPy.

For each held-out position the query is the context centroid; its `max_neighbors` nearest
atoms (cKDTree, the same Euclidean KNN the GiST index answers) vote with the kernel of
hartonomous.kernel; a token's logit is the log-sum-exp of its atoms' contributions and the
distribution is their softmax (next_token with T = 1, top-k and top-p off). The objective is
the mean log-likelihood of the exact model's argmax, smoothed as
    log((1 - ε) p_spatial + ε / V),   ε = SMOOTHING
so a target outside the candidate set costs log(ε / V) instead of -inf. The bandwidth is the
best point of a geometric grid around the median neighbour distance, refined by a bounded
scalar search between its grid neighbours.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.spatial import cKDTree

from hartonomous.errors import UserError
from hartonomous.kernel import backoff_radius, log_contributions

SMOOTHING = 1e-3
GRID_STEPS_PER_OCTAVE = 4
GRID_OCTAVES = (-10, 6)
BACKOFF_GRID_POINTS = 64   # per period of the backoff kernel's ladder (a factor of the decay)


@dataclass
class Neighbours:
    """The candidate atoms of every query, flat and grouped by (query, token) once for fast re-scoring.

    The candidates are a query's `max_neighbors` nearest stored atoms and, after `with_history`,
    its history atoms (projection/history.py), whose weight is given to `score` as `history_weight`.
    """

    query: np.ndarray  # (N,) the query of each candidate
    tokens: np.ndarray  # (N,) its token
    distances: np.ndarray  # (N,) its distance to the query
    log_weights: np.ndarray  # (N,) log weight of each stored candidate (history candidates: 0)
    history: np.ndarray | None  # (N,) True for history candidates; None when there are none
    order: np.ndarray  # flat order that sorts the candidates by (query, token)
    starts: np.ndarray  # start of each (query, token) group in `order`
    group_query: np.ndarray
    group_token: np.ndarray
    query_starts: np.ndarray  # first group of each query
    queries: int
    max_neighbors: int  # stored neighbours per query
    decay: float | None = None  # the keys' centroid decay: the backoff kernel's ladder (hartonomous.kernel)

    @property
    def stored_distances(self) -> np.ndarray:
        return self.distances if self.history is None else self.distances[~self.history]

    @cached_property
    def stored_only(self) -> "Neighbours":
        """The stored candidates alone (what a history weight of 0 scores), grouped once."""
        if self.history is None:
            return self
        keep = ~self.history
        return _grouped(self.query[keep], self.tokens[keep], self.distances[keep], self.log_weights[keep], None,
                        self.queries, self.max_neighbors, self.decay)


def knn(points: np.ndarray, queries: np.ndarray, k: int, tree: cKDTree | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact Euclidean KNN: (distances, indices), each Q x k. A k-d tree in low dimensions,
    brute force (the same L2 as pgvector's <->) in high ones."""
    k = min(k, len(points))
    if tree is not None or points.shape[1] <= 8:
        dist, idx = (tree or cKDTree(points)).query(queries, k=k)
        return dist.reshape(len(queries), k), idx.reshape(len(queries), k)
    points = np.asarray(points, dtype=np.float32)
    norms = (points.astype(np.float64) ** 2).sum(1)
    dist = np.empty((len(queries), k))
    idx = np.empty((len(queries), k), dtype=np.int64)
    for lo in range(0, len(queries), 256):
        q = np.asarray(queries[lo:lo + 256], dtype=np.float32)
        d2 = np.maximum(norms[None, :] - 2.0 * (q @ points.T) + (q.astype(np.float64) ** 2).sum(1)[:, None], 0.0)
        part = np.argpartition(d2, k - 1, axis=1)[:, :k] if k < len(points) else np.tile(np.arange(k), (len(q), 1))
        d2k = np.take_along_axis(d2, part, axis=1)
        order = np.argsort(d2k, axis=1)
        idx[lo:lo + 256] = np.take_along_axis(part, order, axis=1)
        dist[lo:lo + 256] = np.sqrt(np.take_along_axis(d2k, order, axis=1))
    return dist, idx


def _grouped(query: np.ndarray, tokens: np.ndarray, distances: np.ndarray, log_weights: np.ndarray,
             history: np.ndarray | None, queries: int, max_neighbors: int, decay: float | None = None) -> Neighbours:
    """Sort flat candidates by (query, token) (stable: stored before history within a group)."""
    order = np.lexsort((tokens, query))
    keys_q, keys_t = query[order], tokens[order]
    new = np.ones(len(order), dtype=bool)
    new[1:] = (keys_q[1:] != keys_q[:-1]) | (keys_t[1:] != keys_t[:-1])
    starts = np.flatnonzero(new)
    group_query = keys_q[starts]
    qnew = np.ones(len(starts), dtype=bool)
    qnew[1:] = group_query[1:] != group_query[:-1]
    return Neighbours(query, tokens, distances, log_weights, history, order, starts, group_query, keys_t[starts],
                      np.flatnonzero(qnew), queries, max_neighbors, decay)


def nearest_atoms(atom_positions: np.ndarray, atom_tokens: np.ndarray, atom_weights: np.ndarray | None,
                  queries: np.ndarray, k: int = 100, tree: cKDTree | None = None,
                  decay: float | None = None) -> Neighbours:
    """KNN of every query among the atoms (k capped at the number of atoms), grouped by token;
    `decay` is the keys' centroid decay, which the backoff kernel needs."""
    if len(atom_positions) == 0 or len(queries) == 0:
        raise UserError("bandwidth calibration needs atoms and held-out positions")
    dist, idx = knn(np.asarray(atom_positions), np.asarray(queries), k, tree)
    k = dist.shape[1]
    tokens = np.asarray(atom_tokens, dtype=np.int64)[idx].ravel()
    weights = np.ones(len(atom_positions)) if atom_weights is None else np.asarray(atom_weights, dtype=np.float64)
    q = np.repeat(np.arange(len(queries)), k)
    return _grouped(q, tokens, dist.ravel(), np.log(weights[idx]).ravel(), None, len(queries), k, decay)


def with_history(nb: Neighbours, query: np.ndarray, tokens: np.ndarray, distances: np.ndarray) -> Neighbours:
    """`nb`'s stored candidates plus history candidates (query index, token, distance each)."""
    if nb.history is not None:
        raise ValueError("these neighbours already include history atoms")
    n_hist = len(query)
    return _grouped(np.concatenate([nb.query, np.asarray(query, dtype=np.int64)]),
                    np.concatenate([nb.tokens, np.asarray(tokens, dtype=np.int64)]),
                    np.concatenate([nb.distances, np.asarray(distances, dtype=np.float64)]),
                    np.concatenate([nb.log_weights, np.zeros(n_hist)]),
                    np.concatenate([np.zeros(len(nb.query), dtype=bool), np.ones(n_hist, dtype=bool)]),
                    nb.queries, nb.max_neighbors, nb.decay)


def _segment_logsumexp(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    sizes = np.diff(np.append(starts, len(values)))
    peak = np.maximum.reduceat(values, starts)
    safe = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):  # a group of -inf (history atoms at weight 0) has logit -inf
        return safe + np.log(np.add.reduceat(np.exp(values - np.repeat(safe, sizes)), starts))


def _backoff_radii(nb: Neighbours, log_w: np.ndarray, bandwidth: float) -> np.ndarray:
    """Each candidate's backoff radius: that of its query's nearest candidate that counts (history
    candidates count only at a positive history weight)."""
    if nb.decay is None:
        raise ValueError("the backoff kernel needs the neighbours' centroid decay (nearest_atoms(decay=...))")
    live = np.where(np.isfinite(log_w), nb.distances, np.inf)[nb.order]
    nearest = np.minimum.reduceat(live, nb.starts[nb.query_starts])
    per_query = np.full(nb.queries, np.inf)
    per_query[nb.group_query[nb.query_starts]] = nearest
    with np.errstate(invalid="ignore"):
        radii = backoff_radius(np.where(np.isfinite(per_query), per_query, 0.0), bandwidth, nb.decay)
    return radii[nb.query]


@dataclass
class Score:
    log_likelihood: float  # mean smoothed log p(target)
    top1: float  # fraction of queries whose spatial argmax is the target
    coverage: float  # fraction of queries whose target is among the candidates
    log_probs: np.ndarray  # smoothed log p(target) per query
    argmax: np.ndarray  # spatial argmax token per query (ties: smallest token id)


def score(nb: Neighbours, targets: np.ndarray, bandwidth: float, kernel: str, vocab_size: int,
          smoothing: float = SMOOTHING, history_weight: float = 0.0) -> Score:
    """The spatial distribution's fit to `targets` at one bandwidth (and history weight, when
    `nb` has history candidates: each weighs `history_weight`; 0 leaves them out exactly)."""
    if nb.history is not None and not history_weight > 0:
        nb = nb.stored_only    # exactly the stored-only score: no -inf terms to shift numpy's pairwise sums
    log_w = nb.log_weights
    if nb.history is not None:
        log_w = np.where(nb.history, np.log(history_weight) if history_weight > 0 else -np.inf, log_w)
    radius = _backoff_radii(nb, log_w, bandwidth) if kernel == "backoff" else None
    contrib = (log_contributions(nb.distances, None, kernel, bandwidth, radius=radius) + log_w)[nb.order]
    logits = _segment_logsumexp(contrib, nb.starts)
    log_z = _segment_logsumexp(logits, nb.query_starts)
    q_sizes = np.diff(np.append(nb.query_starts, len(logits)))
    best = np.maximum.reduceat(logits, nb.query_starts)
    at_max = np.where(logits >= np.repeat(best, q_sizes), np.arange(len(logits)), len(logits))
    argmax = nb.group_token[np.minimum.reduceat(at_max, nb.query_starts)]
    span = int(max(nb.group_token.max(), np.max(targets))) + 1
    group_keys = nb.group_query * span + nb.group_token
    wanted = np.arange(nb.queries) * span + np.asarray(targets, dtype=np.int64)
    where = np.minimum(np.searchsorted(group_keys, wanted), len(group_keys) - 1)
    present = (group_keys[where] == wanted) & np.isfinite(logits[where])
    log_p = np.where(present, logits[where] - log_z, -np.inf)
    p = np.where(np.isfinite(log_p), np.exp(np.minimum(log_p, 0.0)), 0.0)
    log_probs = np.log((1.0 - smoothing) * p + smoothing / vocab_size)
    return Score(float(log_probs.mean()), float(np.mean(argmax == targets)), float(present.mean()),
                 log_probs, argmax)


OBJECTIVES = ("log-likelihood", "top1")


def calibrate_bandwidth(nb: Neighbours, targets: np.ndarray, kernel: str, vocab_size: int,
                        objective: str = "log-likelihood", history_weight: float = 0.0,
                        centre: float | None = None, octaves: tuple[int, int] = GRID_OCTAVES) -> dict:
    """The bandwidth that maximises `objective` on the holdout, and the whole search curve.

    'log-likelihood' (the default) is the smoothed mean log p(exact argmax); 'top1' is the
    fraction of positions where the spatial argmax is the exact argmax (ties: the higher
    log-likelihood). The other objective's optimum is recorded too. The grid spans `octaves`
    around `centre` (default: the median stored-neighbour distance); `history_weight` is passed
    to `score`.
    """
    if objective not in OBJECTIVES:
        raise UserError(f"--bandwidth-objective must be one of {', '.join(OBJECTIVES)}, got '{objective}'")
    stored = nb.stored_distances
    positive = stored[stored > 0]
    scale = float(np.median(positive)) if len(positive) else 1.0
    lo, hi = octaves
    centre = scale if centre is None else centre
    grid = centre * 2.0 ** (np.arange(lo * GRID_STEPS_PER_OCTAVE, hi * GRID_STEPS_PER_OCTAVE + 1) / GRID_STEPS_PER_OCTAVE)
    if kernel == "backoff":   # h and h * decay give the same radii: one period of the ladder, finely
        grid = centre * np.exp(np.linspace(0.5, -0.5, BACKOFF_GRID_POINTS, endpoint=False) * np.log(nb.decay))
    curve = []
    for h in grid:
        s = score(nb, targets, float(h), kernel, vocab_size, history_weight=history_weight)
        curve.append({"h": float(h), "log_likelihood": s.log_likelihood, "top1": s.top1})
    best = max(range(len(curve)), key=lambda i: (curve[i]["log_likelihood"], -i))
    step = 2.0 ** (1.0 / GRID_STEPS_PER_OCTAVE)

    def negative_ll(log_h: float) -> float:  # refine between the best point's grid neighbours
        s = score(nb, targets, float(np.exp(log_h)), kernel, vocab_size, history_weight=history_weight)
        curve.append({"h": float(np.exp(log_h)), "log_likelihood": s.log_likelihood, "top1": s.top1})
        return -s.log_likelihood

    if kernel != "backoff":   # the backoff scores are steps in h: nothing to refine between grid points
        centre = np.log(curve[best]["h"])
        minimize_scalar(negative_ll, bounds=(centre - np.log(step), centre + np.log(step)), method="bounded",
                        options={"xatol": 1e-3})
    curve.sort(key=lambda c: c["h"])
    by_ll = max(curve, key=lambda c: c["log_likelihood"])
    by_top1 = max(curve, key=lambda c: (c["top1"], c["log_likelihood"]))
    chosen = by_ll if objective == "log-likelihood" else by_top1
    final = score(nb, targets, chosen["h"], kernel, vocab_size, history_weight=history_weight)
    return {"h": chosen["h"], "objective": objective, "log_likelihood": final.log_likelihood, "top1": final.top1,
            "best_log_likelihood": {"h": by_ll["h"], "log_likelihood": by_ll["log_likelihood"], "top1": by_ll["top1"]},
            "best_top1": {"h": by_top1["h"], "log_likelihood": by_top1["log_likelihood"], "top1": by_top1["top1"]},
            "coverage": final.coverage, "kernel": kernel, "max_neighbors": nb.max_neighbors,
            "history_weight": history_weight,
            "positions": int(nb.queries), "smoothing": SMOOTHING, "median_neighbour_distance": scale,
            "at_grid_edge": kernel != "backoff" and bool(chosen["h"] in (curve[0]["h"], curve[-1]["h"])),
            "log_likelihood_definition": "mean log((1-eps) p_spatial(exact argmax) + eps/V) on the holdout",
            "curve": curve}


@dataclass(frozen=True)
class Fit:
    """Calibrated bandwidth of one set of atoms on held-out queries, with the neighbours it used."""

    neighbours: Neighbours
    calibration: dict  # calibrate_bandwidth's record: h, scores, the whole curve


def fit(atom_positions: np.ndarray, atom_tokens: np.ndarray, atom_weights: np.ndarray | None,
        queries: np.ndarray, targets: np.ndarray, kernel: str, max_neighbors: int, vocab_size: int,
        objective: str = "log-likelihood", decay: float | None = None) -> Fit:
    """KNN of the queries among the atoms, then the bandwidth that best predicts `targets`
    (`decay`: the keys' centroid decay, for the backoff kernel)."""
    nb = nearest_atoms(atom_positions, atom_tokens, atom_weights, queries, max_neighbors, decay=decay)
    return Fit(nb, calibrate_bandwidth(nb, targets, kernel, vocab_size, objective))


def with_given_bandwidth(fitted: Fit, targets: np.ndarray, bandwidth: float, kernel: str,
                         vocab_size: int) -> dict:
    """The calibration record with a user-given h: the curve and calibrated h are kept (as
    'calibrated_h'), the held-out scores are those of the given h."""
    return given_bandwidth(fitted.neighbours, fitted.calibration, targets, bandwidth, kernel, vocab_size)


def given_bandwidth(nb: Neighbours, calibration: dict, targets: np.ndarray, bandwidth: float, kernel: str,
                    vocab_size: int, history_weight: float = 0.0) -> dict:
    """`calibration` (a calibrate_bandwidth record) rescored at a user-given h."""
    given = score(nb, targets, bandwidth, kernel, vocab_size, history_weight=history_weight)
    return {**calibration, "calibrated_h": calibration.get("h"), "h": bandwidth, "given": True,
            "log_likelihood": given.log_likelihood, "top1": given.top1,
            "coverage": given.coverage}
