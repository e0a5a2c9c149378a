"""The spatial backends against a real database: Python loop == in-database generate_tokens, errors."""

from __future__ import annotations

import threading

import psycopg
import pytest

from generation_helpers import drop_atom_set, tiny_atom_set, write_tiny_atom_set
from hartonomous.backends.in_database import InDatabaseBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.engine import Engine, State
from hartonomous.errors import UserError
from hartonomous.generation_config import MAX_NEW_TOKENS, GenerationConfig
from tiny_model import tiny_tokenizer

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def atom_set(server_url):
    with tiny_atom_set(server_url, seed=1) as name:
        yield name


@pytest.fixture
def db(server_url):
    with psycopg.connect(server_url, autocommit=True) as conn:
        yield conn


def engines(db, atom_set):
    tok = tiny_tokenizer()
    return (Engine(SpatialBackend(db, atom_set, tokenizer=tok)),
            Engine(InDatabaseBackend(db, atom_set, tokenizer=tok)))


@pytest.mark.parametrize("options", [
    dict(temperature=1.0, top_k=40, top_p=0.9, repetition_penalty=1.0, seed=1),
    dict(temperature=0.7, top_k=0, top_p=1.0, repetition_penalty=1.3, seed=2),
    dict(temperature=1.5, top_k=5, top_p=0.5, repetition_penalty=0.8, seed=-3),
    dict(temperature=0.0, top_k=40, top_p=0.9, repetition_penalty=1.2, seed=4),
])
def test_python_loop_equals_in_database_generate_tokens(db, atom_set, options):
    config = GenerationConfig(max_new_tokens=20, stop_at_eos=False, **options)
    python_loop, in_database = engines(db, atom_set)
    stepped = python_loop.generate(PROMPT, config)
    whole = in_database.generate(PROMPT, config)
    ids = tiny_tokenizer().encode(PROMPT)
    (direct,) = db.execute(
        "SELECT generate_tokens(%s, 20, %s, %s, %s, NULL, 100, %s, %s, %s, NULL)",
        (ids, options["temperature"], options["top_k"], options["top_p"], atom_set,
         options["repetition_penalty"], options["seed"])).fetchone()
    assert stepped.token_ids == whole.token_ids == direct
    assert stepped.text == whole.text
    assert whole.state is State.COMPLETE and len(direct) == 20


@pytest.mark.parametrize("repetition_penalty", [1.0, 1.4])
def test_windowed_atom_set_python_loop_equals_in_database(db, server_url, repetition_penalty):
    name = write_tiny_atom_set(server_url, model="tiny", seed=5, window=2, decay=0.5)
    try:
        python_loop, in_database = engines(db, name)
        config = GenerationConfig(max_new_tokens=25, stop_at_eos=False, seed=8, repetition_penalty=repetition_penalty)
        stepped = python_loop.generate(PROMPT, config)
        assert stepped.token_ids == in_database.generate(PROMPT, config).token_ids
        assert len(set(stepped.token_ids)) > 1
    finally:
        drop_atom_set(server_url, name)


@pytest.mark.parametrize("history_weight, history_window", [(None, None), (0.0, None), (3.0, 4), (50.0, 64)])
def test_with_history_atoms_the_cut_context_equals_the_whole_one(db, server_url, history_weight, history_window):
    """The per-step path sends only centroid window + history window ids; the database's own loop
    reads the whole context: the generated ids are the same, history atoms on or off."""
    name = write_tiny_atom_set(server_url, model="tiny", seed=6, window=3, decay=0.5)
    try:
        db.execute("UPDATE atom_sets SET history_weight = 2.0, history_window = 16 WHERE name = %s", (name,))
        tok = tiny_tokenizer()
        options = dict(history_weight=history_weight, history_window=history_window)
        stepped = Engine(SpatialBackend(db, name, tokenizer=tok, **options))
        whole = Engine(InDatabaseBackend(db, name, tokenizer=tok, **options))
        config = GenerationConfig(max_new_tokens=40, stop_at_eos=False, seed=4, temperature=0.8)
        prompt = PROMPT * 6                                   # longer than window + history window
        assert stepped.generate(prompt, config).token_ids == whole.generate(prompt, config).token_ids
        reach = SpatialBackend(db, name, tokenizer=tok, **options).history_reach()
        assert reach == {(None, None): 16, (0.0, None): 0, (3.0, 4): 4, (50.0, 64): 64}[(history_weight, history_window)]
    finally:
        drop_atom_set(server_url, name)


@pytest.mark.parametrize("options, message", [
    (dict(history_weight=-1.0), "history_weight must be a finite number >= 0"),
    (dict(history_window=5000), "history_window must be between 0 and 4096"),
])
def test_bad_history_options_are_refused_before_any_query(db, atom_set, options, message):
    with pytest.raises(UserError, match=message):
        SpatialBackend(db, atom_set, tokenizer=tiny_tokenizer(), **options)


def test_stop_tokens_and_strings_agree_between_modes(db, atom_set):
    python_loop, in_database = engines(db, atom_set)
    base = GenerationConfig(max_new_tokens=20, stop_at_eos=False, seed=9)
    ref = python_loop.generate(PROMPT, base)
    i = next(i for i in range(3, 20) if ref.token_ids[i] not in ref.token_ids[:i])
    by_id = base.with_options(stop_token_ids=(ref.token_ids[i],))
    assert python_loop.generate(PROMPT, by_id).token_ids == in_database.generate(PROMPT, by_id).token_ids \
        == ref.token_ids[:i + 1]
    stop = ref.text[len(ref.text) // 2:len(ref.text) // 2 + 1]
    by_text = base.with_options(stop_strings=(stop,))
    a, b = python_loop.generate(PROMPT, by_text), in_database.generate(PROMPT, by_text)
    assert a.token_ids == b.token_ids and a.text == b.text == ref.text[:ref.text.find(stop)]
    assert b.state is State.STOPPED and b.finish_reason == "stop_string"


def test_next_token_runs_as_a_prepared_statement(db, atom_set):
    python_loop, _ = engines(db, atom_set)
    python_loop.generate(PROMPT, GenerationConfig(max_new_tokens=3, seed=1))
    prepared = db.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%next_token(%'"
                          ).fetchone()[0]
    assert prepared == 1


def test_no_candidates_stops_the_generation(db, atom_set):
    engine = Engine(SpatialBackend(db, atom_set, tokenizer=tiny_tokenizer(), search_radius=1e-9))
    result = engine.generate(PROMPT, GenerationConfig(max_new_tokens=5, seed=1))
    assert result.token_ids == [] and result.state is State.STOPPED and result.finish_reason == "no_candidates"


def test_unknown_atom_set_and_bad_ids_are_user_errors(db, atom_set):
    with pytest.raises(UserError, match="no atom set named 'nope'"):
        SpatialBackend(db, "nope", tokenizer=tiny_tokenizer())
    with pytest.raises(UserError, match="max_neighbors"):
        SpatialBackend(db, atom_set, tokenizer=tiny_tokenizer(), max_neighbors=0)
    engine = Engine(SpatialBackend(db, atom_set, tokenizer=tiny_tokenizer()))
    with pytest.raises(UserError, match="context"):            # 22023 from SQL: id 5000 is not in the set
        engine.generate([1, 5000], GenerationConfig(max_new_tokens=2, seed=1))
    assert engine.generate([1, 2], GenerationConfig(max_new_tokens=2, seed=1)).token_ids  # connection still usable


def test_atom_set_tokenizer_comes_from_its_model(db, server_url, tmp_path):
    from generation_helpers import save_tiny_model

    folder = save_tiny_model(tmp_path / "tiny")
    name = write_tiny_atom_set(server_url, model=str(folder), seed=2)
    try:
        backend = SpatialBackend(db, name)
        assert backend.tokenizer.encode(PROMPT) == tiny_tokenizer().encode(PROMPT)
    finally:
        drop_atom_set(server_url, name)
    with pytest.raises(UserError, match="tokenizer is not available"):
        unknown = write_tiny_atom_set(server_url, model="some-model-we-do-not-have", seed=3)
        try:
            SpatialBackend(db, unknown)
        finally:
            drop_atom_set(server_url, unknown)


def test_in_database_generation_is_a_whole_loop_backend_of_its_own(db, atom_set):
    from hartonomous.backends.base import WholeLoopBackend

    stepped, whole = engines(db, atom_set)
    assert isinstance(whole.backend, WholeLoopBackend) and not isinstance(stepped.backend, WholeLoopBackend)
    assert stepped.atom_set == whole.atom_set == atom_set
    with pytest.raises(TypeError):
        SpatialBackend(db, atom_set, tokenizer=tiny_tokenizer(), in_database=True)
    events = list(whole.stream(PROMPT, GenerationConfig(max_new_tokens=4, seed=1, stop_at_eos=False)).events())
    assert len(events) == 4 and all(e.distribution is None and e.probability is None for e in events)


def test_in_database_generation_can_be_cancelled_mid_query(db, atom_set):
    _, in_database = engines(db, atom_set)
    cancel = threading.Event()
    timer = threading.Timer(0.5, cancel.set)
    timer.start()
    result = in_database.generate(PROMPT, GenerationConfig(max_new_tokens=MAX_NEW_TOKENS, stop_at_eos=False,
                                                           seed=1), cancel=cancel)
    timer.join()
    assert result.state is State.CANCELLED and result.token_ids == []
    assert db.execute("SELECT 1").fetchone() == (1,)
