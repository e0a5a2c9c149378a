"""Per-step signals of the spatial path, in NumPy: the definition `next_token_signals` computes in SQL.

The distribution signals (H, H2, varentropy, R) are those of the comparison reports
(`hartonomous.entropy`), read from the kernel's own distribution: next_token at temperature 1
with top-k, top-p and the repetition penalty off, so they do not depend on the sampler a
caller uses. The geometric signals are the spatial path's own:

- nearest_bandwidths: distance from the context centroid to the nearest stored atom, in
  bandwidths (how far the stored data is, in kernel widths);
- history_share: the history atoms' share of the kernel mass sum w K(d) over every candidate;
- distinct_tokens: how many distinct tokens the candidates vote for;

and the support of the distribution's top token t (largest mass, ties: the lowest token id, as
greedy next_token), in logs so that near-zero distances stay on a usable scale:

- ln_top_nearest_bandwidths: ln(distance of t's nearest candidate / bandwidth + 0.01);
- ln_top_stored_votes: ln(1 + how many stored candidates vote for t);
- ln_top_history_nearest_bandwidths: ln(min(10, distance of t's nearest history atom / bandwidth)
  + 0.01), ln(10.01) when no history atom votes for t.

These three were added after a measurement of candidate signals
(docs/results/2026-11-24-risk-features.md).

sql/050_signals.sql has the same definitions; tests compare the two.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from hartonomous.entropy import renyi2, shannon, varentropy

FEATURES = ("h", "h2", "varentropy", "r", "top_probability", "nearest_bandwidths", "history_share",
            "distinct_tokens", "ln_top_nearest_bandwidths", "ln_top_stored_votes", "ln_top_history_nearest_bandwidths")
DISTANCE_OFFSET = 0.01          # bandwidths added before the log of a top-token distance
HISTORY_DISTANCE_CAP = 10.0     # bandwidths; also the value when the top token has no history atom


@dataclass(frozen=True)
class StepSignals:
    """One step's signals (the columns of SQL next_token_signals); `risk` and `predicted_gap` are the
    atom set's predictors' (hartonomous.risk), or None."""

    h: float | None
    h2: float | None
    varentropy: float | None
    r: float | None
    top_probability: float | None
    nearest_bandwidths: float | None
    history_share: float | None
    distinct_tokens: int | None               # None on the exact path (it has no neighbours)
    ln_top_nearest_bandwidths: float | None = None
    ln_top_stored_votes: float | None = None
    ln_top_history_nearest_bandwidths: float | None = None
    risk: float | None = None
    predicted_gap: float | None = None        # predicted NLL - H of the spatial distribution (nats)

    def features(self) -> dict[str, float | None]:
        """The predictors' inputs, by name (everything but their outputs)."""
        return {name: getattr(self, name) for name in FEATURES}

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def distribution_signals(p: np.ndarray) -> dict[str, float]:
    """H, H2, varentropy, R and the top probability of a distribution (nats)."""
    h, h2, v = shannon(p), renyi2(p), varentropy(p)
    return {"h": h, "h2": h2, "varentropy": v, "r": h2 - (h - 0.5 * v), "top_probability": float(np.max(p))}


def kernel_distribution(tokens: np.ndarray, distances: np.ndarray, weights: np.ndarray, kernel: str,
                        bandwidth: float, decay: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token ids ascending, their probabilities, each candidate's share of the kernel mass): the
    kernel's own distribution over the candidates (next_token at T = 1, no top-k/top-p/penalty);
    `decay` is the set's centroid decay, which the backoff kernel needs."""
    from hartonomous.kernel import backoff_radius, log_contributions      # scipy: imported where it is used

    radius = backoff_radius(np.min(distances), bandwidth, decay) if kernel == "backoff" else None
    contrib = log_contributions(distances, weights, kernel, bandwidth, radius=radius)
    mass = np.exp(contrib - contrib.max())
    unique, inverse = np.unique(np.asarray(tokens), return_inverse=True)
    per_token = np.bincount(inverse, weights=mass, minlength=len(unique))
    voted = per_token > 0 if kernel == "backoff" else slice(None)   # backoff: tokens outside the radius drop out
    return unique[voted], per_token[voted] / per_token.sum(), mass / mass.sum()


def candidate_signals(tokens: np.ndarray, distances: np.ndarray, weights: np.ndarray, history: np.ndarray,
                      kernel: str, bandwidth: float, nearest_stored: float | None,
                      decay: float | None = None) -> StepSignals:
    """The signals of one step from its candidate atoms (stored and history, after search_radius):
    their tokens, distances to the centroid, weights and which are history atoms; `nearest_stored`
    is the distance to the nearest stored atom (before search_radius)."""
    nearest = None if nearest_stored is None else float(nearest_stored) / bandwidth
    if len(tokens) == 0:
        return StepSignals(None, None, None, None, None, nearest, None, 0)
    tokens, distances = np.asarray(tokens), np.asarray(distances, dtype=np.float64)
    history, weights = np.asarray(history, dtype=bool), np.asarray(weights, dtype=np.float64)
    if kernel == "backoff":      # only the candidates inside the radius vote (next_token_signals)
        from hartonomous.kernel import backoff_radius

        inside = distances <= backoff_radius(distances.min(), bandwidth, decay)
        tokens, distances, weights, history = tokens[inside], distances[inside], weights[inside], history[inside]
    unique, probs, share = kernel_distribution(tokens, distances, weights, kernel, bandwidth, decay)
    top = tokens == unique[int(np.argmax(probs))]           # argmax: the first, i.e. lowest id, of ties
    top_history = distances[top & history]
    return StepSignals(**distribution_signals(probs), nearest_bandwidths=nearest,
                       history_share=float(share[history].sum()), distinct_tokens=len(unique),
                       ln_top_nearest_bandwidths=float(np.log(distances[top].min() / bandwidth + DISTANCE_OFFSET)),
                       ln_top_stored_votes=float(np.log1p(np.count_nonzero(top & ~history))),
                       ln_top_history_nearest_bandwidths=float(np.log(min(
                           HISTORY_DISTANCE_CAP, top_history.min() / bandwidth if len(top_history) else
                           HISTORY_DISTANCE_CAP) + DISTANCE_OFFSET)))
