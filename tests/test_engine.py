"""The same engine tests against both backends: the tiny model (exact) and a hand-made atom set (spatial)."""

from __future__ import annotations

import threading

import psycopg
import pytest

from generation_helpers import drop_atom_set, write_tiny_atom_set
from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.engine import Engine, GenerationConfig, State
from hartonomous.exact import ExactModel
from hartonomous.textstream import REPLACEMENT, decode
from tiny_model import tiny_model

PROMPTS = ["The capital of France is", "def add(a, b):", "héllo wörld"]
SAMPLED = GenerationConfig(max_new_tokens=16, temperature=1.0, top_k=40, top_p=0.9, seed=11, stop_at_eos=False)


@pytest.fixture(scope="module")
def atom_set(server_url):
    name = write_tiny_atom_set(server_url, model="tiny")
    yield name
    drop_atom_set(server_url, name)


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
def test_out_of_range_options_are_user_errors(options, message):
    from hartonomous.errors import UserError

    with pytest.raises(UserError, match=message):
        SAMPLED.with_options(**options)


def test_vectorised_pick_for_large_distributions_equals_pick_by_uniform():
    import random

    from hartonomous.backends.base import Distribution
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
    from hartonomous.backends.base import Distribution
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
