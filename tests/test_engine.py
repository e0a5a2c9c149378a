"""The same engine tests against both backends: the tiny model (exact) and a hand-made atom set (spatial)."""

from __future__ import annotations

import threading

import psycopg
import pytest

from generation_helpers import tiny_atom_set
from hartonomous.backends.base import Distribution, WholeLoopBackend
from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.engine import Engine, State
from hartonomous.errors import InvalidArgument
from hartonomous.runtimes.reference import ExactModel
from hartonomous.generation_config import MAX_NEW_TOKENS, GenerationConfig
from hartonomous.textstream import REPLACEMENT, decode
from tiny_model import tiny_model

PROMPTS = ["The capital of France is", "def add(a, b):", "héllo wörld"]
SAMPLED = GenerationConfig(max_new_tokens=16, temperature=1.0, top_k=40, top_p=0.9, seed=11, stop_at_eos=False)


@pytest.fixture(scope="module")
def atom_set(server_url):
    with tiny_atom_set(server_url, seed=0) as name:
        yield name


@pytest.fixture(params=["exact", "spatial"])
def engine(request):
    model, tokenizer = tiny_model(0)
    if request.param == "exact":
        yield Engine(ExactBackend(ExactModel(model, tokenizer)))
        return
    url = request.getfixturevalue("server_url")
    name = request.getfixturevalue("atom_set")
    with psycopg.connect(url, autocommit=True) as conn:
        yield Engine(SpatialBackend(conn, name, tokenizer=tokenizer))


def reference(engine, prompt=PROMPTS[0], config=SAMPLED):
    return engine.generate(prompt, config)


def test_same_seed_same_tokens_and_different_seed_differs(engine):
    first, again = reference(engine), reference(engine)
    assert first.token_ids == again.token_ids and first.text == again.text
    assert first.seed == 11 and len(first.token_ids) == 16
    others = [reference(engine, config=SAMPLED.with_options(seed=s)).token_ids for s in (12, 13, 14)]
    assert any(o != first.token_ids for o in others)


def test_temperature_zero_is_deterministic_whatever_the_seed(engine):
    greedy = SAMPLED.with_options(temperature=0.0)
    runs = [engine.generate(PROMPTS[1], greedy.with_options(seed=s)) for s in (1, 2, 3)]
    assert runs[0].token_ids == runs[1].token_ids == runs[2].token_ids
    assert all(p == 1.0 for p in runs[0].probabilities)


def test_max_new_tokens_is_respected(engine):
    for n in (1, 5):
        result = engine.generate(PROMPTS[0], SAMPLED.with_options(max_new_tokens=n))
        assert len(result.token_ids) == n
        assert result.state is State.COMPLETE and result.finish_reason == "length"


def test_stop_token_id_ends_generation_after_that_token(engine):
    ref = reference(engine).token_ids
    i = next(i for i in range(2, len(ref)) if ref[i] not in ref[:i])
    result = engine.generate(PROMPTS[0], SAMPLED.with_options(stop_token_ids=(ref[i],)))
    assert result.token_ids == ref[:i + 1]
    assert result.state is State.STOPPED and result.finish_reason == "stop_token"
    assert result.text == decode(engine.tokenizer, ref[:i])


def test_eos_ends_generation_as_complete(engine):
    ref = reference(engine).token_ids
    i = next(i for i in range(1, len(ref)) if ref[i] not in ref[:i])

    class EosAt:                      # the same backend, with ref[i] declared as its EOS token
        def __init__(self, inner):
            self.inner, self.name, self.tokenizer = inner, inner.name, inner.tokenizer

        def eos_token_ids(self):
            return {ref[i]}

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

    result = Engine(EosAt(engine.backend)).generate(PROMPTS[0], SAMPLED.with_options(stop_at_eos=True))
    assert result.token_ids == ref[:i + 1]
    assert result.state is State.COMPLETE and result.finish_reason == "eos"


def test_stop_string_cuts_the_text(engine):
    ref = reference(engine, config=SAMPLED.with_options(max_new_tokens=24))
    text = ref.text
    start = next(p for p in range(len(text) // 3, len(text) - 2)
                 if REPLACEMENT not in text[p:p + 2] and text[p:p + 2].strip())
    stop = text[start:start + 2]
    result = engine.generate(PROMPTS[0], SAMPLED.with_options(max_new_tokens=24, stop_strings=(stop,)))
    assert result.text == text[:text.find(stop)]
    assert result.state is State.STOPPED and result.finish_reason == "stop_string"
    assert result.token_ids == ref.token_ids[:len(result.token_ids)] and len(result.token_ids) < 24
    pieces = list(engine.stream(PROMPTS[0], SAMPLED.with_options(max_new_tokens=24, stop_strings=(stop,))))
    assert "".join(pieces) == result.text


def test_streamed_pieces_join_to_the_blocking_text(engine):
    for seed in (1, 2, 3):
        config = SAMPLED.with_options(seed=seed, max_new_tokens=24)
        session = engine.stream(PROMPTS[2], config)
        assert session.state is State.READY
        pieces, states = [], []
        for piece in session:
            states.append(session.state)
            pieces.append(piece)
        assert states[0] is State.GENERATING     # the last piece may come after the state moved on
        blocking = engine.generate(PROMPTS[2], config)
        assert "".join(pieces) == blocking.text == session.result.text
        assert all(pieces) and all(not p.endswith(REPLACEMENT) for p in pieces[:-1])
        assert session.state is State.COMPLETE


def test_cancel_from_the_consumer_stops_before_the_next_token(engine):
    session = engine.stream(PROMPTS[0], SAMPLED)
    seen = []
    for event in session.events():
        seen.append(event.token_id)
        if len(seen) == 3:
            session.cancel()
    assert seen == reference(engine).token_ids[:3]
    assert session.state is State.CANCELLED and session.result.finish_reason == "cancelled"
    assert session.result.token_ids == seen


def test_a_consumer_that_stops_reading_cancels(engine):
    session = engine.stream(PROMPTS[0], SAMPLED)
    for n, _ in enumerate(session, 1):
        if n == 2:
            break
    assert session.state is State.CANCELLED
    assert 2 <= len(session.result.token_ids) < SAMPLED.max_new_tokens


def test_cancel_during_a_step_discards_that_step(engine):
    cancel = threading.Event()
    backend, calls = engine.backend, []
    original = backend.distribution

    def distribution(state, sampler):           # the cancel arrives while step 2 is being computed
        calls.append(1)
        if len(calls) == 3:
            cancel.set()
        return original(state, sampler)

    backend.distribution = distribution
    try:
        result = engine.generate(PROMPTS[0], SAMPLED, cancel=cancel)
    finally:
        del backend.distribution
    assert len(calls) == 3 and len(result.token_ids) == 2
    assert result.state is State.CANCELLED


def test_cancelled_before_start_makes_nothing(engine):
    cancel = threading.Event()
    cancel.set()
    result = engine.generate(PROMPTS[0], SAMPLED, cancel=cancel)
    assert result.token_ids == [] and result.text == "" and result.state is State.CANCELLED


def test_batch_equals_one_by_one(engine):
    batch = engine.generate_batch(PROMPTS, SAMPLED)
    single = [engine.generate(p, SAMPLED) for p in PROMPTS]
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]
    assert [r.text for r in batch] == [r.text for r in single]


def test_timings_and_probabilities_per_token(engine):
    result = reference(engine)
    assert len(result.timings.per_token_s) == len(result.token_ids) == len(result.probabilities)
    assert all(0 < p <= 1 for p in result.probabilities)
    assert result.timings.total_s == pytest.approx(sum(result.timings.per_token_s))


def test_empty_prompt_is_a_user_error(engine):
    from hartonomous.errors import UserError

    with pytest.raises(UserError, match="empty"):
        engine.generate("   ", SAMPLED)
    with pytest.raises(UserError, match="empty"):
        engine.generate([], SAMPLED)


def test_a_session_runs_once(engine):
    session = engine.stream(PROMPTS[0], SAMPLED.with_options(max_new_tokens=2))
    session.run()
    with pytest.raises(RuntimeError, match="runs once"):
        session.run()


@pytest.mark.parametrize("options, message", [
    ({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
])
def test_out_of_range_options_are_user_errors_naming_the_option(options, message):
    with pytest.raises(InvalidArgument, match=message) as err:
        SAMPLED.with_options(**options)
    assert err.value.name == message


def test_max_new_tokens_has_one_documented_upper_bound():
    assert MAX_NEW_TOKENS == 4096
    assert SAMPLED.with_options(max_new_tokens=MAX_NEW_TOKENS).max_new_tokens == MAX_NEW_TOKENS
    for too_many in (MAX_NEW_TOKENS + 1, 100_000):
        with pytest.raises(InvalidArgument, match="max_new_tokens must be an integer between 1 and 4096") as err:
            SAMPLED.with_options(max_new_tokens=too_many)
        assert err.value.name == "max_new_tokens"


def test_sampler_defaults_live_in_generation_config():
    config = GenerationConfig()
    assert (config.temperature, config.top_k, config.top_p, config.repetition_penalty) == (1.0, 40, 0.9, 1.0)
    assert config.sampler.top_k == 40 and config.sampler.top_p == 0.9


def test_vectorised_pick_for_large_distributions_equals_pick_by_uniform():
    import random

    from hartonomous.engine import VECTOR_PICK_ABOVE, pick
    from hartonomous.sampling import pick_by_uniform, seeded_uniform

    rng = random.Random(0)
    weights = sorted(((rng.random() ** 4, t) for t in range(3 * VECTOR_PICK_ABOVE)), key=lambda r: (-r[0], r[1]))
    total = sum(w for w, _ in weights)
    dist = Distribution([t for _, t in weights], [w / total for w, _ in weights])
    for step in range(300):
        token, prob = pick(dist, seed=7, step=step)
        assert token == pick_by_uniform(dist.token_ids, dist.probabilities, seeded_uniform(7, step))
        assert prob == dist.probabilities[dist.token_ids.index(token)]


def test_tokens_are_picked_by_inverse_cdf_of_seeded_uniform():
    from hartonomous.sampling import seeded_uniform

    class Fixed:                                   # the same hand-made distribution at every step
        name, tokenizer = "fixed", tiny_model(0)[1]

        def eos_token_ids(self):
            return set()

        def start(self, ids):
            return None

        def distribution(self, state, sampler):
            return Distribution([50, 30, 90], [0.5, 0.3, 0.2])

        def advance(self, state, token):
            pass

    result = Engine(Fixed()).generate([1], GenerationConfig(max_new_tokens=12, seed=42))
    expected = []
    for step in range(12):               # CDF: 50 below 0.5, 30 below 0.8, then 90
        u = seeded_uniform(42, step)
        expected.append(50 if u < 0.5 else 30 if u < 0.8 else 90)
    assert result.token_ids == expected and len(set(expected)) > 1
    assert result.probabilities == [{50: 0.5, 30: 0.3, 90: 0.2}[t] for t in expected]


# -- what the events carry ---------------------------------------------------------------------


def test_each_event_carries_the_distribution_the_backend_returned(engine):
    backend, returned = engine.backend, []
    original = backend.distribution

    def distribution(state, sampler):
        returned.append(original(state, sampler))
        return returned[-1]

    backend.distribution = distribution
    try:
        events = list(engine.stream(PROMPTS[0], SAMPLED).events())
    finally:
        del backend.distribution
    assert len(events) == len(returned) == SAMPLED.max_new_tokens
    assert all(e.distribution is d for e, d in zip(events, returned))
    assert all(e.probability == d.probabilities[d.token_ids.index(e.token_id)] for e, d in zip(events, returned))
    assert engine.distribution(PROMPTS[0], SAMPLED) == returned[0]


def test_engine_names_the_atom_set_of_its_backend(engine, request):
    expected = request.getfixturevalue("atom_set") if engine.backend.name == "spatial" else None
    assert engine.atom_set == expected


class Scripted:
    """A step backend that proposes the scripted tokens in turn (probability 1), then nothing."""

    name, atom_set_name = "scripted", None

    def __init__(self, script):
        self.script, self.tokenizer = list(script), tiny_model(0)[1]

    def eos_token_ids(self):
        return set()

    def start(self, ids):
        return [0]

    def distribution(self, state, sampler):
        i = state[0]
        return Distribution([self.script[i]], [1.0]) if i < len(self.script) else Distribution([], [])

    def advance(self, state, token):
        state[0] += 1

    def close(self):
        pass


class WholeScripted(WholeLoopBackend):
    """A whole-loop backend that returns the script (cut at a stop id), like SQL generate_tokens."""

    name, atom_set_name = "scripted", None

    def __init__(self, script):
        self.script, self.tokenizer, self.calls = list(script), tiny_model(0)[1], 0

    def eos_token_ids(self):
        return set()

    def generate_all(self, prompt_ids, max_new_tokens, sampler, seed, stop_token_ids, cancel):
        self.calls += 1
        out = []
        for token in self.script[:max_new_tokens]:
            out.append(token)
            if token in stop_token_ids:
                break
        return out

    def close(self):
        pass


A, E_FIRST_BYTE, E_SECOND_BYTE = 65, 128, 103          # "a", and "é" as two byte tokens


@pytest.mark.parametrize("backend", [Scripted, WholeScripted])
def test_text_held_back_to_the_end_comes_in_the_last_event(backend):
    engine = Engine(backend([A, E_FIRST_BYTE, E_SECOND_BYTE, A]))
    cut_mid_character = engine.stream([1], GenerationConfig(max_new_tokens=2, seed=1))
    events = list(cut_mid_character.events())
    assert [e.text for e in events] == ["a", "\ufffd"] and cut_mid_character.result.text == "a\ufffd"
    held_as_stop_prefix = engine.stream([1], GenerationConfig(max_new_tokens=2, seed=1, stop_strings=("ab",)))
    assert [e.text for e in held_as_stop_prefix.events()] == ["", "a\ufffd"]
    assert held_as_stop_prefix.tail == "" and held_as_stop_prefix.result.finish_reason == "length"
    stopped_by_id = engine.stream([1], GenerationConfig(max_new_tokens=4, seed=1, stop_token_ids=(E_SECOND_BYTE,)))
    assert [e.text for e in stopped_by_id.events()] == ["a", "", "\ufffd"]     # the stop token carries it
    assert stopped_by_id.result.text == "a\ufffd" and stopped_by_id.result.finish_reason == "stop_token"


@pytest.mark.parametrize("backend, texts, tail", [
    (Scripted, ["a", ""], "\ufffd"),          # stepping finds out only at the next step: the tail
    (WholeScripted, ["a", "\ufffd"], ""),     # the whole loop knows its last token: that event
])
def test_text_held_back_when_no_token_follows_is_the_sessions_tail(backend, texts, tail):
    engine = Engine(backend([A, E_FIRST_BYTE]))         # no candidates after the first half of "é"
    session = engine.stream([1], GenerationConfig(max_new_tokens=5, seed=1))
    events = list(session.events())
    assert [e.text for e in events] == texts and session.tail == tail
    assert session.result.finish_reason == "no_candidates" and session.result.text == "a\ufffd"
    assert list(engine.stream([1], GenerationConfig(max_new_tokens=5, seed=1))) == ["a", "\ufffd"]


def test_a_whole_loop_backend_is_called_once_and_its_events_carry_no_step_data():
    backend = WholeScripted([A, A, E_FIRST_BYTE, E_SECOND_BYTE])
    session = Engine(backend).stream([1], GenerationConfig(max_new_tokens=4, seed=1))
    events = list(session.events())
    assert backend.calls == 1 and [e.token_id for e in events] == [A, A, E_FIRST_BYTE, E_SECOND_BYTE]
    assert all(e.distribution is None and e.probability is None and e.seconds is None for e in events)
    assert "".join(e.text for e in events) == session.result.text == "aaé"
    assert session.state is State.COMPLETE and session.result.finish_reason == "length"
