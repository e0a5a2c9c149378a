"""The risk predictor and the calibration-gap regression, distilled offline on the calibration half (issue 16).

For every calibration position the build already has the exact model's argmax (the target the
bandwidth is calibrated on) and the spatial path's candidates: the stored KNN neighbours
(projection/calibrate.py) and the context's history atoms (projection/history.py). From those
it computes the step signals of hartonomous.signals (what SQL next_token_signals returns at
inference), whether the spatial top-1 differs from the exact argmax, and the calibration gap of
the original design, NLL - H: -ln p(y) of the text's actual next token y under the spatial
distribution (capped at ln V, V the vocabulary size: a token outside the candidates has p = 0)
minus the distribution's entropy. It fits a scikit-learn logistic regression of the first and a
ridge regression of the second on the same standardised signals. Both are stored as data with
the atom set (atom_sets.risk_model, hartonomous.risk.RiskModel with its `gap`); inference
evaluates them in SQL or Python without scikit-learn. The comparison the original design distils into a predictor
("spatial vs exact") is thereby paid once, at build time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hartonomous.compare.routing import risk_auc
from hartonomous.risk import GapModel, RiskModel
from hartonomous.signals import FEATURES, candidate_signals, kernel_distribution
from projection import calibrate as cal
from projection.atoms import context_values
from projection.history import history_pairs

REGULARISATION_C = 1.0        # logistic regression (scikit-learn's default)
RIDGE_ALPHA = 1.0             # gap regression on standardised signals (scikit-learn's default)


@dataclass(frozen=True)
class StepTable:
    """Signals (n x len(FEATURES)), labels (1: spatial top-1 differs from the exact argmax) and, when
    known, each step's calibration gap NLL - H with the cap its NLL had (ln V)."""

    features: np.ndarray
    wrong: np.ndarray
    gap: np.ndarray | None = None
    nll_cap: float | None = None


def calibration_gap(tokens: np.ndarray, probs: np.ndarray, h: float, actual: int, nll_cap: float) -> float:
    """NLL - H of one step: -ln p(actual) under the distribution (token ids `tokens`, probabilities
    `probs`), at most `nll_cap` (a token it does not list has p = 0), minus its entropy `h`."""
    hit = np.flatnonzero(np.asarray(tokens) == int(actual))
    p = float(probs[hit[0]]) if len(hit) else 0.0
    nll = min(-np.log(p), nll_cap) if p > 0 else nll_cap
    return float(nll - h)


def step_table(stored: cal.Neighbours, chunks: list[np.ndarray], token_positions: np.ndarray,
               window: int | None, decay: float, targets: np.ndarray, kernel: str, bandwidth: float,
               history_weight: float, history_window: int, vocab_size: int | None = None) -> StepTable:
    """The signals, the label and (with `vocab_size`) the calibration gap of every calibration
    position (indexed like `targets`; the actual next tokens are the chunks' own)."""
    q = [stored.query]
    tok, dist = [stored.tokens], [stored.distances]
    w = [np.exp(stored.log_weights)]
    hist = [np.zeros(len(stored.query), dtype=bool)]
    if history_weight > 0 and history_window > 0:
        pairs = history_pairs(chunks, token_positions, window, decay, history_window)
        q.append(pairs.query)
        tok.append(pairs.tokens)
        dist.append(pairs.distances)
        w.append(np.full(len(pairs.query), float(history_weight)))
        hist.append(np.ones(len(pairs.query), dtype=bool))
    q, tok, dist, w, hist = (np.concatenate(a) for a in (q, tok, dist, w, hist))
    order = np.argsort(q, kind="stable")
    bounds = np.searchsorted(q[order], np.arange(stored.queries + 1))
    actual = context_values(chunks, None, "corpus")
    nll_cap = None if vocab_size is None else float(np.log(vocab_size))
    rows, wrong, gap = [], [], []
    for i in range(stored.queries):
        idx = order[bounds[i]:bounds[i + 1]]
        stored_d = dist[idx][~hist[idx]]
        signals = candidate_signals(tok[idx], dist[idx], w[idx], hist[idx], kernel, bandwidth,
                                    float(stored_d.min()) if len(stored_d) else None, decay)
        unique, probs, _ = kernel_distribution(tok[idx], dist[idx], w[idx], kernel, bandwidth, decay)
        top = int(unique[int(np.argmax(probs))])           # ties: the lowest token id, as next_token
        rows.append([signals.features()[name] for name in FEATURES])
        wrong.append(top != int(targets[i]))
        if nll_cap is not None:
            gap.append(calibration_gap(unique, probs, signals.h, int(actual[i]), nll_cap))
    return StepTable(np.asarray(rows, dtype=np.float64), np.asarray(wrong, dtype=np.int64),
                     np.asarray(gap, dtype=np.float64) if nll_cap is not None else None, nll_cap)


def fit_gap_model(x: np.ndarray, gap: np.ndarray, nll_cap: float, mean: np.ndarray, scale: np.ndarray) -> GapModel:
    """A ridge regression of the calibration gap on the signals, standardised by `mean` and `scale`."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score

    fitted = Ridge(alpha=RIDGE_ALPHA).fit((x - mean) / scale, gap)
    model = GapModel(features=list(FEATURES), mean=mean.tolist(), scale=scale.tolist(),
                     coef=fitted.coef_.tolist(), intercept=float(fitted.intercept_), nll_cap=nll_cap,
                     positions=int(len(gap)), mean_gap=float(gap.mean()))
    predicted = np.array([model.predict(dict(zip(FEATURES, row))) for row in x])
    r2 = float(r2_score(gap, predicted)) if np.ptp(gap) > 0 else None     # undefined for a constant gap
    return model.model_copy(update={"calibration_r2": r2})


def fit_risk_model(table: StepTable) -> RiskModel | None:
    """A logistic regression of `wrong` on the standardised signals, with the gap regression when
    the table has gaps; None when the labels are all one class (nothing to learn) or a signal is
    missing."""
    from sklearn.linear_model import LogisticRegression

    x, y = table.features, table.wrong
    if len(np.unique(y)) < 2 or not np.all(np.isfinite(x)):
        return None
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)
    fitted = LogisticRegression(C=REGULARISATION_C, max_iter=1000).fit((x - mean) / scale, y)
    model = RiskModel(features=list(FEATURES), mean=mean.tolist(), scale=scale.tolist(),
                      coef=fitted.coef_[0].tolist(), intercept=float(fitted.intercept_[0]),
                      positions=int(len(y)), base_rate=float(y.mean()))
    risk = np.array([model.predict(dict(zip(FEATURES, row))) for row in x])
    gap = None if table.gap is None else fit_gap_model(x, table.gap, table.nll_cap, mean, scale)
    return model.model_copy(update={"calibration_auc": risk_auc(y, risk), "gap": gap})


def fit_risk(options, loaded, positions: np.ndarray, labelled, atoms, calibrated, history, ui) -> RiskModel | None:
    """The build stage: the predictor of the set as it will be ingested (its h and history weight)."""
    table = step_table(calibrated.neighbours, labelled.calibration_chunks, positions, atoms.centroid.window,
                       atoms.centroid.decay, labelled.calibration_targets, options.kernel, history.bandwidth,
                       history.weight, history.window, loaded.vocab_size)
    model = fit_risk_model(table)
    if model is None:
        ui.step("risk predictor: not fitted (the calibration half has a single outcome or a missing signal)")
    else:
        ui.step(f"risk predictor: logistic regression on {model.positions} calibration positions "
                f"(spatial top-1 wrong on {model.base_rate:.3f}), in-sample ROC AUC {model.calibration_auc:.3f}"
                + ("" if model.gap is None or model.gap.calibration_r2 is None else
                   f"; calibration gap NLL - H: mean {model.gap.mean_gap:.2f} nats, ridge in-sample R^2 "
                   f"{model.gap.calibration_r2:.3f}"))
    return model
