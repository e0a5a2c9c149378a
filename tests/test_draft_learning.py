"""What drafting learned is carried across the runs of one server or Client (speculative/learned.py).

A warmed run starts from the draft length and acceptance the last run of its kind learned; the
tokens stay the seed's whatever was carried (greedy: the exact path's; sampled: the cold run's).
"""

from __future__ import annotations

import threading

import pytest

from hartonomous.backends.base import Distribution
from hartonomous.engine import Engine, pick
from hartonomous.generation_config import GenerationConfig
from hartonomous.speculative.decoding import Draft, SpeculativeBackend
from hartonomous.speculative.draft_cost import ForwardCosts
from hartonomous.speculative.learned import PROMPT_BUCKETS, DraftLearning, prompt_bucket
from speculative_helpers import (atom_set, random_atom_set, random_spatial, spatial,  # noqa: F401 (fixtures)
                                 tiny_exact_backend)

PROMPT = "The capital of France is"
GREEDY = GenerationConfig(max_new_tokens=24, temperature=0.0, stop_at_eos=False)
SAMPLED = GenerationConfig(max_new_tokens=24, temperature=1.0, top_k=40, top_p=0.9, seed=11, stop_at_eos=False)
FLAT = ForwardCosts((0.040,) + (0.045,) * 15)          # long drafts almost free

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py


def speculative(spatial, learned: DraftLearning | None, drafter=None, **options) -> Engine:
    """A fresh backend per call (as the server builds one per request), sharing `learned`."""
    backend = SpeculativeBackend(tiny_exact_backend(), spatial, learned=learned, **options)
    if drafter is not None:
        backend.drafter = drafter
    return Engine(backend)


class OracleDrafter:
    """Drafts the exact model's own tokens (always kept), or a wrong token everywhere (never kept)."""

    def __init__(self, wrong: bool = False):
        self.exact, self.wrong, self.memory = tiny_exact_backend(), wrong, False

    def draft(self, ids, n, sampler, seed, first_step, stop_token_ids):
        state, out = self.exact.start(ids), []
        for i in range(n):
            q = self.exact.distribution(state, sampler)
            token, _ = pick(q, seed, first_step + i)
            if self.wrong:
                token = (token + 1) % self.exact.model.vocab_size
                q = Distribution([token], [1.0])
            out.append(Draft(token, q))
            self.exact.advance(state, token)
        return out


def exact_tokens(config: GenerationConfig) -> list[int]:
    return Engine(tiny_exact_backend()).generate(PROMPT, config).token_ids


# -- warm starts -------------------------------------------------------------------------------

def test_a_warmed_run_starts_from_the_learned_draft_length_with_the_same_tokens(spatial):
    learned = DraftLearning()
    cold = speculative(spatial, learned, OracleDrafter(), draft_tokens=2, max_draft_tokens=8).generate(PROMPT, GREEDY)
    assert cold.stats.warm_start is False and cold.stats.draft_lengths[:4] == [2, 4, 6, 8]
    warm = speculative(spatial, learned, OracleDrafter(), draft_tokens=2, max_draft_tokens=8).generate(PROMPT, GREEDY)
    assert warm.stats.warm_start is True and warm.stats.carried_judged > 0
    assert warm.stats.draft_lengths[0] == 8 and warm.stats.rounds < cold.stats.rounds
    assert warm.token_ids == cold.token_ids == exact_tokens(GREEDY)


def test_without_carried_learning_every_run_drafts_blind(spatial):
    first = speculative(spatial, None, OracleDrafter(), draft_tokens=2, max_draft_tokens=8).generate(PROMPT, GREEDY)
    again = speculative(spatial, None, OracleDrafter(), draft_tokens=2, max_draft_tokens=8).generate(PROMPT, GREEDY)
    assert again.stats.warm_start is False and again.stats.draft_kind is None
    assert again.stats.draft_lengths == first.stats.draft_lengths


def test_a_cost_shaped_run_that_learned_drafts_do_not_pay_starts_plain(spatial):
    """A drafter that is never right: the cold run drafts draft_tokens first; the next one knows
    better and starts with plain exact steps, the output the exact path's either way."""
    learned = DraftLearning()
    cold = speculative(spatial, learned, OracleDrafter(wrong=True), draft_tokens=4, costs=FLAT).generate(PROMPT, GREEDY)
    warm = speculative(spatial, learned, OracleDrafter(wrong=True), draft_tokens=4, costs=FLAT).generate(PROMPT, GREEDY)
    assert cold.stats.draft_lengths[0] == 4 and cold.stats.accepted == 0
    assert warm.stats.warm_start and warm.stats.draft_lengths[0] == 0
    assert warm.stats.drafted < cold.stats.drafted
    assert warm.token_ids == cold.token_ids == exact_tokens(GREEDY)


@pytest.mark.parametrize("drafter, options", [("random_spatial", {"costs": FLAT}),
                                               ("spatial", {"costs": FLAT, "max_tree_width": 3}),
                                               ("random_spatial", {"min_acceptance": 0})])
def test_a_sample_is_the_seeds_whatever_was_carried(request, drafter, options):
    """Cold or warmed by runs on other prompts and seeds, a seed gives one sample."""
    spatial = request.getfixturevalue(drafter)
    cold = speculative(spatial, None, draft_tokens=4, **options).generate(PROMPT, SAMPLED)
    assert 0 < cold.stats.accepted < cold.stats.drafted
    learned = DraftLearning()
    for seed in (1, 2, 3):
        speculative(spatial, learned, draft_tokens=4, **options).generate(
            "The capital of Spain is", SAMPLED.with_options(seed=seed))
    warm = speculative(spatial, learned, draft_tokens=4, **options).generate(PROMPT, SAMPLED)
    assert warm.stats.warm_start and warm.stats.draft_lengths != cold.stats.draft_lengths
    assert warm.token_ids == cold.token_ids


def test_a_policy_that_pauses_at_a_temperature_starts_cold(random_spatial):
    """The legacy schedule's pauses draw another sample at T > 0, so it is not warmed there."""
    learned = DraftLearning()
    runs = [speculative(random_spatial, learned, draft_tokens=4).generate(PROMPT, SAMPLED) for _ in range(2)]
    assert not runs[1].stats.warm_start and runs[0].token_ids == runs[1].token_ids


def test_kinds_learn_apart(spatial, random_spatial):
    """Another atom set, greedy against sampled, another prompt-length bucket: each starts blind."""
    learned = DraftLearning()
    speculative(spatial, learned, OracleDrafter(), draft_tokens=2).generate(PROMPT, GREEDY)
    assert speculative(random_spatial, learned, draft_tokens=2).generate(PROMPT, GREEDY).stats.warm_start is False
    assert speculative(spatial, learned, OracleDrafter(), draft_tokens=2).generate(
        PROMPT, SAMPLED.with_options(top_k=1)).stats.warm_start is False
    assert speculative(spatial, learned, OracleDrafter(), draft_tokens=2).generate(
        "word " * 80, GREEDY).stats.warm_start is False
    again = speculative(spatial, learned, OracleDrafter(), draft_tokens=2).generate(PROMPT, GREEDY)
    assert again.stats.warm_start and again.stats.draft_kind in learned.as_dict()["kinds"]
    assert len(learned) == 4


# -- the store ---------------------------------------------------------------------------------

def kind(learned: DraftLearning, prompt_ids: list[int], memory: bool = True, atom_set: str = "a"):
    return learned.kind(atom_set=atom_set, target="exact", memory=memory, policy="CostShapedPolicy", max_width=1,
                        sampled=False, prompt_ids=prompt_ids)


def test_prompt_buckets_are_coarse_length_classes():
    assert [prompt_bucket(n) for n in (0, 63, 64, 255, 256, 4095, 4096, 100_000)] == [0, 0, 1, 1, 2, 3, 4, 4]
    assert len(PROMPT_BUCKETS) == 4


def test_a_prompt_asked_before_is_its_own_kind_with_the_memory_only():
    learned = DraftLearning()
    first = kind(learned, [1, 2, 3])
    assert not first.repeated
    learned.keep(first, {"recent": (True,)}, [1, 2, 3])
    assert kind(learned, [1, 2, 3]).repeated and not kind(learned, [1, 2, 4]).repeated
    assert not kind(learned, [1, 2, 3], atom_set="b").repeated
    plain = kind(learned, [1, 2, 3], memory=False)
    learned.keep(plain, {"recent": (True,)}, [1, 2, 3])
    assert not kind(learned, [1, 2, 3], memory=False).repeated
    assert learned.as_dict()["prompts"] == 1


def test_the_store_is_bounded_least_recently_used_first():
    learned = DraftLearning(max_kinds=2, max_prompts=2)
    kinds = [kind(learned, list(range(n))) for n in (1, 100, 300)]
    learned.keep(kinds[0], {"recent": (True,)}, [0])
    learned.keep(kinds[1], {"recent": (False,)}, [1])
    assert learned.recall(kinds[0]) is not None             # used: kinds[1] is now the oldest
    learned.keep(kinds[2], {"recent": ()}, [2])
    assert len(learned) == 2 and learned.recall(kinds[1]) is None and learned.recall(kinds[0]) is not None
    assert learned.as_dict()["prompts"] == 2 and not kind(learned, [0]).repeated
    with pytest.raises(ValueError, match="at least 1"):
        DraftLearning(max_kinds=0)


def test_concurrent_runs_share_it_safely():
    learned = DraftLearning(max_kinds=8, max_prompts=16)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(300):
                k = kind(learned, [t, i % 40] * (1 + i % 200))
                learned.recall(k)
                learned.keep(k, {"recent": (i % 2 == 0,)}, [t, i])
                learned.as_dict()
        except BaseException as exc:   # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and len(learned) <= 8 and learned.as_dict()["prompts"] <= 16


def test_a_clients_runs_share_what_they_learned(reader_url, atom_set):
    from hartonomous.client import Client
    from server_helpers import tiny_exact_model
    from tiny_model import tiny_tokenizer

    config = GREEDY.with_options(max_new_tokens=12)
    with Client(database_url=reader_url, atom_set=atom_set, spatial_tokenizer=tiny_tokenizer(),
                exact_model=tiny_exact_model()) as client:
        engine = client.engine("speculative")
        assert engine.backend.learned is client.resources.draft_learning
        first, again = engine.generate(PROMPT, config), engine.generate(PROMPT, config)
    assert not first.stats.warm_start and again.stats.warm_start
    assert again.token_ids == first.token_ids == exact_tokens(config)
