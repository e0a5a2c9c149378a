"""The build distils the risk predictor on the calibration half and stores it with the atom set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psycopg
import pytest

from hartonomous import sqlcalls
from hartonomous.atomset import load_atom_set
from hartonomous.signals import FEATURES
from projection.risk import StepTable, fit_risk_model
from test_build import corpus_file, options, run_build  # noqa: F401  (module fixture)


def test_the_fit_learns_a_separable_signal_and_refuses_one_class() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, len(FEATURES)))
    wrong = (x[:, 5] + 0.1 * rng.normal(size=400) > 0).astype(int)   # nearest_bandwidths decides
    model = fit_risk_model(StepTable(x, wrong))
    assert model.calibration_auc > 0.95 and model.positions == 400
    assert max(range(len(FEATURES)), key=lambda i: abs(model.coef[i])) == 5
    assert fit_risk_model(StepTable(x, np.zeros(400, dtype=int))) is None


def test_a_context_build_stores_a_predictor_sql_evaluates(server_url: str, corpus_file: Path) -> None:
    result = run_build(server_url, options("tiny-risk", "context", corpus_file, window=3, decay=0.5,
                                           replace=True, target="argmax"))
    with psycopg.connect(server_url, autocommit=True) as conn:
        record = load_atom_set(conn, "tiny-risk")
        model = record.risk_model
        assert model is not None and model.features == list(FEATURES)
        assert model.positions == result.stats.calibration_split.positions
        assert 0 < model.base_rate < 1 and 0.5 <= model.calibration_auc <= 1
        rng = np.random.default_rng(1)
        for _ in range(5):
            context = rng.integers(0, record.vocab_size, 8).tolist()
            signals = sqlcalls.next_token_signals(conn, context, atom_set="tiny-risk")
            assert signals.risk == pytest.approx(model.predict(signals.features()), abs=1e-12)
