"""The risk predictor, distilled offline on the calibration half (issue 16).

For every calibration position the build already has the exact model's argmax (the target the
bandwidth is calibrated on) and the spatial path's candidates: the stored KNN neighbours
(projection/calibrate.py) and the context's history atoms (projection/history.py). From those
it computes the step signals of hartonomous.signals (what SQL next_token_signals returns at
inference) and whether the spatial top-1 differs from the exact argmax, and fits a
scikit-learn logistic regression on standardised signals. The result is stored as data with the
atom set (atom_sets.risk_model, hartonomous.risk.RiskModel); inference evaluates it in SQL or
Python without scikit-learn. The comparison the original design distils into a predictor
("spatial vs exact") is thereby paid once, at build time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hartonomous.risk import RiskModel
from hartonomous.signals import FEATURES, candidate_signals, kernel_distribution
from projection import calibrate as cal
from projection.history import history_pairs

REGULARISATION_C = 1.0


@dataclass(frozen=True)
class StepTable:
    """Signals (n x len(FEATURES)) and labels (1: spatial top-1 differs from the exact argmax)."""

    features: np.ndarray
    wrong: np.ndarray


def step_table(stored: cal.Neighbours, chunks: list[np.ndarray], token_positions: np.ndarray,
               window: int | None, decay: float, targets: np.ndarray, kernel: str, bandwidth: float,
               history_weight: float, history_window: int) -> StepTable:
    """The signals and the label of every calibration position (indexed like `targets`)."""
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
    rows, wrong = [], []
    for i in range(stored.queries):
        idx = order[bounds[i]:bounds[i + 1]]
        stored_d = dist[idx][~hist[idx]]
        signals = candidate_signals(tok[idx], dist[idx], w[idx], hist[idx], kernel, bandwidth,
                                    float(stored_d.min()) if len(stored_d) else None)
        unique, probs, _ = kernel_distribution(tok[idx], dist[idx], w[idx], kernel, bandwidth)
        top = int(unique[int(np.argmax(probs))])           # ties: the lowest token id, as next_token
        rows.append([signals.features()[name] for name in FEATURES])
        wrong.append(top != int(targets[i]))
    return StepTable(np.asarray(rows, dtype=np.float64), np.asarray(wrong, dtype=np.int64))


def fit_risk_model(table: StepTable) -> RiskModel | None:
    """A logistic regression of `wrong` on the standardised signals; None when the labels are all
    one class (nothing to learn) or a signal is missing."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

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
    return model.model_copy(update={"calibration_auc": float(roc_auc_score(y, risk))})


def fit_risk(options, loaded, positions: np.ndarray, labelled, atoms, calibrated, history, ui) -> RiskModel | None:
    """The build stage: the predictor of the set as it will be ingested (its h and history weight)."""
    table = step_table(calibrated.neighbours, labelled.calibration_chunks, positions, atoms.centroid.window,
                       atoms.centroid.decay, labelled.calibration_targets, options.kernel, history.bandwidth,
                       history.weight, history.window)
    model = fit_risk_model(table)
    if model is None:
        ui.step("risk predictor: not fitted (the calibration half has a single outcome or a missing signal)")
    else:
        ui.step(f"risk predictor: logistic regression on {model.positions} calibration positions "
                f"(spatial top-1 wrong on {model.base_rate:.3f}), in-sample ROC AUC {model.calibration_auc:.3f}")
    return model
