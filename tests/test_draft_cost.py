"""Draft lengths shaped by the measured forward costs (hartonomous/speculative/draft_cost.py)."""

from __future__ import annotations

import pytest

from hartonomous.speculative.draft_cost import (MAX_PROBE_EVERY, PROBE_EVERY, CostShapedPolicy, ForwardCosts,
                                                expected_tokens, measure_forward_costs)
from hartonomous.runtimes.reference import ExactModel
from tiny_model import tiny_model

# SmolLM2 on 2 CPU cores (issue 25): 2-3 tokens cost the most per token, 4-16 about 1.5x one.
CPU = ForwardCosts((0.040, 0.064, 0.081, 0.063, 0.061, 0.060, 0.0605, 0.061) + (0.062,) * 7 + (0.072,))
# A device where cost grows with every token fed: drafting never pays.
LINEAR = ForwardCosts(tuple(0.040 * n for n in range(1, 17)))


def judged(policy: CostShapedPolicy, kept: int, rejected: int) -> None:
    """Rounds of one judged draft token each: `kept` kept, then `rejected` rejected (2 ms drafts)."""
    for _ in range(kept):
        policy.update(1, 1, 1, 0.002)
    for _ in range(rejected):
        policy.update(1, 1, 0, 0.002)


def test_a_round_of_k_yields_the_kept_prefix_and_one_correction() -> None:
    assert expected_tokens(0, 0.3) == 1 and expected_tokens(1, 0.9) == 1    # a 1-token draft never gains
    assert expected_tokens(3, 0.5) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(8, 0.0) == 1 and expected_tokens(8, 1.0) == 8


def test_costs_beyond_the_measured_range_grow_from_the_last_two_points() -> None:
    costs = ForwardCosts((0.01, 0.02, 0.05))
    assert costs.of(3) == 0.05 and costs.of(5) == pytest.approx(0.05 + 2 * 0.03)


def test_drafts_that_are_kept_grow_to_the_cheapest_long_shape() -> None:
    policy = CostShapedPolicy(CPU, max_draft_tokens=8)
    judged(policy, kept=32, rejected=0)
    assert policy.acceptance > 0.9
    assert policy.length(64) == 8
    assert policy.length(3) == 2 or policy.length(3) == 3          # never more than is left
    assert policy.length(1) == 0                                   # one token left: a plain step


def test_the_costliest_shapes_are_skipped_where_longer_drafts_cost_the_same() -> None:
    """At a middling acceptance 2-3 token drafts lose to a plain step on the CPU's costs, 6-8 win."""
    policy = CostShapedPolicy(CPU, max_draft_tokens=16)
    judged(policy, kept=16, rejected=16)
    a = policy.acceptance
    assert 0.45 < a < 0.55
    assert policy.rate(2) < policy.rate(0) < policy.rate(policy.best_draft(64))
    assert policy.best_draft(64) >= 6


def test_drafting_stops_where_it_cannot_pay_and_probes_again() -> None:
    rejected = CostShapedPolicy(CPU, max_draft_tokens=8)
    judged(rejected, kept=0, rejected=32)
    best = rejected.best_draft(64)
    lengths = [rejected.length(64) for _ in range(4 * PROBE_EVERY + 2)]
    assert lengths == [0] * PROBE_EVERY + [best] + [0] * 2 * PROBE_EVERY + [best] + [0] * PROBE_EVERY
    probes = [rejected.length(64) for _ in range(1000)].count(best)
    assert probes <= 1000 // MAX_PROBE_EVERY + 1                  # probes that keep failing grow rarer
    judged(rejected, kept=32, rejected=0)                          # drafting pays again ...
    assert rejected.length(64) > 0
    judged(rejected, kept=0, rejected=32)                          # ... and stops paying: probe as at first
    assert [rejected.length(64) for _ in range(PROBE_EVERY + 1)] == [0] * PROBE_EVERY + [best]
    linear = CostShapedPolicy(LINEAR, max_draft_tokens=8)
    judged(linear, kept=24, rejected=8)                            # 75% kept, yet every token costs a forward
    assert linear.length(64) == 0


def test_at_a_temperature_a_plain_round_still_judges_one_drafted_token() -> None:
    """So every sampled position is decided by the acceptance rule, whatever the timings decide."""
    policy = CostShapedPolicy(CPU, max_draft_tokens=8, min_draft=1)
    judged(policy, kept=0, rejected=32)
    assert policy.length(64) == 1


def test_forward_costs_are_measured_for_one_to_sixteen_tokens() -> None:
    model, tokenizer = tiny_model(0)
    exact = ExactModel(model, tokenizer)
    costs = measure_forward_costs(exact, max_tokens=16, prefix=32, repeats=1)
    assert len(costs.seconds) == 16 and all(s > 0 for s in costs.seconds)
    assert costs.as_dict()["prefix"] == 32 and len(costs.as_dict()["ms"]) == 16


def test_concurrent_first_requests_measure_the_costs_once(monkeypatch) -> None:
    import threading

    from hartonomous.speculative import draft_cost

    calls = []

    def slow_measure(model):
        calls.append(model)
        threading.Event().wait(0.2)
        return CPU

    monkeypatch.setattr(draft_cost, "measure_forward_costs", slow_measure)

    class Model:
        pass

    model, got = Model(), []
    threads = [threading.Thread(target=lambda: got.append(draft_cost.forward_costs(model))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got == [CPU] * 4


def test_measured_costs_are_kept_on_disk_per_runtime_and_cpu(monkeypatch, tmp_path) -> None:
    """A second model object (a new process: another CLI call) reads the file instead of measuring;
    a changed key (here the thread count) or a corrupt file measures again; neither is an error."""
    import json

    import torch

    from hartonomous.speculative import draft_cost

    calls = []

    def counting_measure(model):
        calls.append(model)
        return measure_forward_costs(model, max_tokens=draft_cost.MAX_MEASURED, prefix=8, repeats=1)

    monkeypatch.setattr(draft_cost, "measure_forward_costs", counting_measure)
    monkeypatch.setattr(draft_cost, "machine_is_busy", lambda: False)     # whatever else runs beside the test
    model, tokenizer = tiny_model(0)

    def fresh() -> ForwardCosts:
        return draft_cost.forward_costs(ExactModel(model, tokenizer), tmp_path)

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = fresh()
        files = list(tmp_path.iterdir())
        assert len(calls) == 1 and len(files) == 1 and files[0].suffix == ".json"
        stored = json.loads(files[0].read_text())
        assert stored["key"]["threads"] == 1 and stored["key"]["cpu"] == draft_cost.cpu_name()
        assert stored["key"]["torch"] == torch.__version__ and stored["key"]["device"] == "cpu"
        assert fresh() == first and len(calls) == 1                     # read back, not measured
        torch.set_num_threads(2)
        fresh()
        assert len(calls) == 2 and len(list(tmp_path.iterdir())) == 2  # another key: measured, kept apart
        torch.set_num_threads(1)
        for damage in ("{not json", json.dumps({"key": stored["key"], "prefix": 8, "seconds": [-1.0] * 16})):
            files[0].write_text(damage)
            fresh()
            assert json.loads(files[0].read_text())["seconds"][0] > 0  # measured again and rewritten
        assert len(calls) == 4
        assert fresh() is not None and len(calls) == 4
    finally:
        torch.set_num_threads(threads)


def test_costs_measured_on_a_busy_machine_serve_the_process_but_are_not_kept(monkeypatch, tmp_path) -> None:
    """A measurement slowed by other work would make every later process draft by wrong costs."""
    from hartonomous.speculative import draft_cost

    monkeypatch.setattr(draft_cost, "measure_forward_costs",
                        lambda model: measure_forward_costs(model, max_tokens=draft_cost.MAX_MEASURED, prefix=8, repeats=1))
    model, tokenizer = tiny_model(0)
    monkeypatch.setattr(draft_cost, "machine_is_busy", lambda: True)
    exact = ExactModel(model, tokenizer)
    assert draft_cost.forward_costs(exact, tmp_path) is draft_cost.forward_costs(exact, tmp_path)   # kept in memory
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(draft_cost, "machine_is_busy", lambda: False)
    draft_cost.forward_costs(ExactModel(model, tokenizer), tmp_path)
    assert len(list(tmp_path.iterdir())) == 1


# -- trees (greedy): the width from the first token's running acceptance per width ------------

def test_a_tree_is_drafted_where_a_wider_first_position_catches_the_misses() -> None:
    """The first token is often wrong but its runner-up right; later tokens are kept: on the CPU's
    flat costs, a wider tree pays more than a chain."""
    policy = CostShapedPolicy(CPU, max_draft_tokens=8, max_width=4)
    for i in range(32):
        policy.update_tree(4, rank=1 if i % 2 else 2, later=[True, True, True], draft_seconds=0.004)
    assert policy.first_acceptance(1) < 0.6 < 0.9 < policy.first_acceptance(2)
    assert policy.length(64) >= 2 and policy.width >= 2
    assert policy.tree_rate(policy.length(64), policy.width) > policy.tree_rate(policy.best_draft(64), 1)


def test_a_chain_is_drafted_where_the_first_token_is_right_or_width_costs_too_much() -> None:
    right = CostShapedPolicy(CPU, max_draft_tokens=8, max_width=4)
    for _ in range(32):
        right.update_tree(4, rank=1, later=[True, True, True], draft_seconds=0.004)
    right.length(64)
    assert right.width == 1                              # a wider tree feeds more tokens for nothing
    steep = CostShapedPolicy(LINEAR, max_draft_tokens=8, max_width=4)
    for i in range(32):
        steep.update_tree(4, rank=1 if i % 2 else 2, later=[True, True, True], draft_seconds=0.004)
    assert steep.length(64) == 0 and steep.width == 1    # where every fed token costs, nothing pays


def test_the_first_tokens_acceptance_never_falls_with_width_and_starts_from_a_prior() -> None:
    policy = CostShapedPolicy(CPU, max_draft_tokens=8, max_width=3)
    assert policy.first_acceptance(1) == pytest.approx(0.5)
    assert policy.first_acceptance(1) < policy.first_acceptance(2) < policy.first_acceptance(3) < 1
    for _ in range(32):
        policy.update_tree(2, rank=None, later=[], draft_seconds=0.004)      # width 3 never observed
    assert policy.first_acceptance(3) >= policy.first_acceptance(2) >= policy.first_acceptance(1)
    with pytest.raises(ValueError, match="max_width must be at least 1"):
        CostShapedPolicy(CPU, max_draft_tokens=8, max_width=0)
