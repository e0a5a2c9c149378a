"""Per-step signals (SQL next_token_signals vs the NumPy definition) and the predictors (SQL
ht_risk and ht_linear vs hartonomous.risk.RiskModel and its GapModel), on a real PostGIS inside
one rolled-back transaction."""

from __future__ import annotations

import json
import math

import numpy as np
import psycopg
import pytest

from hartonomous import sqlcalls
from hartonomous.risk import GapModel, RiskModel
from hartonomous.signals import FEATURES, StepSignals, candidate_signals, distribution_signals
from hartonomous.sqlcalls import SpatialArgs
from reference_next_token import AtomSetData, reference_candidates
from hand_sets import add_set
from test_sql_next_token import db, ref_sets  # noqa: F401  (module fixtures)

TOL = 1e-9


def reference_signals(s: AtomSetData, context: list[int], search_radius=None, max_neighbors=100,
                      history_weight=None, history_window=None) -> tuple[StepSignals, bool]:
    cand = reference_candidates(s, context, search_radius, max_neighbors, history_weight, history_window)
    weight = s.history_weight if history_weight is None else history_weight
    weights = np.where(cand.history, weight, cand.weights)
    return candidate_signals(cand.tokens, cand.distances, weights, cand.history, s.kernel, s.bandwidth,
                             cand.nearest_stored), cand.near


def assert_signals_equal(got: StepSignals, want: StepSignals) -> None:
    for name in FEATURES:
        g, w = getattr(got, name), getattr(want, name)
        assert (g is None) == (w is None), name
        if w is not None:
            assert g == pytest.approx(w, abs=TOL, rel=TOL), name


def test_two_tokens_by_hand(db) -> None:
    """Token 1: one atom at distance 1; token 2: atoms at distance 2 and 1 (weight 2); h = 1."""
    s = AtomSetData(name="sigtest_hand", token_positions=np.zeros((3, 3)), atom_tokens=np.array([1, 2, 2]),
                    atom_positions=np.array([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 1.0]]),
                    atom_weights=np.array([1.0, 1.0, 2.0]), bandwidth=1.0)
    add_set(db, s)
    a, b = math.exp(-1), math.exp(-4) + 2 * math.exp(-1)
    p = np.array([a, b]) / (a + b)
    h = -(p * np.log(p)).sum()
    v = (p * (np.log(p) + h) ** 2).sum()
    h2 = -math.log((p ** 2).sum())
    got = sqlcalls.next_token_signals(db, [0], atom_set=s.name, prepare=False)
    assert got.h == pytest.approx(h, abs=1e-12)
    assert got.h2 == pytest.approx(h2, abs=1e-12)
    assert got.varentropy == pytest.approx(v, abs=1e-12)
    assert got.r == pytest.approx(h2 - (h - v / 2), abs=1e-12)
    assert got.top_probability == pytest.approx(p.max(), abs=1e-12)
    assert got.nearest_bandwidths == pytest.approx(1.0)
    assert (got.history_share, got.distinct_tokens, got.risk, got.predicted_gap) == (0.0, 2, None, None)
    # the top token is 2: its nearest candidate at 1 bandwidth, 2 stored votes, no history atom
    assert got.ln_top_nearest_bandwidths == pytest.approx(math.log(1.01), abs=1e-12)
    assert got.ln_top_stored_votes == pytest.approx(math.log(3), abs=1e-12)
    assert got.ln_top_history_nearest_bandwidths == pytest.approx(math.log(10.01), abs=1e-12)


@pytest.mark.parametrize("which", ["gauss", "expo", "steep", "slow", "long"])
def test_sql_signals_match_the_numpy_definition(db, ref_sets, which: str) -> None:
    s = ref_sets[which]
    rng = np.random.default_rng(7)
    checked = 0
    for trial in range(12):
        context = rng.integers(0, s.vocab_size, int(rng.integers(1, 30))).tolist()
        args = dict(search_radius=[None, 0.3][trial % 2], max_neighbors=int(rng.integers(1, 120)),
                    history_weight=[None, 0.0, 2.0][trial % 3], history_window=[None, 4][trial % 2])
        want, near = reference_signals(s, context, **args)
        if near:
            continue
        got = sqlcalls.next_token_signals(db, context, SpatialArgs(**args), s.name, prepare=False)
        assert_signals_equal(got, want)
        assert got.distinct_tokens == want.distinct_tokens
        checked += 1
    assert checked >= 8


def test_history_share_is_the_history_atoms_share_of_the_kernel_mass(db, ref_sets) -> None:
    s = ref_sets["expo"]                              # its own history atoms are on (weight 1.5)
    context = [3, 9, 3, 9, 3, 9, 3]
    on = sqlcalls.next_token_signals(db, context, atom_set=s.name, prepare=False)
    off = sqlcalls.next_token_signals(db, context, SpatialArgs(history_weight=0), s.name, prepare=False)
    heavy = sqlcalls.next_token_signals(db, context, SpatialArgs(history_weight=1e6), s.name, prepare=False)
    assert off.history_share == 0.0
    assert 0 < on.history_share < heavy.history_share <= 1
    assert heavy.history_share > 0.99


def test_no_candidates_gives_null_distribution_signals(db, ref_sets) -> None:
    s = ref_sets["gauss"]
    got = sqlcalls.next_token_signals(db, [1, 2], SpatialArgs(search_radius=1e-9), s.name, prepare=False)
    assert (got.h, got.top_probability, got.history_share, got.distinct_tokens) == (None, None, None, 0)
    assert got.nearest_bandwidths is not None


@pytest.mark.parametrize("call, name", [
    ("next_token_signals(ARRAY[1], max_neighbors => 0, atom_set => 'sqltest_gauss')", "max_neighbors"),
    ("next_token_signals(ARRAY[1], search_radius => -1, atom_set => 'sqltest_gauss')", "search_radius"),
    ("next_token_signals(ARRAY[1], history_window => 5000, atom_set => 'sqltest_gauss')", "history_window"),
    ("next_token_signals(ARRAY[]::integer[], atom_set => 'sqltest_gauss')", "context"),
    ("next_token_signals(ARRAY[1], atom_set => 'no such set')", "atom_set"),
])
def test_bad_input_raises_22023_naming_the_argument(db, ref_sets, call: str, name: str) -> None:
    db.execute("SAVEPOINT bad")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
        db.execute(f"SELECT * FROM {call}")
    db.execute("ROLLBACK TO SAVEPOINT bad")
    assert err.value.diag.message_primary.startswith(name)


# --- the risk predictor: one formula in SQL and Python --------------------------------------------

def random_linear(rng: np.random.Generator, scale: float = 1.0) -> dict:
    n = len(FEATURES)
    return dict(features=list(FEATURES), mean=rng.normal(size=n).tolist(), scale=rng.uniform(0.1, 3, n).tolist(),
                coef=(scale * rng.normal(size=n)).tolist(), intercept=float(rng.normal()))


def random_model(rng: np.random.Generator, scale: float = 1.0, gap: bool = False) -> RiskModel:
    return RiskModel(**random_linear(rng, scale),
                     gap=GapModel(**random_linear(rng), nll_cap=math.log(50)) if gap else None)


def test_ht_risk_equals_risk_model_predict(db) -> None:
    rng = np.random.default_rng(3)
    for trial in range(40):
        model = random_model(rng, scale=[0.3, 3.0, 300.0][trial % 3])   # saturated logits included
        features = {name: float(x) for name, x in zip(FEATURES, rng.normal(scale=2, size=len(FEATURES)))}
        (got,) = db.execute("SELECT ht_risk(%s::jsonb, %s::jsonb)",
                            (model.model_dump_json(), json.dumps(features))).fetchone()
        assert got == pytest.approx(model.predict(features), abs=1e-12)
    missing = {name: 1.0 for name in FEATURES[1:]}
    assert db.execute("SELECT ht_risk(%s::jsonb, %s::jsonb)",
                      (model.model_dump_json(), json.dumps(missing))).fetchone() == (None,)
    assert model.predict(missing) is None


def test_ht_linear_equals_the_gap_models_prediction(db) -> None:
    rng = np.random.default_rng(4)
    for _ in range(20):
        model = GapModel(**random_linear(rng, scale=3.0), nll_cap=math.log(50))
        features = {name: float(x) for name, x in zip(FEATURES, rng.normal(scale=2, size=len(FEATURES)))}
        (got,) = db.execute("SELECT ht_linear(%s::jsonb, %s::jsonb)",
                            (model.model_dump_json(), json.dumps(features))).fetchone()
        assert got == pytest.approx(model.predict(features), rel=1e-12, abs=1e-12)
    for absent in ("null", None):                  # a risk model without a gap model: NULL, not an error
        assert db.execute("SELECT ht_linear(%s::jsonb, '{}'::jsonb)", (absent,)).fetchone() == (None,)


def test_next_token_signals_applies_the_atom_sets_predictor(db, ref_sets) -> None:
    s = ref_sets["expo"]
    model = random_model(np.random.default_rng(5), gap=True)
    db.execute("UPDATE atom_sets SET risk_model = %s::jsonb WHERE name = %s", (model.model_dump_json(), s.name))
    for context in ([1], [4, 8, 15, 16, 23, 42 % s.vocab_size], [5, 5, 5, 5]):
        got = sqlcalls.next_token_signals(db, context, atom_set=s.name, prepare=False)
        assert got.risk == pytest.approx(model.predict(got.features()), abs=1e-12)
        assert 0 < got.risk < 1
        assert got.predicted_gap == pytest.approx(model.predict_gap(got.features()), rel=1e-12, abs=1e-12)


def test_a_predictor_without_gap_model_gives_no_predicted_gap(db, ref_sets) -> None:
    s = ref_sets["expo"]
    model = random_model(np.random.default_rng(6))
    db.execute("UPDATE atom_sets SET risk_model = %s::jsonb WHERE name = %s", (model.model_dump_json(), s.name))
    got = sqlcalls.next_token_signals(db, [1, 2], atom_set=s.name, prepare=False)
    assert got.risk is not None and got.predicted_gap is None and model.predict_gap(got.features()) is None


def test_risk_model_rejects_inconsistent_data() -> None:
    with pytest.raises(ValueError, match="same non-zero length"):
        RiskModel(features=["h"], mean=[0.0, 1.0], scale=[1.0], coef=[1.0], intercept=0.0)
    with pytest.raises(ValueError, match="scale"):
        RiskModel(features=["h"], mean=[0.0], scale=[0.0], coef=[1.0], intercept=0.0)
    with pytest.raises(ValueError, match="GapModel: features, mean, scale and coef"):
        RiskModel(features=["h"], mean=[0.0], scale=[1.0], coef=[1.0], intercept=0.0,
                  gap={"features": ["h", "r"], "mean": [0.0], "scale": [1.0], "coef": [1.0], "intercept": 0.0,
                       "nll_cap": 1.0})


def test_distribution_signals_of_a_uniform_distribution() -> None:
    got = distribution_signals(np.full(4, 0.25))
    assert got["h"] == pytest.approx(math.log(4)) and got["h2"] == pytest.approx(math.log(4))
    assert got["varentropy"] == pytest.approx(0.0, abs=1e-15) and got["r"] == pytest.approx(0.0, abs=1e-15)



def test_reinstalling_upgrades_a_next_token_signals_without_predicted_gap(scratch_database: str) -> None:
    """A database installed before the gap column: drift is found, and the reinstall replaces the
    function (CREATE OR REPLACE alone cannot change the result columns)."""
    from hartonomous.db import migrate

    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database) as conn:
        conn.execute("DROP FUNCTION next_token_signals(integer[], double precision, integer, text, "
                     "double precision, integer)")
        conn.execute("CREATE FUNCTION next_token_signals(context integer[], search_radius double precision, "
                     "max_neighbors integer, atom_set text, history_weight double precision, history_window "
                     "integer) RETURNS TABLE(h double precision, risk double precision) LANGUAGE sql "
                     "AS 'SELECT 1.0::float8, NULL::float8'")
    assert any("next_token_signals" in line for line in migrate.function_drift(scratch_database))
    migrate.reinstall_sql_functions(scratch_database)
    assert migrate.function_drift(scratch_database) == []
    with psycopg.connect(scratch_database) as conn:
        (names,) = conn.execute("SELECT proargnames FROM pg_proc WHERE proname = 'next_token_signals'").fetchone()
    assert "predicted_gap" in names
