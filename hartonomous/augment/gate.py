"""The gate: λ = σ(w · z + b), a logistic model of features the step already has.

z is the features standardised by the calibration split's means and scales. The gate is fitted by
log-loss of the mixture against the real next token, −log((1 − λ) p_exact(y) + λ p_store(y)), on
the atom set's calibration split only (hartonomous.splits), with a small L2 penalty on w. Features
(one row per step, `feature_row`):

- closeness: −ln(max(D / h, 1e-15)) for the nearest candidate at distance D (h the bandwidth): on
  deep keys the matched suffix's depth (each token deeper is −ln of the contraction more: 4.85
  per token at 1/128; the floor lies below every depth the keys can tell apart);
- exact_match: 1 when D / h ≤ 1e-12 (the key matched to rounding: the whole window);
- ln_mass: ln(1 + the counting candidates' mass) (how much the store saw there);
- store_top, store_entropy: the store distribution's top probability and Shannon entropy (nats);
- history_share, memory_share: the context's own and past generations' share of that mass;
- exact_top, exact_entropy: the same two of the exact model's distribution (T = 1);
- agree: 1 when both distributions' most probable tokens are the same;
- exact_on_store_top: ln of the exact model's probability of the store's most probable token (how
  far the model itself endorses the store's guess; floored at 1e-12).

Version 2 added exact_on_store_top; version 3 lowered closeness's floor from 1e-6 (which made every
match of 4+ tokens on code-src-1e7 look alike) and exact_match's threshold with it. A stored gate
of another version or feature list is refused with how to refit it (docs/augmented.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.optimize import minimize
from scipy.special import entr, expit

FEATURES = ("closeness", "exact_match", "ln_mass", "store_top", "store_entropy", "history_share",
            "memory_share", "exact_top", "exact_entropy", "agree", "exact_on_store_top")
GATE_VERSION = 3
L2 = 1e-3                       # on the standardised coefficients; ~11 of them on 5-8K positions
CLOSENESS_FLOOR = 1e-15         # D / h is floored here for closeness
EXACT_MATCH = 1e-12             # D / h at or below this: the key matched to rounding
PROBABILITY_FLOOR = 1e-300      # p_exact(y) of float32 log-probs can underflow; keeps the log finite
ENDORSEMENT_FLOOR = 1e-12       # exact_on_store_top's floor
MIN_POSITIONS = 2 * (len(FEATURES) + 1)   # fewer calibration positions than this fit no gate


@dataclass(frozen=True)
class Gate:
    """A fitted gate: what `weights` needs, and how it was fitted (stored beside the atom set)."""

    features: tuple[str, ...]
    means: tuple[float, ...]
    scales: tuple[float, ...]
    coefficients: tuple[float, ...]
    intercept: float
    calibration_loss: float          # mean log-loss of the mixture on the calibration positions
    exact_loss: float                # the exact model's alone, same positions
    positions: int
    split: str = "calibration"
    version: int = GATE_VERSION
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.features)
        if not (len(self.means) == len(self.scales) == len(self.coefficients) == n):
            raise ValueError("a gate needs one mean, scale and coefficient per feature")
        values = (*self.means, *self.scales, *self.coefficients, self.intercept)
        if not all(math.isfinite(v) for v in values) or not all(s > 0 for s in self.scales):
            raise ValueError("a gate's means, coefficients and intercept must be finite and its scales > 0")

    def weights(self, rows: np.ndarray) -> np.ndarray:
        """λ for each feature row (n, features) -> (n,)."""
        z = (np.asarray(rows, dtype=np.float64) - np.asarray(self.means)) / np.asarray(self.scales)
        return expit(z @ np.asarray(self.coefficients) + self.intercept)

    def weight(self, row: np.ndarray) -> float:
        return float(self.weights(np.asarray(row, dtype=np.float64)[None])[0])

    def as_dict(self) -> dict:
        out = asdict(self)
        out["features"] = list(self.features)
        return out


def exact_side(exact_probs: np.ndarray, other_top: int | None, entropy: float | None = None) -> list[float]:
    """The features read from the exact model's distribution (V,) at T = 1, given the other
    distribution's most probable token (None: it has none): exact_top, exact_entropy, agree,
    exact_on_store_top. `entropy`: the distribution's Shannon entropy when the caller has it (the
    augmented backend gets it from the logits for one dot product). Shared with the counting
    baseline's gate (hartonomous.compare.counting)."""
    exact_probs = np.asarray(exact_probs, dtype=np.float64)
    e_top_id = int(np.argmax(exact_probs))
    h = float(entr(exact_probs).sum()) if entropy is None else float(entropy)
    if other_top is None:
        return [float(exact_probs[e_top_id]), h, 0.0, math.log(ENDORSEMENT_FLOOR)]
    return [float(exact_probs[e_top_id]), h, float(other_top == e_top_id),
            math.log(max(float(exact_probs[other_top]), ENDORSEMENT_FLOOR))]


def feature_row(step, exact_probs: np.ndarray, exact_entropy: float | None = None) -> np.ndarray:
    """The gate's features (FEATURES order) for one step: `step` a hartonomous.store.StoreStep,
    `exact_probs` the exact model's full distribution at T = 1 (V,) (and its entropy, if known)."""
    if not step.token_ids:
        return np.array([0.0] * 7 + exact_side(exact_probs, None, exact_entropy))
    probs = np.asarray(step.probabilities, dtype=np.float64)
    s_top_id = int(step.token_ids[int(np.argmax(probs))])      # ascending ids: ties -> lowest id
    near = step.nearest_bandwidths if step.nearest_bandwidths is not None else math.inf
    closeness = -math.log(max(near, CLOSENESS_FLOOR)) if math.isfinite(near) else -math.log(1e6)
    return np.array([closeness, float(near <= EXACT_MATCH), math.log1p(max(step.matched_mass or 0.0, 0.0)),
                     float(step.top_probability), float(step.entropy), float(step.history_share or 0.0),
                     float(step.memory_share or 0.0), *exact_side(exact_probs, s_top_id, exact_entropy)])


def mixture_loss(lam: np.ndarray, p_exact: np.ndarray, p_store: np.ndarray) -> np.ndarray:
    """Per-position log-loss of (1 − λ) p_exact(y) + λ p_store(y)."""
    return -np.log(np.maximum((1 - lam) * p_exact + lam * p_store, PROBABILITY_FLOOR))


def fit_gate(rows: np.ndarray, p_exact: np.ndarray, p_store: np.ndarray, *, l2: float = L2,
             split: str = "calibration") -> Gate:
    """Fit a gate on calibration positions: features (n, F), and each position's real next token's
    probability under the exact model (p_exact) and the store (p_store, 0 outside its support)."""
    x = np.asarray(rows, dtype=np.float64)
    a = np.maximum(np.asarray(p_exact, dtype=np.float64), PROBABILITY_FLOOR)
    b = np.asarray(p_store, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != len(FEATURES) or len(a) != len(x) or len(b) != len(x):
        raise ValueError(f"fit_gate needs (n, {len(FEATURES)}) features and n target probabilities")
    if len(x) < MIN_POSITIONS:
        raise ValueError(f"fitting a gate needs at least {MIN_POSITIONS} positions, got {len(x)}")
    if not (np.isfinite(x).all() and np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("the gate's features and target probabilities must be finite")
    means = x.mean(axis=0)
    scales = x.std(axis=0)
    scales = np.where(scales > 1e-12, scales, 1.0)
    z = (x - means) / scales

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, c = theta[:-1], theta[-1]
        lam = expit(z @ w + c)
        mix = np.maximum((1 - lam) * a + lam * b, PROBABILITY_FLOOR)
        d_lam = -(b - a) / mix * lam * (1 - lam) / len(x)            # d loss / d logit, per position
        value = float(-np.log(mix).mean() + 0.5 * l2 * w @ w)
        grad = np.concatenate([z.T @ d_lam + l2 * w, [d_lam.sum()]])
        return value, grad

    start = np.zeros(len(FEATURES) + 1)
    start[-1] = -2.0                                               # λ ≈ 0.12: trust the model first
    best = minimize(loss, start, jac=True, method="L-BFGS-B")
    w, c = best.x[:-1], float(best.x[-1])
    lam = expit(z @ w + c)
    return Gate(FEATURES, tuple(means.tolist()), tuple(scales.tolist()), tuple(w.tolist()), c,
                calibration_loss=float(mixture_loss(lam, a, b).mean()),
                exact_loss=float(-np.log(a).mean()), positions=len(x), split=split)
