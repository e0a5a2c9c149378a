"""Hybrid generation, adaptive sampling and per-step signals in the engine: a tiny random-weight
model and a real database (a context atom set distilled from that model, with its risk predictor)."""

from __future__ import annotations

import dataclasses

import math

import psycopg
import pytest

from hartonomous import sqlcalls
from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.hybrid import HybridBackend, HybridStats
from hartonomous.backends.spatial import SpatialState
from hartonomous.client import Client
from hartonomous.engine import Engine
from hartonomous.errors import InvalidArgument, UserError
from hartonomous.runtimes.reference import ExactModel
from hartonomous.generation_config import GenerationConfig
from hartonomous.risk import RiskModel
from speculative_helpers import atom_set, connect_spatial, spatial, tiny_exact_backend  # noqa: F401 (fixtures)
from test_speculative import PROMPTS, exact_engine
from tiny_model import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py

GREEDY = GenerationConfig(max_new_tokens=24, temperature=0.0, stop_at_eos=False)
SAMPLED = GenerationConfig(max_new_tokens=24, temperature=1.0, top_k=40, top_p=0.9, seed=5, stop_at_eos=False)


@pytest.fixture(scope="module", autouse=True)
def predictor(server_url, atom_set) -> RiskModel:
    """A risk predictor for the distilled set: the tiny model's build has too few calibration
    positions to fit one (projection/risk.py is tested in test_risk_build.py), so this one is written
    by hand: the flatter the spatial distribution, the riskier the step."""
    model = RiskModel(features=["top_probability"], mean=[0.5], scale=[0.2], coef=[-2.0], intercept=0.0)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("UPDATE atom_sets SET risk_model = %s::jsonb WHERE name = %s", (model.model_dump_json(), atom_set))
    return model


def hybrid(spatial, threshold: float) -> Engine:
    return Engine(HybridBackend(spatial, tiny_exact_backend(), threshold))


@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_threshold_zero_is_the_exact_path(spatial, config) -> None:
    for prompt in PROMPTS:
        want = exact_engine().generate(prompt, config)
        got = hybrid(spatial, 0.0).generate(prompt, config)
        assert got.token_ids == want.token_ids
        assert got.probabilities == want.probabilities
        assert got.stats.exact_fraction == 1.0


@pytest.mark.parametrize("config", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_threshold_infinity_is_the_spatial_path(server_url, atom_set, spatial, config) -> None:
    other = connect_spatial(server_url, atom_set)
    try:
        for prompt in PROMPTS:
            want = Engine(other).generate(prompt, config)
            got = hybrid(spatial, math.inf).generate(prompt, config)
            assert got.token_ids == want.token_ids
            assert got.probabilities == want.probabilities
            assert (got.stats.steps, got.stats.exact_steps) == (len(got.token_ids), 0)
    finally:
        other.close()


def test_steps_go_where_the_risk_says_and_the_exact_cache_keeps_up(spatial) -> None:
    """A threshold inside the risks seen: both routes occur; every exact step's distribution is what
    a fresh exact model gives for the whole text so far (the tokens of spatial steps were fed)."""
    probe = Engine(HybridBackend(spatial, tiny_exact_backend(), 1.0))
    risks = probe.generate(PROMPTS[0], SAMPLED).stats.risks
    threshold = sorted(risks)[len(risks) // 2]
    engine = hybrid(spatial, threshold)
    session = engine.session(PROMPTS[0], SAMPLED.with_options(signals=True))
    ids = list(session.prompt_ids)
    fresh = tiny_exact_backend()
    routes = []
    for event in session.events():
        routes.append(event.route)
        assert event.route == ("spatial" if event.signals.risk < threshold else "exact")
        if event.route == "exact":
            want = fresh.distribution(fresh.start(ids), SAMPLED.sampler)
            assert event.distribution.token_ids == want.token_ids
            assert event.distribution.probabilities == pytest.approx(want.probabilities, abs=1e-6)
        ids.append(event.token_id)
    assert {"spatial", "exact"} <= set(routes)
    stats: HybridStats = session.result.stats
    assert stats.exact_steps == routes.count("exact") and stats.steps == len(routes)


def test_the_threshold_is_checked() -> None:
    with pytest.raises(InvalidArgument) as err:
        HybridBackend(None, tiny_exact_backend(), -1.0)
    assert err.value.name == "risk_threshold"


def test_a_set_without_predictor_refuses_a_threshold_inside(server_url, spatial) -> None:
    from generation_helpers import drop_atom_set, write_tiny_atom_set

    name = write_tiny_atom_set(server_url, model="tiny", window=3, decay=0.5)
    plain = connect_spatial(server_url, name)
    try:
        with pytest.raises(UserError, match="no risk predictor"):
            hybrid(plain, 0.5).generate(PROMPTS[0], GREEDY)
        assert hybrid(plain, math.inf).generate(PROMPTS[0], GREEDY).token_ids
    finally:
        plain.close()
        drop_atom_set(server_url, name)


# -- signals on the engine's events ---------------------------------------------------------------

def test_spatial_events_carry_the_sql_signals(spatial) -> None:
    session = Engine(spatial).session(PROMPTS[1], SAMPLED.with_options(signals=True, max_new_tokens=6))
    ids = list(session.prompt_ids)
    for event in session.events():
        want = sqlcalls.next_token_signals(spatial.conn, ids, spatial.spatial, spatial.atom_set_name)
        # On the native kernel the signals come with the step's logits (ht_step_logits): the same
        # numbers to rounding, summed in another order.
        assert dataclasses.astuple(event.signals) == pytest.approx(dataclasses.astuple(want), abs=1e-12)
        assert 0 < event.signals.risk < 1
        ids.append(event.token_id)


def test_exact_events_carry_the_exact_entropies_and_the_spatial_risk(spatial) -> None:
    backend = ExactBackend(tiny_exact_backend().model, risk_source=lambda ids: spatial.signals(SpatialState(ids)))
    session = Engine(backend).session(PROMPTS[0], GREEDY.with_options(signals=True, max_new_tokens=4))
    ids = list(session.prompt_ids)
    for event in session.events():
        assert event.signals.h > 0 and event.signals.nearest_bandwidths is None
        assert event.signals.risk == spatial.signals(SpatialState(list(ids))).risk
        ids.append(event.token_id)


# -- adaptive sampling ------------------------------------------------------------------------------

def assert_same_distribution(got, want) -> None:
    """The same rows in the same order; probabilities to rounding (on the native kernel an adaptive
    step samples the logits that came with its signals, in Python, rather than asking next_token)."""
    assert got.token_ids == want.token_ids
    assert got.probabilities == pytest.approx(want.probabilities, abs=1e-12)


@pytest.mark.parametrize("options, field", [
    ({"standard_p": 0}, "standard_p"), ({"explore_p": 1.5}, "explore_p"), ({"explore_temp": 0}, "explore_temp"),
    ({"cautious_mode": "panic"}, "cautious_mode"), ({"explore_risk": -0.1}, "explore_risk"),
    ({"cautious_risk": 2}, "cautious_risk"), ({"explore_risk": 0.9, "cautious_risk": 0.5}, "explore_risk"),
])
def test_adaptive_options_are_validated_naming_the_field(options, field) -> None:
    with pytest.raises(InvalidArgument) as err:
        GenerationConfig(**options)
    assert err.value.name == field


def test_every_step_explores_when_explore_risk_is_zero(spatial) -> None:
    config = SAMPLED.with_options(adaptive=True, explore_risk=0.0, cautious_risk=1.0, explore_p=0.97,
                                 explore_temp=1.7, max_new_tokens=6)
    session = Engine(spatial).session(PROMPTS[0], config)
    explore = config.sampler.__class__(1.7, config.top_k, 0.97, config.repetition_penalty)
    ids = list(session.prompt_ids)
    for event in session.events():
        assert event.mode == "explore"
        want = spatial.distribution(SpatialState(list(ids)), explore)
        assert_same_distribution(event.distribution, want)
        ids.append(event.token_id)


def test_abstain_stops_before_a_risky_step(spatial) -> None:
    config = GREEDY.with_options(adaptive=True, explore_risk=0.0, cautious_risk=0.0, cautious_mode="abstain")
    result = Engine(spatial).generate(PROMPTS[0], config)
    assert (result.token_ids, result.finish_reason) == ([], "abstain")


def test_flatten_and_signal_modes(spatial) -> None:
    for mode, want in (("flatten", (2.0, 0.99)), ("signal", (SAMPLED.temperature, SAMPLED.standard_p))):
        config = SAMPLED.with_options(adaptive=True, explore_risk=0.0, cautious_risk=0.0, cautious_mode=mode,
                                      max_new_tokens=3)
        session = Engine(spatial).session(PROMPTS[2], config)
        ids = list(session.prompt_ids)
        for event in session.events():
            assert event.mode == "cautious"
            sampler = config.sampler.__class__(want[0], config.top_k, want[1], config.repetition_penalty)
            assert_same_distribution(event.distribution, spatial.distribution(SpatialState(list(ids)), sampler))
            ids.append(event.token_id)


def test_adaptive_needs_a_path_with_signals() -> None:
    with pytest.raises(InvalidArgument) as err:
        exact_engine().generate(PROMPTS[0], GREEDY.with_options(adaptive=True))
    assert err.value.name == "adaptive"


def test_the_client_gives_the_exact_path_the_spatial_risk_for_adaptive_sampling(server_url, atom_set) -> None:
    model, tokenizer = tiny_model(0)
    with psycopg.connect(server_url, autocommit=True) as conn, \
            Client(connection=conn, atom_set=atom_set, spatial_tokenizer=tokenizer,
                   exact_model=ExactModel(model, tokenizer), risk_threshold=0.0) as client:
        session = client.stream(PROMPTS[0], path="exact", adaptive=True, explore_risk=0.0, cautious_risk=1.0,
                                max_new_tokens=4, seed=3, stop_at_eos=False)
        modes = [event.mode for event in session.events()]
        assert modes == ["explore"] * 4
        hybrid_result = client.generate(PROMPTS[0], path="hybrid", temperature=0.0, max_new_tokens=6,
                                        stop_at_eos=False)
        exact_result = client.generate(PROMPTS[0], path="exact", temperature=0.0, max_new_tokens=6,
                                       stop_at_eos=False)
        assert hybrid_result.token_ids == exact_result.token_ids and hybrid_result.stats.exact_fraction == 1.0
