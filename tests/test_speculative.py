"""Speculative decoding: the spatial path drafts, the exact model verifies.

Greedy output is the exact path's token for token; sampled output has the exact path's
distribution (a chi-squared test over seeded runs); the KV cache rolls back cleanly; SQL
draft_tokens drafts in one call with next_token's distributions and generate_tokens' picks.
"""

from __future__ import annotations

from collections import Counter

import psycopg
import pytest
from optional_parts import require_smollm2
import torch
from scipy.stats import chisquare

from generation_helpers import drop_atom_set
from hartonomous.backends.base import Distribution
from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.engine import Engine, State, pick
from hartonomous.errors import UserError
from hartonomous.runtimes.reference import ExactModel
from hartonomous.generation_config import GenerationConfig, SamplerArgs
from hartonomous.sampling import logits_to_probs
from hartonomous.speculative.decoding import Draft, SpeculativeBackend, SpeculativeStats
from hartonomous.textstream import REPLACEMENT, decode
from speculative_helpers import (atom_set, random_atom_set, random_spatial, spatial,  # noqa: F401 (fixtures)
                                 tiny_exact_backend)
from tiny_model import tiny_model

PROMPTS = ["The capital of France is", "def add(a, b):", "héllo wörld"]
GREEDY = GenerationConfig(max_new_tokens=32, temperature=0.0, stop_at_eos=False)
SAMPLED = GenerationConfig(max_new_tokens=16, temperature=1.0, top_k=40, top_p=0.9, seed=11, stop_at_eos=False)


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py


def speculative(spatial, **options) -> Engine:
    return Engine(SpeculativeBackend(tiny_exact_backend(), spatial, **options))


def exact_engine() -> Engine:
    return Engine(tiny_exact_backend())


# -- greedy: the exact path's output, token for token ------------------------------------------

@pytest.mark.parametrize("drafter", ["spatial", "random_spatial"])
@pytest.mark.parametrize("draft_tokens, adaptive", [(1, False), (4, True), (8, False)])
@pytest.mark.parametrize("repetition_penalty", [1.0, 1.3])
def test_greedy_output_is_the_exact_paths_token_for_token(request, drafter, draft_tokens, adaptive,
                                                          repetition_penalty):
    spatial = request.getfixturevalue(drafter)
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
        assert stats.accepted <= stats.tokens == len(got.token_ids)
        assert stats.as_dict()["acceptance_rate"] == stats.accepted / stats.drafted
        assert stats.tokens_per_forward == len(got.token_ids) / stats.forwards
        assert max(stats.draft_lengths) <= (8 if adaptive else draft_tokens)


def test_the_atom_sets_cover_kept_and_rejected_drafts(spatial, random_spatial):
    """The greedy identity above runs with a drafter that is always right on these prompts (the
    distilled set: the tiny model repeats itself, and so do its atoms) and one that is never right."""
    for backend, rate in ((spatial, 1.0), (random_spatial, 0.0)):
        engine = speculative(backend, draft_tokens=4)
        assert all(engine.generate(p, GREEDY).stats.acceptance_rate == rate for p in PROMPTS)


class OracleDrafter:
    """Drafts from the exact model itself (q = p, drawn like the engine draws), except at positions
    where `wrong` says so (there it drafts another token, q one-hot on it); a real computation,
    standing in for the database."""

    def __init__(self, wrong=lambda position: False):
        self.exact, self.wrong = tiny_exact_backend(), wrong

    def draft(self, ids, n, sampler, seed, first_step, stop_token_ids):
        state, out = self.exact.start(ids), []
        for i in range(n):
            q = self.exact.distribution(state, sampler)
            token, _ = pick(q, seed, first_step + i)
            if self.wrong(first_step + i):
                token = (token + 1) % self.exact.model.vocab_size
                q = Distribution([token], [1.0])
            out.append(Draft(token, q))
            if token in stop_token_ids:
                break
            self.exact.advance(state, token)
        return out


@pytest.mark.parametrize("repetition_penalty", [1.0, 1.3])
def test_greedy_identity_when_rounds_keep_part_of_the_draft(spatial, repetition_penalty):
    config = GREEDY.with_options(repetition_penalty=repetition_penalty, max_new_tokens=40)
    engine = speculative(spatial, draft_tokens=4, adaptive=False)
    engine.backend.drafter = OracleDrafter(wrong=lambda position: position % 5 == 3)
    for prompt in PROMPTS:
        got = engine.generate(prompt, config)
        assert got.token_ids == exact_engine().generate(prompt, config).token_ids
        assert 0 < got.stats.accepted < got.stats.drafted
        assert got.stats.rounds < len(got.token_ids)


def test_draft_length_grows_after_full_acceptance_and_shrinks_after_rejection(spatial):
    engine = speculative(spatial, draft_tokens=2, max_draft_tokens=8)
    engine.backend.drafter = OracleDrafter()
    perfect = engine.generate(PROMPTS[0], GREEDY.with_options(max_new_tokens=30))
    assert perfect.token_ids == exact_engine().generate(PROMPTS[0], GREEDY.with_options(max_new_tokens=30)).token_ids
    assert perfect.stats.draft_lengths[:4] == [2, 4, 6, 8]
    assert perfect.stats.acceptance_rate == 1.0
    assert perfect.stats.tokens_per_forward == pytest.approx(30 / perfect.stats.forwards)
    engine.backend.drafter = OracleDrafter(wrong=lambda position: True)
    hopeless = engine.generate(PROMPTS[0], GREEDY.with_options(max_new_tokens=6))
    assert hopeless.token_ids == perfect.token_ids[:6]
    assert hopeless.stats.draft_lengths == [2, 1, 1, 1, 1, 1]
    assert hopeless.stats.accepted == 0


def test_drafting_pauses_below_the_break_even_and_probes_again(spatial):
    """Rejected drafts cost a database call and a wider forward: after MIN_JUDGED judged draft tokens
    below min_acceptance, rounds draft nothing (a plain exact step) and a 1-token probe comes every
    probe_every rounds; the output stays the exact path's."""
    from hartonomous.speculative.decoding import MIN_JUDGED, PROBE_EVERY

    config = GREEDY.with_options(max_new_tokens=40)
    expected = exact_engine().generate(PROMPTS[0], config).token_ids
    engine = speculative(spatial, draft_tokens=2)
    engine.backend.drafter = OracleDrafter(wrong=lambda position: True)
    hopeless = engine.generate(PROMPTS[0], config)
    assert hopeless.token_ids == expected
    paused = [2] + [1] * (MIN_JUDGED - 1)
    cycle = [0] * PROBE_EVERY + [1]
    assert hopeless.stats.draft_lengths == (paused + cycle * 4)[:hopeless.stats.rounds]
    assert hopeless.stats.rounds == 40 and hopeless.stats.drafted == MIN_JUDGED + 1 + 3
    never_pause = speculative(spatial, draft_tokens=2, min_acceptance=0)
    never_pause.backend.drafter = OracleDrafter(wrong=lambda position: True)
    assert 0 not in never_pause.generate(PROMPTS[0], config).stats.draft_lengths
    not_adaptive = speculative(spatial, draft_tokens=2, adaptive=False)
    not_adaptive.backend.drafter = OracleDrafter(wrong=lambda position: True)
    assert 0 not in not_adaptive.generate(PROMPTS[0], config).stats.draft_lengths


def test_a_kept_probe_resumes_drafting(spatial):
    from hartonomous.speculative.decoding import MIN_JUDGED, PROBE_EVERY

    first_probe = MIN_JUDGED + PROBE_EVERY          # the output position the first probe drafts
    config = GREEDY.with_options(max_new_tokens=40)
    engine = speculative(spatial, draft_tokens=2)
    engine.backend.drafter = OracleDrafter(wrong=lambda position: position < first_probe)
    result = engine.generate(PROMPTS[0], config)
    assert result.token_ids == exact_engine().generate(PROMPTS[0], config).token_ids
    lengths = result.stats.draft_lengths
    assert lengths[:MIN_JUDGED + PROBE_EVERY + 1] == [2] + [1] * (MIN_JUDGED - 1) + [0] * PROBE_EVERY + [1]
    assert lengths[MIN_JUDGED + PROBE_EVERY + 1:][:3] == [3, 5, 7] and 0 not in lengths[MIN_JUDGED + PROBE_EVERY:]


def test_the_pause_options_are_checked(spatial):
    with pytest.raises(UserError, match="min_acceptance must be between 0 and 1"):
        SpeculativeBackend(tiny_exact_backend(), spatial, min_acceptance=1.5)
    with pytest.raises(UserError, match="probe_every must be at least 1"):
        SpeculativeBackend(tiny_exact_backend(), spatial, probe_every=0)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7])
def test_rounds_never_decide_more_than_max_new_tokens(spatial, max_new_tokens):
    engine = speculative(spatial, draft_tokens=8)
    engine.backend.drafter = OracleDrafter()
    result = engine.generate(PROMPTS[1], GREEDY.with_options(max_new_tokens=max_new_tokens))
    assert len(result.token_ids) == max_new_tokens and result.finish_reason == "length"
    assert result.stats.tokens == max_new_tokens
    assert all(k <= max_new_tokens for k in result.stats.draft_lengths)


def test_a_drafter_that_is_the_exact_model_is_always_accepted(spatial):
    """q = p (repetition penalty included) keeps every draft token: p and q line up position by position."""
    engine = speculative(spatial, draft_tokens=4)
    engine.backend.drafter = OracleDrafter()
    result = engine.generate(PROMPTS[0], SAMPLED.with_options(max_new_tokens=24, repetition_penalty=1.3))
    assert result.stats.acceptance_rate == 1.0
    assert result.stats.draft_lengths == [4, 6, 8, 6]


def oracle_engine(spatial) -> Engine:
    engine = speculative(spatial, draft_tokens=4)
    engine.backend.drafter = OracleDrafter()   # every draft kept: stops land inside rounds
    return engine


def test_stop_token_and_stop_string_end_inside_a_round(spatial):
    engine = oracle_engine(spatial)
    config = SAMPLED.with_options(max_new_tokens=24)
    reference = engine.generate(PROMPTS[0], config)
    ref, text = reference.token_ids, reference.text
    i = next(i for i in range(5, len(ref)) if ref[i] not in ref[:i])
    result = engine.generate(PROMPTS[0], config.with_options(stop_token_ids=(ref[i],)))
    assert result.token_ids == ref[:i + 1]
    assert result.state is State.STOPPED and result.finish_reason == "stop_token"
    assert result.text == decode(engine.tokenizer, ref[:i])
    start = next(p for p in range(len(text) // 3, len(text) - 2)
                 if REPLACEMENT not in text[p:p + 2] and text[p:p + 2].strip())
    stop = text[start:start + 2]
    result = engine.generate(PROMPTS[0], config.with_options(stop_strings=(stop,)))
    assert result.text == text[:text.find(stop)]
    assert result.state is State.STOPPED and result.finish_reason == "stop_string"
    assert result.token_ids == ref[:len(result.token_ids)] and len(result.token_ids) < 24
    assert "".join(engine.stream(PROMPTS[0], config.with_options(stop_strings=(stop,)))) == result.text


def test_eos_ends_generation_as_complete(spatial):
    ref = oracle_engine(spatial).generate(PROMPTS[0], SAMPLED).token_ids
    i = next(i for i in range(2, len(ref)) if ref[i] not in ref[:i])
    backend = oracle_engine(spatial).backend
    backend.eos_token_ids = lambda: {ref[i]}
    result = Engine(backend).generate(PROMPTS[0], SAMPLED.with_options(stop_at_eos=True))
    assert result.token_ids == ref[:i + 1]
    assert result.state is State.COMPLETE and result.finish_reason == "eos"


def test_streamed_pieces_join_to_the_text_and_cancel_stops_within_a_round(spatial):
    engine = oracle_engine(spatial)
    config = SAMPLED.with_options(max_new_tokens=24)
    blocking = engine.generate(PROMPTS[2], config)
    session = engine.stream(PROMPTS[2], config)
    pieces = list(session)
    assert "".join(pieces) == blocking.text == session.result.text and all(pieces)
    session = engine.stream(PROMPTS[2], config)
    seen = []
    for event in session.events():
        seen.append(event.token_id)
        if len(seen) == 2:            # the first round decided 4: the cancel lands inside it
            session.cancel()
    assert seen == blocking.token_ids[:2]
    assert session.state is State.CANCELLED and session.result.token_ids == seen


def test_a_sample_depends_on_the_seed_and_the_text_alone(random_spatial):
    """Not on the draft length, adaptivity, max_new_tokens or stop conditions (the uniforms are per
    output position), so a stop or a shorter run ends the same text earlier."""
    reference = speculative(random_spatial, draft_tokens=4, min_acceptance=0).generate(
        PROMPTS[0], SAMPLED.with_options(max_new_tokens=24))
    assert 0 < reference.stats.accepted < reference.stats.drafted
    for options in ({"draft_tokens": 1, "adaptive": False}, {"draft_tokens": 7, "max_draft_tokens": 7, "min_acceptance": 0}):
        assert speculative(random_spatial, **options).generate(
            PROMPTS[0], SAMPLED.with_options(max_new_tokens=24)).token_ids == reference.token_ids
    engine = speculative(random_spatial, draft_tokens=4, min_acceptance=0)   # pausing: another sample (see speculative/decoding.py)
    assert engine.generate(PROMPTS[0], SAMPLED.with_options(max_new_tokens=5)).token_ids == reference.token_ids[:5]
    ref = reference.token_ids
    i = next(i for i in range(2, len(ref)) if ref[i] not in ref[:i])
    stopped = engine.generate(PROMPTS[0], SAMPLED.with_options(max_new_tokens=24, stop_token_ids=(ref[i],)))
    assert stopped.token_ids == ref[:i + 1] and stopped.finish_reason == "stop_token"
    assert stopped.text == decode(engine.tokenizer, ref[:i])


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
RUNS = 1500
ALPHA = 1e-4            # fixed seeds make the test deterministic; at this level a correct rule fails 1 time in 10^4


def sampled_sequences(engine: Engine, prompt: str, length: int, seeds, sampler: SamplerArgs = SAMPLER
                      ) -> tuple[Counter, SpeculativeStats]:
    """How often each generated sequence came out over the seeds, and the summed statistics."""
    config = GenerationConfig(max_new_tokens=length, temperature=sampler.temperature, top_k=sampler.top_k,
                              top_p=sampler.top_p, repetition_penalty=sampler.repetition_penalty,
                              stop_at_eos=False)
    counts, totals = Counter(), SpeculativeStats()
    for seed in seeds:
        result = engine.generate(prompt, config.with_options(seed=seed))
        counts[tuple(result.token_ids)] += 1
        totals.drafted += result.stats.drafted
        totals.accepted += result.stats.accepted
    return counts, totals


@pytest.mark.parametrize("drafter", ["spatial", "random_spatial"])
def test_sampled_output_has_the_exact_paths_distribution(request, drafter):
    """Chi-squared over 1500 seeded runs of 3 tokens against the exact path's joint probabilities,
    with a drafter whose q is a point mass (distilled) and one whose q is spread (random)."""
    engine = speculative(request.getfixturevalue(drafter), draft_tokens=2, max_draft_tokens=2)
    prompt = PROMPTS[0]
    joint = exact_joint(engine.encode(prompt), SAMPLER, 3)
    counts, totals = sampled_sequences(engine, prompt, 3, range(RUNS))
    assert 0 < totals.accepted < totals.drafted          # both branches of the rule ran
    assert chi_squared_p_value(counts, joint) > ALPHA


def test_the_distribution_test_catches_a_rule_that_keeps_every_draft(spatial, monkeypatch):
    """Power check: keeping every draft token (no acceptance test) gives the drafter's
    distribution, which the chi-squared test rejects; so the test above can fail."""
    from hartonomous.speculative.decoding import SpeculativeRun

    def keep_all(self, drafts, probs, position):
        tokens = [d.token_id for d in drafts]
        if len(drafts) < probs.shape[0]:
            tokens.append(self._draw(probs[len(drafts)], position + len(drafts)))
        return len(drafts), tokens

    monkeypatch.setattr(SpeculativeRun, "_decide", keep_all)
    engine = speculative(spatial, draft_tokens=2, max_draft_tokens=2)
    joint = exact_joint(engine.encode(PROMPTS[0]), SAMPLER, 3)
    counts, _ = sampled_sequences(engine, PROMPTS[0], 3, range(500))
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
    backend, sampler = tiny_exact_backend(), SamplerArgs(temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0)
    ids = backend.tokenizer.encode(PROMPTS[1])
    state = backend.begin(ids)
    draft = [40, 41, 42, 43]
    backend.score(state, draft, sampler)
    backend.accept(state, draft, draft[:accepted] + [99])   # keep draft[:accepted], then 99
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
    # the engine's step interface carries on from a speculative state
    backend.accept(state, nxt, [nxt[0], 5])
    dist = backend.distribution(state, sampler)
    fresh = logits_to_probs(backend.model.full_logits(expected_ids + [nxt[0], 5]), temperature=1.0, top_k=0, top_p=1.0)
    assert dist.token_ids[0] == int(fresh.argmax())
    assert dist.probabilities[0] == pytest.approx(float(fresh.max()), rel=1e-5)


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
def test_draft_tokens_rejects_bad_input_with_22023_naming_the_argument(conn, random_atom_set, arguments, message):
    args = {"context": [1, 2, 3], "n": 4, **arguments}
    context, n = args.pop("context"), args.pop("n")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        draft_rows(conn, context, n, random_atom_set, **args)


@pytest.mark.parametrize("temperature, repetition_penalty", [(1.0, 1.0), (0.7, 1.5), (0.0, 1.0)])
def test_draft_tokens_steps_are_next_tokens_distributions_and_generate_tokens_picks(conn, random_atom_set, temperature,
                                                                                   repetition_penalty):
    context = [10, 20, 30, 40]
    sampler = dict(temperature=temperature, top_k=20, top_p=0.95, repetition_penalty=repetition_penalty)
    rows = draft_rows(conn, context, 6, random_atom_set, seed=42, **sampler)
    assert [r[0] for r in rows] == list(range(6))
    drafted = [r[1] for r in rows]
    generated = conn.execute(
        "SELECT generate_tokens(%s, 6, temperature => %s, top_k => %s, top_p => %s, atom_set => %s, "
        "repetition_penalty => %s, seed => 42)",
        (context, temperature, sampler["top_k"], sampler["top_p"], random_atom_set, repetition_penalty)).fetchone()[0]
    assert drafted == generated
    for step, token, ids, probs in rows:
        expected = conn.execute(
            "SELECT token_id, probability FROM next_token(%s, temperature => %s, top_k => %s, top_p => %s, "
            "atom_set => %s, repetition_penalty => %s)",
            (context + drafted[:step], temperature, sampler["top_k"], sampler["top_p"], random_atom_set,
             repetition_penalty)).fetchall()
        assert list(zip(ids, probs)) == expected
        assert token in ids
    # first_step shifts the draws: from step 3 on, the same seed continues the same sequence
    later = draft_rows(conn, context + drafted[:3], 3, random_atom_set, seed=42, first_step=3, **sampler)
    assert [r[1] for r in later] == drafted[3:]


def test_draft_tokens_stops_after_a_stop_token(conn, random_atom_set):
    rows = draft_rows(conn, [10, 20, 30], 8, random_atom_set, temperature=0.0)
    drafted = [r[1] for r in rows]
    i = next(i for i in range(1, len(drafted)) if drafted[i] not in drafted[:i])
    stopped = draft_rows(conn, [10, 20, 30], 8, random_atom_set, temperature=0.0, stop_tokens=[drafted[i]])
    assert [r[1] for r in stopped] == drafted[:i + 1]


def test_draft_tokens_is_installed_by_migrations_and_runs_as_the_reader(server_url, reader_url, random_atom_set):
    from hartonomous.db import migrate

    assert migrate.function_drift(server_url) == []
    with psycopg.connect(reader_url) as conn:
        rows = draft_rows(conn, [1, 2, 3], 3, random_atom_set)
    assert 1 <= len(rows) <= 3


def test_migrations_install_and_remove_draft_tokens_and_migrate_adds_it_to_an_existing_database(
        scratch_database):
    """A fresh migrate installs it (with EXECUTE for the reader); a downgrade removes it; on a
    database migrated before it existed, `hartonomous migrate` installs it."""
    import os
    import subprocess
    import sys

    from hartonomous.db import migrate

    def exists() -> bool:
        with psycopg.connect(scratch_database) as conn:
            return conn.execute("SELECT has_function_privilege('hartonomous_reader', p.oid, 'EXECUTE') "
                                "FROM pg_proc p WHERE p.proname = 'draft_tokens' "
                                "AND p.pronamespace = 'public'::regnamespace").fetchone() == (True,)

    migrate.upgrade(scratch_database)
    assert exists()
    migrate.downgrade(scratch_database, "0001")
    with psycopg.connect(scratch_database) as conn:
        assert conn.execute("SELECT count(*) FROM pg_proc WHERE proname = 'draft_tokens'").fetchone() == (0,)
    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database, autocommit=True) as conn:   # as if migrated before 040 existed
        conn.execute("DROP FUNCTION draft_tokens")
    done = subprocess.run([sys.executable, "-m", "hartonomous.cli", "migrate"], capture_output=True, text=True,
                          env={**os.environ, "HARTONOMOUS_DATABASE_URL": scratch_database}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "reinstalled 1 drifted function" in done.stdout
    assert exists() and migrate.function_drift(scratch_database) == []


def test_drafter_makes_one_database_call_per_round(spatial, monkeypatch):
    """Drafting k tokens costs one statement: the drafter is one draft_tokens query."""
    from hartonomous import sqlcalls

    engine = speculative(spatial, draft_tokens=4)
    calls = []
    original = sqlcalls.run

    def counting(conn, query, *, prepare=None):
        calls.append(query.sql)
        return original(conn, query, prepare=prepare)

    monkeypatch.setattr(sqlcalls, "run", counting)
    result = engine.generate(PROMPTS[0], GREEDY.with_options(max_new_tokens=12))
    assert len(calls) == result.stats.rounds - sum(1 for k in result.stats.draft_lengths if k == 0)
    assert all("draft_tokens" in sql for sql in calls)


# -- SmolLM2 (integration) ------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_set(server_url):
    from hartonomous.model import load_model, load_tokenizer
    from projection.build import BuildOptions, build

    require_smollm2()
    model, tokenizer = load_model("smollm2", "cpu"), load_tokenizer("smollm2")
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


@pytest.mark.integration
@pytest.mark.parametrize("tree_width", [1, 4])
def test_greedy_identity_on_the_int4_runtime(server_url, smollm2_set, tree_width):
    """On the int4 runtime a token's logits do not depend on what else is in the forward (attention row by
    row, a batch-invariant matmul), so chains and trees verified in one forward give the runtime's own
    one-token greedy output, token for token."""
    from hartonomous.runtimes import load_exact_model
    from hartonomous.speculative.draft_cost import ForwardCosts

    name, _, _ = smollm2_set
    model = load_exact_model("int4", "smollm2", "cpu")
    config = GenerationConfig(max_new_tokens=48, temperature=0.0)
    flat = ForwardCosts((0.010,) + (0.012,) * 15)          # drafting always pays: every round drafts
    widths: list[int] = []
    with psycopg.connect(server_url, autocommit=True) as conn:
        spatial = SpatialBackend(conn, name, tokenizer=model.tokenizer)
        engine = Engine(SpeculativeBackend(ExactBackend(model), spatial, costs=flat, max_tree_width=tree_width))
        if tree_width > 1:
            engine.backend.policy = lambda sampler: FixedTree(tree_width)     # every round a tree
        for prompt in ["The capital of France is", "def fibonacci(n):", "Return a list of the"]:
            expected, got = Engine(ExactBackend(model)).generate(prompt, config), engine.generate(prompt, config)
            assert got.token_ids == expected.token_ids
            assert got.stats.drafted > 0
            widths.extend(got.stats.draft_widths)
    assert (max(widths) > 1) == (tree_width > 1)             # trees were verified where they were allowed


# -- cost-shaped draft lengths (hartonomous/speculative/draft_cost.py) ---------------------------------------

def cost_tables():
    from hartonomous.speculative.draft_cost import ForwardCosts

    flat = ForwardCosts((0.040,) + (0.045,) * 15)                 # long drafts almost free: draft long
    linear = ForwardCosts(tuple(0.040 * n for n in range(1, 17)))  # every fed token costs: stay plain
    return flat, linear


@pytest.mark.parametrize("drafter", ["spatial", "random_spatial"])
def test_greedy_output_is_the_exact_paths_with_cost_shaped_drafts(request, drafter):
    for costs in cost_tables():
        engine = speculative(request.getfixturevalue(drafter), draft_tokens=4, max_draft_tokens=8, costs=costs)
        for prompt in PROMPTS:
            got = engine.generate(prompt, GREEDY)
            assert got.token_ids == exact_engine().generate(prompt, GREEDY).token_ids
            assert got.stats.draft_lengths[0] == 4 and max(got.stats.draft_lengths) <= 8


def test_cost_shaped_drafts_follow_the_costs(spatial):
    """A drafter that is always right drafts long where long drafts are cheap and stays plain where
    every fed token costs a forward of its own."""
    flat, linear = cost_tables()
    config = GREEDY.with_options(max_new_tokens=40)
    engine = speculative(spatial, draft_tokens=2, max_draft_tokens=8, costs=flat)
    engine.backend.drafter = OracleDrafter()
    assert engine.generate(PROMPTS[0], config).stats.draft_lengths[1:3] == [8, 8]
    engine = speculative(spatial, draft_tokens=2, max_draft_tokens=8, costs=linear)
    engine.backend.drafter = OracleDrafter()
    assert engine.generate(PROMPTS[0], config).stats.draft_lengths[1:3] == [0, 0]


def test_a_sample_does_not_depend_on_the_measured_costs(random_spatial):
    """At T > 0 the cost policy's plain rounds judge a 1-token draft, so two machines (cost tables)
    give the seed's one sample: the fixed 1-token schedule's."""
    config = SAMPLED.with_options(max_new_tokens=24)
    reference = speculative(random_spatial, draft_tokens=1, adaptive=False).generate(PROMPTS[0], config).token_ids
    for costs in cost_tables():
        got = speculative(random_spatial, draft_tokens=4, costs=costs).generate(PROMPTS[0], config)
        assert got.token_ids == reference


# -- greedy trees: one database call drafts a tree, one forward with a 4D mask verifies it ---------

def test_one_forward_with_a_tree_mask_gives_each_branch_its_own_chains_logits():
    """ExactModel.extend_tree: every fed token's logits equal those of its own chain computed from
    scratch, and the cache keeps the pending tokens and the first branch where a chain would."""
    exact = tiny_exact_backend().model
    _, tokenizer = tiny_model(0)
    prompt = tokenizer.encode(PROMPTS[0])
    cache = exact.new_cache()
    exact.prefill(prompt[:-2], cache)
    branches = [[5, 6, 7], [9, 10], [11], []]
    logits = exact.extend_tree(prompt[-2:], branches, cache)
    assert logits.shape[0] == 2 + 3 + 2 + 1 and cache.length == len(prompt) + 6
    assert torch.allclose(logits[:2], exact.full_logits_many(prompt, 2), atol=1e-5)
    row = 2
    for branch in branches:
        if branch:
            assert torch.allclose(logits[row:row + len(branch)], exact.full_logits_many(prompt + branch, len(branch)),
                                  atol=1e-5)
        row += len(branch)
    cache.crop(len(prompt) + 3)                         # the first branch, laid out right after the prompt
    after = exact.decode_one_token(8, cache)
    assert torch.allclose(after, exact.full_logits(prompt + [5, 6, 7, 8]), atol=1e-5)


class TreeOracle:
    """Greedy branches from the exact model itself, with the right first token at `rank` among them
    (others: wrong ids); the same shape a database tree has, standing in for it."""

    def __init__(self, rank=lambda position: 0, wrong_later=lambda position: False):
        self.exact, self.rank, self.wrong_later = tiny_exact_backend(), rank, wrong_later

    def draft(self, *args, **kwargs):
        return OracleDrafter().draft(*args, **kwargs)

    def draft_tree(self, ids, depth, width, sampler, stop_token_ids):
        position = len(ids)
        state = self.exact.start(ids)
        right = self.exact.distribution(state, sampler).token_ids[0]
        chain = [right]
        self.exact.advance(state, right)
        for j in range(1, depth):
            token = self.exact.distribution(state, sampler).token_ids[0]
            if self.wrong_later(position + j):
                token = (token + 1) % self.exact.model.vocab_size
            chain.append(token)
            self.exact.advance(state, token)
        branches = [[(right + 1 + i) % self.exact.model.vocab_size] + chain[1:] for i in range(width)]
        rank = self.rank(position)
        if rank is not None and rank < width:
            branches[rank] = chain
        return branches


class FixedTree:
    """A draft policy that always drafts trees of `width` branches of 4 tokens: which rounds draft
    trees must not depend on how fast this machine runs the tiny model."""

    def __init__(self, width: int):
        self.width = self.max_width = width

    def length(self, left: int) -> int:
        return min(4, left)

    def update(self, *args) -> None:
        pass

    def update_tree(self, *args) -> None:
        pass


@pytest.mark.parametrize("rank, wrong_later", [
    (lambda p: 0, lambda p: False),                       # the first branch, kept whole
    (lambda p: p % 3, lambda p: p % 7 == 2),              # any branch, cut short now and then
    (lambda p: None, lambda p: False),                    # never the right first token
])
@pytest.mark.parametrize("repetition_penalty", [1.0, 1.3])
def test_greedy_trees_give_the_exact_paths_output_token_for_token(spatial, rank, wrong_later, repetition_penalty):
    from hartonomous.speculative.draft_cost import CostShapedPolicy, ForwardCosts

    config = GREEDY.with_options(repetition_penalty=repetition_penalty, max_new_tokens=40)
    flat = ForwardCosts((0.04,) * 16)                   # every width costs the same: trees are tried
    engine = speculative(spatial, draft_tokens=4, max_draft_tokens=6, costs=flat, max_tree_width=3)
    engine.backend.drafter = TreeOracle(rank, wrong_later)
    assert isinstance(engine.backend.policy(config.sampler), CostShapedPolicy)
    engine.backend.policy = lambda sampler: FixedTree(3)
    for prompt in PROMPTS:
        got = engine.generate(prompt, config)
        assert got.token_ids == exact_engine().generate(prompt, config).token_ids
        assert max(got.stats.draft_widths) > 1
        assert got.stats.tokens == len(got.token_ids) and got.stats.rounds == got.stats.forwards


def test_a_tree_whose_later_branch_is_right_keeps_it_and_refeeds_it(spatial):
    from hartonomous.speculative.draft_cost import ForwardCosts

    config = GREEDY.with_options(max_new_tokens=30)
    engine = speculative(spatial, draft_tokens=4, max_draft_tokens=6, costs=ForwardCosts((0.04,) * 16),
                         max_tree_width=3)
    engine.backend.drafter = TreeOracle(rank=lambda p: 1)
    engine.backend.policy = lambda sampler: FixedTree(3)
    got = engine.generate(PROMPTS[1], config)
    assert got.token_ids == exact_engine().generate(PROMPTS[1], config).token_ids
    assert got.stats.tokens_per_forward > 2               # the second branch's tokens were kept


def tree_engine(spatial) -> Engine:
    """Speculative rounds that draft trees of 3 branches after a first 1-token round."""
    from hartonomous.speculative.draft_cost import ForwardCosts

    engine = speculative(spatial, draft_tokens=1, max_draft_tokens=4, costs=ForwardCosts((0.04,) * 16),
                         max_tree_width=3)
    engine.backend.policy = lambda sampler: FixedTree(3)
    return engine


def test_sampling_may_draft_trees_too(spatial):
    from hartonomous.speculative.draft_cost import ForwardCosts

    engine = speculative(spatial, draft_tokens=4, costs=ForwardCosts((0.04,) * 16), max_tree_width=4)
    assert engine.backend.policy(SAMPLED.sampler).max_width == engine.backend.policy(GREEDY.sampler).max_width == 4
    result = tree_engine(spatial).generate(PROMPTS[0], SAMPLED)
    assert max(result.stats.draft_widths) == 3
    with pytest.raises(UserError, match="max_tree_width must be between 1 and 16"):
        speculative(spatial, max_tree_width=17)


def test_a_sample_with_trees_does_not_depend_on_the_costs_that_choose_trees_or_chains(spatial):
    """At T > 0 with trees allowed, cost tables that make one run draft trees, another chains and a
    third plain steps give the seed's one sample: the shape a machine's timings pick never picks
    the tokens."""
    from hartonomous.speculative.draft_cost import ForwardCosts

    # Forwards of a second, beside which this machine's draft calls (milliseconds) do not count.
    trees = ForwardCosts((1.0,) * 16)                        # every width costs the same: trees pay
    chains = ForwardCosts((1.0, 1.0) + (100.0,) * 14)        # 2 fed tokens cheap, 3+ (any tree) dear
    plain = ForwardCosts(tuple(1.0 * n for n in range(1, 17)))    # every fed token costs: no drafts pay
    config = SAMPLED.with_options(max_new_tokens=24)
    runs = {}
    for name, costs in (("trees", trees), ("chains", chains), ("plain", plain)):
        engine = speculative(spatial, draft_tokens=2, max_draft_tokens=2, costs=costs, max_tree_width=3)
        runs[name] = engine.generate(PROMPTS[0], config)
    tree_stats, chain_stats, plain_stats = (runs[name].stats for name in ("trees", "chains", "plain"))
    assert max(tree_stats.draft_widths) > 1
    assert max(chain_stats.draft_widths) == 1 and max(chain_stats.draft_lengths[1:]) == 2   # chains after the first
    assert runs["trees"].token_ids == runs["chains"].token_ids == runs["plain"].token_ids
    assert plain_stats.draft_lengths[1:].count(0) > len(plain_stats.draft_lengths) // 2
    assert len(runs["trees"].token_ids) == 24
    other = speculative(spatial, draft_tokens=2, max_draft_tokens=2, costs=trees, max_tree_width=3).generate(
        PROMPTS[0], config.with_options(seed=12))
    assert other.token_ids != runs["trees"].token_ids           # the seed still decides


# Trees need a first chain round and then rounds of 2+ tokens: 4 tokens a run, top-k 2 so that each
# of the 16 sequences expects ~90 of 1500 runs (the test has power; the check below shows it).
TREE_SAMPLER = SamplerArgs(temperature=1.3, top_k=2, top_p=1.0, repetition_penalty=1.2)


def test_sampled_output_with_trees_has_the_exact_paths_distribution(spatial):
    """Chi-squared over 1500 seeded runs of 4 tokens, each run a 1-token round and then trees,
    every position verified by drawing from p, against the exact path's joint probabilities."""
    engine = tree_engine(spatial)
    prompt = PROMPTS[0]
    joint = exact_joint(engine.encode(prompt), TREE_SAMPLER, 4)
    counts, totals = sampled_sequences(engine, prompt, 4, range(RUNS), TREE_SAMPLER)
    assert 0 < totals.accepted < totals.drafted          # trees kept drafts and lost some
    one = engine.generate(prompt, GenerationConfig(max_new_tokens=4, temperature=TREE_SAMPLER.temperature,
                                                   top_k=TREE_SAMPLER.top_k, top_p=TREE_SAMPLER.top_p,
                                                   repetition_penalty=TREE_SAMPLER.repetition_penalty,
                                                   stop_at_eos=False, seed=0))
    assert max(one.stats.draft_widths) == 3
    assert chi_squared_p_value(counts, joint) > ALPHA


def test_the_tree_distribution_test_catches_greedy_verification_at_t_above_0(spatial, monkeypatch):
    """Power check: verifying trees by the argmax instead of a draw from p is exact at T = 0 only;
    at T = 1.3 the chi-squared test rejects it."""
    from hartonomous.speculative.decoding import SpeculativeRun

    original = SpeculativeRun._tree_round

    def argmax_tree(self, *args):
        self._draw = lambda probs, position: int(probs.argmax())
        try:
            yield from original(self, *args)
        finally:
            del self._draw

    monkeypatch.setattr(SpeculativeRun, "_tree_round", argmax_tree)
    engine = tree_engine(spatial)
    joint = exact_joint(engine.encode(PROMPTS[0]), TREE_SAMPLER, 4)
    counts, _ = sampled_sequences(engine, PROMPTS[0], 4, range(500), TREE_SAMPLER)
    assert chi_squared_p_value(counts, joint) < ALPHA


def test_sql_draft_tree_branches_into_the_most_likely_first_tokens_each_continued_greedily(server_url, atom_set):
    _, tokenizer = tiny_model(0)
    context = tokenizer.encode(PROMPTS[0])
    with psycopg.connect(server_url, autocommit=True) as conn:
        rows = conn.execute("SELECT branch, step, token_id FROM draft_tree(%s, 4, 3, atom_set => %s)",
                            (context, atom_set)).fetchall()
        first = [t for (t,) in conn.execute("SELECT token_id FROM next_token(%s, temperature => 1, top_k => 3, "
                                            "top_p => 1, atom_set => %s)", (context, atom_set)).fetchall()][:3]
        branches = {}
        for b, step, token in rows:
            branches.setdefault(b, []).append((step, token))
        assert sorted(branches) == list(range(1, len(first) + 1))
        for b, steps in branches.items():
            assert [s for s, _ in steps] == list(range(len(steps)))
            assert steps[0][1] == first[b - 1]
            rest = [t for (_, t) in conn.execute("SELECT step, token_id FROM draft_tokens(%s, 3, temperature => 0, "
                                                 "atom_set => %s)", (context + [first[b - 1]], atom_set)).fetchall()]
            assert [t for _, t in steps[1:]] == rest
        chain = [t for (t,) in conn.execute("SELECT token_id FROM draft_tokens(%s, 4, temperature => 0, "
                                            "atom_set => %s)", (context, atom_set)).fetchall()]
        assert [t for _, t in branches[1]] == chain
        for args, message in [("0, 2", "depth must be between 1 and 64"), ("3, 17", "width must be between 1 and 16")]:
            with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
                conn.execute(f"SELECT * FROM draft_tree(%s, {args}, atom_set => %s)", (context, atom_set))
