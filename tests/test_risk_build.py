"""The build distils the risk predictor and the calibration-gap regression on the calibration half
and stores them with the atom set."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import psycopg
import pytest

from hartonomous import sqlcalls
from hartonomous.atomset import load_atom_set
from hartonomous.signals import FEATURES
from projection.risk import StepTable, calibration_gap, fit_risk_model
from test_build import corpus_file, options, run_build  # noqa: F401  (module fixture)


def test_the_fit_learns_a_separable_signal_and_refuses_one_class() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, len(FEATURES)))
    wrong = (x[:, 5] + 0.1 * rng.normal(size=400) > 0).astype(int)   # nearest_bandwidths decides
    model = fit_risk_model(StepTable(x, wrong))
    assert model.calibration_auc > 0.95 and model.positions == 400
    assert max(range(len(FEATURES)), key=lambda i: abs(model.coef[i])) == 5
    assert fit_risk_model(StepTable(x, np.zeros(400, dtype=int))) is None
    assert model.gap is None                                    # no gaps in the table: no gap model


def test_the_calibration_gap_is_the_capped_nll_of_the_actual_token_minus_the_entropy() -> None:
    tokens, probs = np.array([3, 7, 9]), np.array([0.5, 0.25, 0.25])
    h = -(probs * np.log(probs)).sum()
    assert calibration_gap(tokens, probs, h, 7, nll_cap=10.0) == pytest.approx(math.log(4) - h)
    assert calibration_gap(tokens, probs, h, 3, nll_cap=10.0) == pytest.approx(math.log(2) - h)
    assert calibration_gap(tokens, probs, h, 8, nll_cap=10.0) == pytest.approx(10.0 - h)     # not a candidate
    assert calibration_gap(tokens, probs, h, 7, nll_cap=1.0) == pytest.approx(1.0 - h)       # capped


def test_the_gap_regression_recovers_a_linear_gap() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(600, len(FEATURES)))
    wrong = (x[:, 0] + rng.normal(size=600) > 0).astype(int)
    gap = 1.5 + 2.0 * x[:, 1] - 0.5 * x[:, 6] + 0.05 * rng.normal(size=600)
    model = fit_risk_model(StepTable(x, wrong, gap, nll_cap=math.log(50)))
    assert model.gap is not None and model.gap.positions == 600 and model.gap.nll_cap == pytest.approx(math.log(50))
    assert model.gap.calibration_r2 > 0.99 and model.gap.mean_gap == pytest.approx(gap.mean())
    row = dict(zip(FEATURES, x[0]))
    assert model.predict_gap(row) == pytest.approx(gap[0], abs=0.3)
    coef = np.array(model.gap.coef) / np.array(model.gap.scale)        # per unit of the raw signal
    assert coef[1] == pytest.approx(2.0, abs=0.05) and coef[6] == pytest.approx(-0.5, abs=0.05)


def test_a_context_build_stores_a_predictor_sql_evaluates(server_url: str, corpus_file: Path) -> None:
    result = run_build(server_url, options("tiny-risk", "context", corpus_file, window=3, decay=0.5,
                                           replace=True, target="argmax"))
    with psycopg.connect(server_url, autocommit=True) as conn:
        record = load_atom_set(conn, "tiny-risk")
        model = record.risk_model
        assert model is not None and model.features == list(FEATURES)
        assert model.positions == result.stats.calibration_split.positions
        assert 0 < model.base_rate < 1 and 0.5 <= model.calibration_auc <= 1
        gap = model.gap
        assert gap is not None and gap.features == list(FEATURES) and gap.positions == model.positions
        assert gap.nll_cap == pytest.approx(math.log(record.vocab_size))
        assert -gap.nll_cap <= gap.mean_gap <= gap.nll_cap and gap.calibration_r2 <= 1
        rng = np.random.default_rng(1)
        for _ in range(5):
            context = rng.integers(0, record.vocab_size, 8).tolist()
            signals = sqlcalls.next_token_signals(conn, context, atom_set="tiny-risk")
            assert signals.risk == pytest.approx(model.predict(signals.features()), abs=1e-12)
            assert signals.predicted_gap == pytest.approx(model.predict_gap(signals.features()), rel=1e-9, abs=1e-9)
