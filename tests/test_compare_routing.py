"""The report's risk and hybrid-routing section (hartonomous/compare/routing.py): the ROC AUC and the
routing curve on toy risks with hand-computed values, and the section of a real compare run on the
tiny model (a hand-made context set with a hand-written risk predictor, and one without)."""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest

from hartonomous import sqlcalls
from hartonomous.compare import CompareOptions, run_compare
from hartonomous.compare.render import to_html, to_markdown
from hartonomous.compare.routing import (FRACTIONS, MISSING_RISK, StepCosts, risk_auc, risk_threshold,
                                         routing_curve)
from hartonomous.compare.schema import validate_report
from hartonomous.risk import RiskModel
from hartonomous.sqlcalls import SpatialArgs
from test_compare_report import STATS, TEST, _drop, encode, write_context_set
from tiny_model import tiny_model

# Ten steps, riskiest first; the spatial top-1 is wrong at steps 0, 2 and 7 (top-1 agreement 0.7).
RISK = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1, 0.05])
RIGHT = np.array([False, True, False, True, True, True, True, False, True, True])


# --- the evaluation, by hand --------------------------------------------------------------------

def test_auc_counts_the_correctly_ordered_wrong_right_pairs() -> None:
    # wrong {0.9, 0.7, 0.2} against right {0.8, 0.6, 0.5, 0.4, 0.3, 0.1, 0.05}: 7 + 6 + 2 = 15 of 21 pairs
    assert risk_auc(~RIGHT, RISK) == pytest.approx(15 / 21)
    assert risk_auc([True, False], [0.4, 0.4]) == 0.5            # a tie counts half
    assert risk_auc([True, False, True], [0.9, 0.1, 0.8]) == 1.0
    assert risk_auc([False, False], [0.1, 0.9]) is None          # one class: undefined


def test_auc_is_scikit_learns_roc_auc() -> None:
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    for n in (2, 7, 200):
        wrong = np.arange(n) % 2 == 0
        risk = rng.integers(0, 5, size=n) / 4.0           # many ties
        assert risk_auc(wrong, risk) == pytest.approx(roc_auc_score(wrong, risk))


def test_curve_by_hand() -> None:
    points = {p.fraction: p for p in routing_curve(RISK, RIGHT, (0.0, 0.2, 0.5, 1.0))}
    # 20 %: steps 0 and 1 go exact (threshold 0.8); steps 3-6, 8, 9 are right on the spatial path
    assert points[0.2].threshold == 0.8 and points[0.2].fraction_exact == 0.2
    assert points[0.2].agreement == pytest.approx(0.8)
    assert points[0.2].random_agreement == pytest.approx(0.2 + 0.8 * 0.7)
    assert points[0.2].perfect_agreement == pytest.approx(0.9)
    # 50 %: steps 0-4 exact (threshold 0.5); of 5-9 only step 7 is wrong
    assert points[0.5].threshold == 0.5 and points[0.5].agreement == pytest.approx(0.9)
    assert points[0.5].random_agreement == pytest.approx(0.85) and points[0.5].perfect_agreement == 1.0


def test_curve_endpoints_are_the_pure_paths() -> None:
    first, *_, last = routing_curve(RISK, RIGHT)
    assert (first.fraction, first.threshold, first.fraction_exact) == (0.0, math.inf, 0.0)
    assert first.agreement == first.random_agreement == first.perfect_agreement == pytest.approx(0.7)
    assert (last.fraction, last.threshold, last.fraction_exact) == (1.0, 0.0, 1.0)
    assert last.agreement == last.random_agreement == last.perfect_agreement == 1.0


def test_a_risk_that_knows_the_wrong_steps_is_the_perfect_router() -> None:
    oracle = np.where(RIGHT, 0.1, 0.9) + np.linspace(0, 0.01, len(RIGHT))    # no ties
    for point in routing_curve(oracle, RIGHT):
        assert point.agreement == pytest.approx(point.perfect_agreement)
        assert point.agreement >= point.random_agreement


def test_random_routing_is_the_expectation_of_random_draws_and_linear_in_the_fraction() -> None:
    rng = np.random.default_rng(1)
    for point in routing_curve(RISK, RIGHT):
        k = round(point.fraction_exact * len(RIGHT))
        draws = [np.mean(np.isin(np.arange(len(RIGHT)), rng.choice(len(RIGHT), k, replace=False)) | RIGHT)
                 for _ in range(4000)]
        assert point.random_agreement == pytest.approx(np.mean(draws), abs=0.01)
        # on the straight line from (0, spatial top-1) to (1, 1)
        assert point.random_agreement == pytest.approx(0.7 + point.fraction_exact * (1 - 0.7))


def test_ties_at_the_threshold_all_go_to_the_exact_model_as_in_the_hybrid_path() -> None:
    risk = np.array([0.5, 0.5, 0.5, 0.1])
    assert risk_threshold(risk, 0.25) == 0.5
    (point,) = routing_curve(risk, np.array([False, True, True, False]), (0.25,))
    assert point.fraction_exact == 0.75 and point.agreement == 0.75


def test_a_missing_risk_ranks_first() -> None:
    (point,) = routing_curve([0.2, None, float("nan"), 0.9], [True, False, False, True], (0.5,))
    assert point.threshold == MISSING_RISK and point.agreement == 1.0


def test_step_costs_by_hand() -> None:
    costs = StepCosts(spatial_ms=2.0, signals_ms=3.0, exact_ms=50.0)
    assert costs.risk_routed_ms(math.inf, 0.0) == 2.0          # the spatial path: no risk computed
    assert costs.risk_routed_ms(0.0, 1.0) == 50.0              # the exact path
    assert costs.risk_routed_ms(0.6, 0.3) == pytest.approx(3.0 + 0.7 * 2.0 + 0.3 * 50.0)
    assert costs.direct_ms(0.3) == pytest.approx(0.7 * 2.0 + 0.3 * 50.0)
    with pytest.raises(ValueError, match="fraction"):
        risk_threshold(RISK, 1.5)


# --- the section of a real compare run ---------------------------------------------------------

# The flatter the spatial distribution, the riskier the step (as in test_hybrid.py).
PREDICTOR = RiskModel(features=["top_probability"], mean=[0.5], scale=[0.2], coef=[-2.0], intercept=0.0,
                      positions=40, base_rate=0.6, calibration_auc=0.7)
MAX_NEIGHBORS = 20


def _compare(url: str, name: str) -> dict:
    model, tokenizer = tiny_model(0)
    options = CompareOptions(atom_set=name, max_positions=30, generation=False, distill_tokens=0,
                             query_samples=2, max_neighbors=MAX_NEIGHBORS)
    with psycopg.connect(url, autocommit=True) as conn:
        return run_compare(conn, options, model=model, tokenizer=tokenizer, model_name="tiny").report


@pytest.fixture(scope="module")
def with_predictor(server_url):
    name = write_context_set(server_url, STATS)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("UPDATE atom_sets SET risk_model = %s::jsonb WHERE name = %s",
                     (PREDICTOR.model_dump_json(), name))
    yield name, _compare(server_url, name)
    _drop(server_url, name)


@pytest.fixture(scope="module")
def without_predictor(server_url):
    name = write_context_set(server_url, STATS)
    yield name, _compare(server_url, name)
    _drop(server_url, name)


def test_the_section_is_in_the_json_and_valid(with_predictor) -> None:
    _, report = with_predictor
    validate_report(report)
    routing = report["routing"]
    assert routing["available"] is True
    assert routing["positions"] == report["fidelity"]["positions"] == 30
    assert [p["fraction"] for p in routing["curve"]] == pytest.approx(list(FRACTIONS))
    assert routing["risk_model"]["features"] == ["top_probability"]
    assert routing["step_costs"]["spatial"]["n"] == routing["step_costs"]["signals"]["n"] == 30
    assert 1 <= routing["step_costs"]["exact"]["n"] <= 64
    assert all(routing["step_costs"][k]["ms_p50"] > 0 for k in ("spatial", "signals", "exact"))


def test_auc_uses_the_risk_next_token_signals_gives_at_each_scored_position(with_predictor, server_url) -> None:
    """Recomputed independently: SQL next_token_signals on the whole context (the hybrid path sends a
    cut one, with the same result), the predictor in Python, the label from the report's own
    per-position spatial top-1."""
    name, report = with_predictor
    ids = encode(tiny_model(0)[1], TEST)
    rows = report["fidelity"]["per_position"]
    with psycopg.connect(server_url, autocommit=True) as conn:
        risk = [PREDICTOR.predict(sqlcalls.next_token_signals(conn, ids[: r["position"] + 1],
                                                              SpatialArgs(max_neighbors=MAX_NEIGHBORS),
                                                              name).features()) for r in rows]
    wrong = [r["top1"] == 0 for r in rows]
    assert 0 < sum(wrong) < len(wrong)          # both outcomes occur, so the AUC is defined
    auc = report["routing"]["roc_auc"]
    assert auc["estimate"] == pytest.approx(risk_auc(wrong, risk))
    assert auc["low"] <= auc["estimate"] <= auc["high"] and auc["n"] == 30
    half = next(p for p in report["routing"]["curve"] if p["fraction"] == 0.5)
    expected = next(p for p in routing_curve(risk, [not w for w in wrong]) if p.fraction == 0.5)
    assert half["agreement"]["estimate"] == pytest.approx(expected.agreement)
    assert half["threshold"] == pytest.approx(expected.threshold)


def test_curve_endpoints_are_the_reports_pure_paths(with_predictor) -> None:
    _, report = with_predictor
    routing = report["routing"]
    first, last = routing["curve"][0], routing["curve"][-1]
    costs = routing["step_costs"]
    assert first["threshold"] is None and first["fraction_exact"] == 0
    assert first["agreement"]["estimate"] == pytest.approx(report["fidelity"]["spatial"]["top1"]["mean"])
    assert first["ms_per_token"] == first["random_ms_per_token"] == costs["spatial"]["ms_p50"]
    assert last["threshold"] == 0 and last["agreement"]["estimate"] == 1.0
    assert last["ms_per_token"] == last["random_ms_per_token"] == costs["exact"]["ms_p50"]
    assert first["vs_random"] is None and last["vs_random"] is None
    for point in routing["curve"][1:-1]:
        if 0 < point["fraction_exact"] < 1:
            assert point["ms_per_token"] == pytest.approx(
                costs["signals"]["ms_p50"] + point["random_ms_per_token"])   # routing pays the signals
            assert point["vs_random"]["difference"] == pytest.approx(
                point["agreement"]["estimate"] - point["random_agreement"])


def test_the_section_is_rendered(with_predictor) -> None:
    _, report = with_predictor
    auc = report["routing"]["roc_auc"]["estimate"]
    for page in (to_markdown(report, {}), to_html(report, {})):
        assert "Risk and hybrid routing" in page
        assert f"{auc:.3g}" in page and "risk vs random" in page


def test_a_set_without_a_predictor_gets_a_section_that_says_so(without_predictor) -> None:
    name, report = without_predictor
    validate_report(report)
    assert report["routing"]["available"] is False
    assert f"atom set '{name}' has no risk predictor" in report["routing"]["note"]
    assert f"Not measured: atom set '{name}' has no risk predictor" in to_markdown(report, {})
