"""The memory of past generations: remember() keys, bounds, evicts and validates; the bound is the
set's (memory_bounds), not the caller's; only the owner writes either; only the exact model's words
are remembered; the KNN reads it only when asked; drafts and the clients use it.

SQL first (sql/070_memory.sql, sql/015_knn.sql rule 4), on a real database, then the Python
writer and the speculative path with the tiny model.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import psycopg
import pytest
import torch

from generation_helpers import drop_atom_set, write_tiny_atom_set
from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
from hartonomous.client import Client
from hartonomous.errors import UserError
from hartonomous.runtimes.reference import ExactModel
from hartonomous.generation_config import GenerationConfig
from hartonomous.memory import (REMEMBERED_PATHS, MemoryPolicy, MemoryWriter, NotRemembered,
                                            SamplerSettings, worth_remembering)
from generation_helpers import SMOLLM2_ON_TWO_CORES
from tiny_model import tiny_model

VOCAB = 40
CONTEXT = [1, 2, 3]
GENERATED = [7, 8, 9, 10, 11]
GREEDY = SamplerSettings(temperature=0.0, top_k=None, top_p=1.0, repetition_penalty=1.0, adaptive=False,
                         ignore_eos=False)
# The generations below run greedy past the tiny model's EOS (stop_at_eos=False, for a fixed length):
# the owner of their set allows that (test_memory_policy.py tests the policy itself).
PAST_EOS = MemoryPolicy(allow_ignore_eos=True)


@pytest.fixture(scope="module")
def memory_set(server_url: str) -> str:
    """Forty tokens, 800 random context atoms, a 3-token window with decay 0.5, history weight 2."""
    rng = np.random.default_rng(11)
    name = "memory-test"
    with psycopg.connect(server_url) as conn:
        write_atom_set(
            conn,
            AtomSetSpec(name=name, model="synthetic", vocab_size=VOCAB, embedding_dim=0, projection="synthetic",
                        kind="context", centroid_window=3, centroid_decay=0.5, history_weight=2.0),
            TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], rng.random((VOCAB, 3))),
            AtomRows(rng.integers(0, VOCAB, 800), rng.random((800, 3)), rng.uniform(0.5, 2.0, 800)),
            replace=True,
        )
    return name


UNBOUND = "DELETE FROM memory_bounds b USING atom_sets s WHERE s.id = b.atom_set_id AND s.name = %s"


@pytest.fixture
def owner(server_url: str, memory_set: str):
    """An autocommit owner connection on an empty memory with the default bound (so again afterwards)."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("SELECT forget(%s)", (memory_set,))
        conn.execute(UNBOUND, (memory_set,))
        yield conn
        conn.execute("SELECT forget(%s)", (memory_set,))
        conn.execute(UNBOUND, (memory_set,))


def remember(conn, atom_set, context=CONTEXT, generated=GENERATED, path="exact", max_atoms=None, weight=None,
             settings=GREEDY):
    """remember() of a greedy generation (test_memory_policy.py tries the others)."""
    return conn.execute("SELECT * FROM remember(%s, %s, %s, %s, max_atoms => %s, weight => %s, temperature => %s, "
                        "top_k => %s, top_p => %s, repetition_penalty => %s, adaptive => %s, ignore_eos => %s)",
                        (atom_set, context, generated, path, max_atoms, weight, settings.temperature,
                         settings.top_k, settings.top_p, settings.repetition_penalty, settings.adaptive,
                         settings.ignore_eos)).fetchone()


def memory_rows(conn, atom_set) -> list[tuple]:
    return conn.execute(
        "SELECT m.generation, m.step, ST_X(m.position), ST_Y(m.position), ST_Z(m.position), m.token_id, m.weight, m.path"
        "  FROM memory_atoms m JOIN atom_sets s ON s.id = m.atom_set_id WHERE s.name = %s"
        " ORDER BY m.generation, m.step", (atom_set,)).fetchall()


def centroid(conn, context, atom_set) -> tuple[float, float, float]:
    return conn.execute("SELECT ST_X(c), ST_Y(c), ST_Z(c) FROM context_centroid(%s, %s) c",
                        (list(context), atom_set)).fetchone()


# -- remember(): what it stores -----------------------------------------------------------------

def test_each_generated_token_is_an_atom_at_the_key_of_the_text_before_it(owner, memory_set):
    generation, remembered, evicted, atoms = remember(owner, memory_set)
    assert (remembered, evicted, atoms) == (len(GENERATED), 0, len(GENERATED))
    rows = memory_rows(owner, memory_set)
    assert [r[1] for r in rows] == list(range(len(GENERATED)))
    assert [r[5] for r in rows] == GENERATED
    assert {r[0] for r in rows} == {generation}
    assert {r[6] for r in rows} == {2.0}            # the set's history_weight
    assert {r[7] for r in rows} == {"exact"}
    text = CONTEXT + GENERATED
    for k, row in enumerate(rows):
        expected = centroid(owner, text[:len(CONTEXT) + k], memory_set)
        assert row[2:5] == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_generations_are_numbered_in_order_and_carry_their_path_and_weight(owner, memory_set):
    first = remember(owner, memory_set)[0]
    second = remember(owner, memory_set, generated=[5, 6], path="speculative", weight=7.5)[0]
    assert second > first
    rows = [r for r in memory_rows(owner, memory_set) if r[0] == second]
    assert [(r[5], r[6], r[7]) for r in rows] == [(5, 7.5, "speculative"), (6, 7.5, "speculative")]
    status = owner.execute("SELECT atoms, generations FROM memory_status(%s)", (memory_set,)).fetchone()
    assert status == (len(GENERATED) + 2, 2)


# -- bounds and eviction ------------------------------------------------------------------------

def set_bound(conn, atom_set, max_atoms) -> int:
    return conn.execute("SELECT set_memory_bound(%s, %s)", (atom_set, max_atoms)).fetchone()[0]


def bound(conn, atom_set) -> int:
    return conn.execute("SELECT max_atoms FROM memory_status(%s)", (atom_set,)).fetchone()[0]


def test_the_oldest_generations_are_evicted_to_stay_within_the_sets_bound(owner, memory_set):
    assert bound(owner, memory_set) == 100_000                     # no row: the default
    assert set_bound(owner, memory_set, 10) == 0
    assert bound(owner, memory_set) == 10
    g1 = remember(owner, memory_set, generated=[1, 2, 3, 4])[0]
    g2 = remember(owner, memory_set, generated=[5, 6, 7, 8])[0]
    g3, remembered, evicted, atoms = remember(owner, memory_set, generated=[9, 10, 11, 12])
    assert (remembered, evicted, atoms) == (4, 4, 8)
    assert {r[0] for r in memory_rows(owner, memory_set)} == {g2, g3}
    # Room for three more evicts nothing; a fourth more would need the next-oldest whole generation.
    assert remember(owner, memory_set, generated=[13, 14])[1:] == (2, 0, 10)
    _, _, evicted, atoms = remember(owner, memory_set, generated=[15])
    assert (evicted, atoms) == (4, 7)
    assert g1 not in {r[0] for r in memory_rows(owner, memory_set)}


def test_a_caller_cannot_grow_the_memory_past_the_sets_bound(owner, memory_set):
    """max_atoms => 10^7 on every call (the old per-call bound) still leaves at most the set's 6 atoms."""
    set_bound(owner, memory_set, 6)
    held = [remember(owner, memory_set, generated=[i % VOCAB, (i + 1) % VOCAB], max_atoms=10_000_000)[3]
            for i in range(8)]
    assert max(held) == 6 and len(memory_rows(owner, memory_set)) == 6
    assert bound(owner, memory_set) == 6
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="generated has 7 tokens, more than max_atoms "
                                                                   r"\(6\) for atom set 'memory-test'"):
        remember(owner, memory_set, generated=list(range(7)), max_atoms=10_000_000)


def test_max_atoms_only_lowers_the_bound_for_its_call(owner, memory_set):
    set_bound(owner, memory_set, 8)
    remember(owner, memory_set, generated=[1, 2, 3])
    remember(owner, memory_set, generated=[4, 5, 6])
    assert remember(owner, memory_set, generated=[7], max_atoms=4)[2:] == (3, 4)     # evicted 3, holds 4
    assert remember(owner, memory_set, generated=[8, 9, 10, 11])[2:] == (0, 8)      # the set's 8 again
    assert bound(owner, memory_set) == 8


def test_lowering_the_bound_evicts_the_oldest_generations_at_once(owner, memory_set):
    first = remember(owner, memory_set, generated=[1, 2, 3])[0]
    remember(owner, memory_set, generated=[4, 5, 6])
    assert set_bound(owner, memory_set, 100) == 0
    assert set_bound(owner, memory_set, 4) == 3
    assert first not in {r[0] for r in memory_rows(owner, memory_set)}
    assert owner.execute("SELECT atoms FROM memory_status(%s)", (memory_set,)).fetchone()[0] == 3
    assert owner.execute("SELECT forget(%s)", (memory_set,)).fetchone()[0] == 3
    assert bound(owner, memory_set) == 4                           # forget() empties, the bound stays


def test_a_generation_longer_than_the_bound_is_refused_and_nothing_is_evicted(owner, memory_set):
    remember(owner, memory_set, generated=[1, 2, 3], max_atoms=5)
    before = memory_rows(owner, memory_set)
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="generated has 6 tokens, more than max_atoms"):
        remember(owner, memory_set, generated=[1, 2, 3, 4, 5, 6], max_atoms=5)
    assert memory_rows(owner, memory_set) == before


@pytest.mark.parametrize("atom_set, max_atoms, message", [
    ("memory-test", 0, "max_atoms must be between 1 and 10000000, got 0"),
    ("memory-test", None, "max_atoms must be between 1 and 10000000, got NULL"),
    ("memory-test", 10_000_001, "max_atoms must be between 1 and 10000000, got 10000001"),
    ("no-such-set", 5, "atom_set: no atom set named 'no-such-set'"),
])
def test_a_bad_bound_names_the_argument_and_changes_nothing(owner, memory_set, atom_set, max_atoms, message):
    set_bound(owner, memory_set, 7)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
        set_bound(owner, atom_set, max_atoms)
    assert message in error.value.diag.message_primary
    assert bound(owner, memory_set) == 7


def test_concurrent_writers_never_exceed_the_bound(server_url, owner, memory_set):
    seen, errors = [], []

    def write(worker: int) -> None:
        try:
            with psycopg.connect(server_url, autocommit=True) as conn:
                for i in range(12):
                    seen.append(remember(conn, memory_set, generated=[(worker + i) % VOCAB] * (1 + i % 4),
                                         max_atoms=9)[3])
        except Exception as exc:             # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(seen) == 48 and max(seen) <= 9
    assert len(memory_rows(owner, memory_set)) <= 9


# -- bad input: 22023 naming the argument, nothing written --------------------------------------

@pytest.mark.parametrize("arguments, message", [
    (dict(atom_set="no-such-set"), "atom_set: no atom set named 'no-such-set'"),
    (dict(context=[]), "context must be a non-empty array"),
    (dict(context=[1, None]), "context must not contain NULL"),
    (dict(context=[1, 999]), "context: token id 999 (element 2) is not in atom set"),
    (dict(generated=None), "generated must be a non-empty array"),
    (dict(generated=[3, 999]), "generated: token id 999 (element 2) is not in atom set"),
    (dict(path="spatial"), "path must be exact or speculative, got 'spatial'"),
    (dict(path="hybrid"), "path must be exact or speculative, got 'hybrid'"),
    (dict(path="augmented"), "path must be exact or speculative, got 'augmented'"),
    (dict(path=None), "path must be exact or speculative, got NULL"),
    (dict(max_atoms=0), "max_atoms must be between 1 and 10000000, got 0"),
    (dict(weight=0.0), "weight must be a positive finite number, got 0"),
    (dict(weight=float("inf")), "weight must be a positive finite number"),
])
def test_bad_input_names_the_argument_and_writes_nothing(owner, memory_set, arguments, message):
    remember(owner, memory_set)
    before = memory_rows(owner, memory_set)
    call = {"atom_set": memory_set, **arguments}
    with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
        remember(owner, **call)
    assert message in error.value.diag.message_primary
    assert memory_rows(owner, memory_set) == before


@pytest.mark.parametrize("function", ["next_token", "draft_tokens"])
def test_memory_must_be_true_or_false(owner, memory_set, function):
    n = ", 2" if function == "draft_tokens" else ""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="memory must be true or false, got NULL"):
        owner.execute(f"SELECT * FROM {function}(ARRAY[1, 2]{n}, atom_set => %s, memory => NULL)", (memory_set,))


# -- permissions --------------------------------------------------------------------------------

@pytest.mark.parametrize("statement", [
    "SELECT * FROM remember('memory-test', ARRAY[1], ARRAY[2], 'exact', temperature => 0, repetition_penalty => 1, "
    "adaptive => false, ignore_eos => false)",
    "SELECT set_memory_policy('memory-test', max_temperature => 1000)",
    "UPDATE memory_policies SET max_temperature = 1000",
    "INSERT INTO memory_policies SELECT id, 0, 1000, 0, 1, 0, true, true, true FROM atom_sets WHERE name = 'memory-test'",
    "SELECT forget('memory-test')",
    "INSERT INTO memory_atoms (atom_set_id, generation, step, position, token_id, weight, path) "
    "SELECT id, 1, 0, ST_MakePoint(0, 0, 0), 1, 1, 'exact' FROM atom_sets WHERE name = 'memory-test'",
    "DELETE FROM memory_atoms",
    "UPDATE memory_atoms SET weight = 2",
    "TRUNCATE memory_atoms",
    "SELECT set_memory_bound('memory-test', 10000000)",
    "SELECT set_memory_bound('memory-test', 1)",
    "UPDATE memory_bounds SET max_atoms = 10000000",
    "DELETE FROM memory_bounds",
    "INSERT INTO memory_bounds (atom_set_id, max_atoms) SELECT id, 10000000 FROM atom_sets WHERE name = 'memory-test' "
    "ON CONFLICT (atom_set_id) DO UPDATE SET max_atoms = 10000000",
    "TRUNCATE memory_bounds",
    "SELECT ht_memory_evict(id, 100) FROM atom_sets WHERE name = 'memory-test'",
])
def test_the_reader_role_cannot_write_the_memory_or_its_bound(reader_url, owner, memory_set, statement):
    set_bound(owner, memory_set, 5)
    remember(owner, memory_set)
    with psycopg.connect(reader_url, autocommit=True) as reader:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute(statement)
        assert reader.execute("SELECT max_atoms FROM memory_status(%s)", (memory_set,)).fetchone()[0] == 5
    assert len(memory_rows(owner, memory_set)) == len(GENERATED)


@pytest.mark.parametrize("function", ["remember(text, integer[], integer[], text, integer, double precision, "
                                      "double precision, integer, double precision, double precision, boolean, boolean)",
                                      "set_memory_policy(text, double precision, double precision, double precision, "
                                      "double precision, integer, boolean, boolean, boolean)",
                                      "forget(text)", "set_memory_bound(text, integer)",
                                      "ht_memory_evict(integer, bigint)"])
def test_the_reader_role_may_not_execute_the_memorys_writers(owner, function):
    assert owner.execute("SELECT has_function_privilege('hartonomous_reader', %s, 'EXECUTE')",
                         (function,)).fetchone() == (False,)


def test_the_reader_role_reads_the_memory_through_inference(reader_url, owner, memory_set):
    remember(owner, memory_set, weight=1e6)
    with psycopg.connect(reader_url, autocommit=True) as reader:
        top = reader.execute("SELECT token_id FROM next_token(%s, temperature => 0, atom_set => %s, memory => true)",
                             (CONTEXT, memory_set)).fetchone()[0]
        assert top == GENERATED[0]
        assert reader.execute("SELECT atoms FROM memory_status(%s)", (memory_set,)).fetchone()[0] == len(GENERATED)


# -- the KNN reads the memory only when asked ----------------------------------------------------

def knn(conn, set_id, point, k, memory):
    return conn.execute("SELECT token_id, weight, distance FROM ht_knn(%s, ST_MakePoint(%s, %s, %s), %s, NULL, %s)",
                        (set_id, *point, k, memory)).fetchall()


def test_the_knn_with_memory_is_the_nearest_of_atoms_and_memory_together(owner, memory_set):
    for i in range(6):
        remember(owner, memory_set, context=[i + 1, i + 2], generated=[(3 * i + j) % VOCAB for j in range(8)])
    set_id = owner.execute("SELECT id FROM atom_sets WHERE name = %s", (memory_set,)).fetchone()[0]
    everything = owner.execute(
        "SELECT token_id, weight, ST_X(position), ST_Y(position), ST_Z(position) FROM atoms WHERE atom_set_id = %s "
        "UNION ALL SELECT token_id, weight, ST_X(position), ST_Y(position), ST_Z(position) FROM memory_atoms "
        "WHERE atom_set_id = %s", (set_id, set_id)).fetchall()
    for point in [centroid(owner, [1, 2, 3], memory_set), (0.5, 0.5, 0.5), (0.1, 0.9, 0.3)]:
        expected = sorted((math.dist(point, row[2:]), row[0], row[1]) for row in everything)[:20]
        got = knn(owner, set_id, point, 20, True)
        assert [(t, w) for t, w, _ in got] == [(t, w) for _, t, w in expected]
        assert [d for _, _, d in got] == pytest.approx([d for d, _, _ in expected], rel=1e-12)
    near = knn(owner, set_id, centroid(owner, [1, 2, 3], memory_set), 20, True)
    assert any(w == 2.0 for _, w, _ in near)          # memory atoms (weight 2) are among them here...
    assert knn(owner, set_id, centroid(owner, [1, 2, 3], memory_set), 20, False) != near   # ...and only with memory


def test_without_memory_nothing_remembered_changes_next_token(owner, memory_set):
    query = "SELECT * FROM next_token(%s, atom_set => %s, top_p => 1, top_k => 0)"
    before = owner.execute(query, (CONTEXT, memory_set)).fetchall()
    remember(owner, memory_set, weight=1e6)
    assert owner.execute(query, (CONTEXT, memory_set)).fetchall() == before
    with_memory = owner.execute(query.replace(")", ", memory => true)"), (CONTEXT, memory_set)).fetchall()
    assert with_memory[0][0] == GENERATED[0] and with_memory != before


@pytest.mark.parametrize("function", ["next_token", "draft_tokens"])
def test_the_native_kernel_and_the_reference_agree_with_memory(owner, memory_set, function):
    for i in range(5):
        remember(owner, memory_set, context=[i + 1], generated=[(7 * i + j) % VOCAB for j in range(10)])
    if function == "next_token":
        sql = "SELECT token_id, probability FROM next_token(%s, atom_set => %s, top_p => 1, memory => true)"
    else:
        sql = ("SELECT token_id, probabilities FROM draft_tokens(%s, 6, atom_set => %s, temperature => 0.8, "
               "seed => 5, memory => true)")
    for context in ([1, 7, 8], [2, 14, 15, 16], [5, 5, 5]):
        native = owner.execute(sql, (context, memory_set)).fetchall()
        owner.execute("SET hartonomous.kernel = 'plpgsql'")
        reference = owner.execute(sql, (context, memory_set)).fetchall()
        owner.execute("RESET hartonomous.kernel")
        assert [r[0] for r in native] == [r[0] for r in reference]
        assert np.allclose(np.array([r[1] for r in native], dtype=object).astype(float) if function == "next_token"
                           else np.concatenate([r[1] for r in native]),
                           np.array([r[1] for r in reference], dtype=object).astype(float) if function == "next_token"
                           else np.concatenate([r[1] for r in reference]), rtol=1e-9, atol=1e-12)


def test_a_remembered_continuation_is_drafted_again(owner, memory_set):
    remember(owner, memory_set, weight=1e6)
    drafted = owner.execute("SELECT token_id FROM draft_tokens(%s, %s, temperature => 0, atom_set => %s, "
                            "memory => true)", (CONTEXT, len(GENERATED), memory_set)).fetchall()
    assert [t for (t,) in drafted] == GENERATED
    plain = owner.execute("SELECT token_id FROM draft_tokens(%s, %s, temperature => 0, atom_set => %s)",
                          (CONTEXT, len(GENERATED), memory_set)).fetchall()
    assert [t for (t,) in plain] != GENERATED


def test_dropping_the_set_drops_its_memory(server_url):
    from hartonomous.atomset import drop_atom_set as drop

    rng = np.random.default_rng(3)
    with psycopg.connect(server_url, autocommit=True) as conn:
        write_atom_set(conn, AtomSetSpec(name="memory-dropped", model="synthetic", vocab_size=10, embedding_dim=0,
                                         projection="synthetic", kind="context"),
                       TokenRows(np.arange(10), [f"t{i}" for i in range(10)], rng.random((10, 3))),
                       AtomRows(rng.integers(0, 10, 50), rng.random((50, 3))), replace=True)
        set_id = conn.execute("SELECT id FROM atom_sets WHERE name = 'memory-dropped'").fetchone()[0]
        remember(conn, "memory-dropped", context=[1], generated=[2, 3])
        assert conn.execute("SELECT to_regclass(%s)", (f"memory_atoms_{set_id}",)).fetchone()[0] is not None
        drop(conn, "memory-dropped")
        assert conn.execute("SELECT to_regclass(%s)", (f"memory_atoms_{set_id}",)).fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM memory_atoms WHERE atom_set_id = %s", (set_id,)).fetchone()[0] == 0


# -- the Python writer and the clients ----------------------------------------------------------

class Result:
    def __init__(self, path="exact", finish_reason="length", token_ids=(4, 5), config=GenerationConfig(temperature=0)):
        self.path, self.finish_reason, self.token_ids, self.prompt_ids = path, finish_reason, list(token_ids), [1]
        self.config, self.stats = config, None


@pytest.mark.parametrize("result, kept", [
    (Result(), True), (Result(path="speculative", finish_reason="eos"), True),
    (Result(path="hybrid"), False), (Result(path="spatial"), False), (Result(path="augmented"), False),
    (Result(finish_reason="cancelled"), False), (Result(finish_reason="error"), False), (Result(token_ids=()), False),
    (Result(config=None), False),
])
def test_only_completed_generations_of_the_exact_models_words_are_remembered(result, kept):
    """A whitelist: a path that mixes the store's guesses in (hybrid's spatial steps; any path not
    listed, such as a later augmented one) is never remembered."""
    assert worth_remembering(result) is kept
    assert REMEMBERED_PATHS == ("exact", "speculative")


@pytest.mark.parametrize("options, message", [
    (dict(max_atoms=0), "max_atoms must be between 1 and 10,000,000"),
    (dict(max_atoms=10_000_001), "max_atoms must be between 1 and 10,000,000"),
    (dict(weight=-1.0), "weight must be a positive finite number"),
])
def test_the_writer_checks_its_settings(options, message):
    with pytest.raises(UserError, match=message):
        MemoryWriter("postgresql://unused", **options)


def test_a_writer_with_a_bound_keeps_the_set_at_it_and_one_without_leaves_it(server_url, owner, memory_set):
    """MemoryWriter(max_atoms=N) (`serve --memory-max-atoms N`) sets the set's bound before it
    writes; a writer without one (Client(remember=True)) never touches it."""
    set_bound(owner, memory_set, 50)
    plain = MemoryWriter(server_url)
    bounded = MemoryWriter(server_url, max_atoms=4)
    try:
        plain.remember(memory_set, CONTEXT, [1, 2, 3], "exact", GREEDY)
        assert bound(owner, memory_set) == 50
        assert bounded.remember(memory_set, CONTEXT, [4, 5], "exact", GREEDY).atoms == 2     # the older 3 evicted
        assert bound(owner, memory_set) == 4
        set_bound(owner, memory_set, 6)                                              # an owner lowers it...
        plain.remember(memory_set, CONTEXT, [6, 7], "exact", GREEDY)
        assert bound(owner, memory_set) == 6
        bounded.remember(memory_set, CONTEXT, [8], "exact", GREEDY)                          # ...the server's comes back
        assert bound(owner, memory_set) == 4 and plain.status(memory_set).atoms <= 4
        assert bounded.set_bound(memory_set, 1) == 2 and bound(owner, memory_set) == 1
    finally:
        plain.close()
        bounded.close()


def test_a_failed_remember_is_logged_and_counted_not_raised(server_url, caplog):
    writer = MemoryWriter(server_url)
    try:
        outcome = writer.remember_result("no-such-set", Result())
        assert isinstance(outcome, NotRemembered) and outcome.failed
        assert outcome.as_dict()["remembered"] is False and "could not be written" in outcome.reason
        assert writer.failed == 1 and writer.written == 0 and writer.refused == 0
        assert "could not remember" in caplog.text
    finally:
        writer.close()


@pytest.fixture(scope="module")
def random_tiny_set(server_url):
    """Random atoms over the tiny vocabulary: a drafter that is never right without memory."""
    name = write_tiny_atom_set(server_url, model="tiny", window=3, decay=0.5)
    yield name
    drop_atom_set(server_url, name)


@pytest.fixture
def tiny_client(server_url, random_tiny_set):
    torch.set_num_threads(1)
    model, tokenizer = tiny_model(0)
    writer = MemoryWriter(server_url, weight=1e6, policy=PAST_EOS)
    writer.forget(random_tiny_set)
    exact = ExactModel(model, tokenizer)
    exact._hartonomous_forward_costs = SMOLLM2_ON_TWO_CORES      # as measured there: not this run's timings
    client = Client(database_url=server_url, atom_set=random_tiny_set, exact_model=exact,
                    memory=True, remember=writer, draft_tokens=4, max_draft_tokens=16)
    yield client, writer
    client.close()
    writer.forget(random_tiny_set)
    writer.close()


def test_a_repeated_request_drafts_what_the_model_said_and_the_output_stays_exact(tiny_client, random_tiny_set):
    client, writer = tiny_client
    options = dict(max_new_tokens=40, temperature=0.0, stop_at_eos=False)
    exact = client.generate("The capital of France is", path="exact", **options)
    assert writer.status(random_tiny_set).atoms == 40                      # the exact path was remembered
    again = client.generate("The capital of France is", path="speculative", **options)
    assert again.token_ids == exact.token_ids
    assert again.stats.acceptance_rate > 0.9 and again.stats.tokens_per_forward > 3
    other = client.generate("def add(a, b):", path="speculative", **options)      # nothing remembered for it
    assert other.token_ids == client.generate("def add(a, b):", path="exact", **options).token_ids
    assert writer.status(random_tiny_set).generations == 4


def test_a_client_without_memory_neither_reads_nor_writes_it(server_url, random_tiny_set):
    model, tokenizer = tiny_model(0)
    writer = MemoryWriter(server_url, weight=1e6)
    writer.forget(random_tiny_set)
    options = dict(max_new_tokens=40, temperature=0.0, stop_at_eos=False)
    try:
        exact_model = ExactModel(model, tokenizer)
        exact_model._hartonomous_forward_costs = SMOLLM2_ON_TWO_CORES
        with Client(database_url=server_url, atom_set=random_tiny_set, exact_model=exact_model) as client:
            exact = client.generate([5, 6], path="exact", **options)
            assert writer.status(random_tiny_set).atoms == 0                   # not written
            writer.remember(random_tiny_set, exact.prompt_ids, exact.token_ids, "exact", GREEDY)
            result = client.generate([5, 6], path="speculative", **options)
        assert result.token_ids == exact.token_ids
        assert result.stats.tokens_per_forward < 2                             # not read
        assert writer.status(random_tiny_set).generations == 1
    finally:
        writer.forget(random_tiny_set)
        writer.close()


@pytest.mark.parametrize("risk_threshold", [math.inf, 0.0])
def test_hybrid_generations_are_not_remembered(server_url, random_tiny_set, risk_threshold):
    """Hybrid's spatial steps are the store's own guesses (inf: every step); even where every step
    was the model's (0), the path is not on the whitelist. The exact path's are remembered."""
    model, tokenizer = tiny_model(0)
    writer = MemoryWriter(server_url, policy=PAST_EOS)
    writer.forget(random_tiny_set)
    options = dict(max_new_tokens=8, temperature=0.0, stop_at_eos=False)
    try:
        with Client(database_url=server_url, atom_set=random_tiny_set, exact_model=ExactModel(model, tokenizer),
                    remember=writer, risk_threshold=risk_threshold) as client:
            hybrid = client.generate([5, 6, 7], path="hybrid", **options)
            assert hybrid.finish_reason == "length" and len(hybrid.token_ids) == 8
            assert writer.status(random_tiny_set).atoms == 0 and writer.failed == 0
            client.generate([5, 6, 7], path="exact", **options)
            assert writer.status(random_tiny_set).atoms == 8
    finally:
        writer.forget(random_tiny_set)
        writer.close()


@pytest.mark.parametrize("path", ["hybrid", "spatial"])
def test_generate_refuses_to_remember_a_path_that_mixes_the_store_in(capsys, path):
    from generation_helpers import run_cli

    code, out, err = run_cli(capsys, "generate", "def f(x):", "--path", path, "--remember")
    assert code != 0 and not out
    assert "--remember keeps only the exact model's words: use it with --path exact or speculative" in err
    assert len(err.strip().splitlines()) == 1


def test_the_spatial_path_reads_the_memory_only_when_asked(server_url, random_tiny_set):
    """Client(spatial_memory=True): the spatial path's next_token reads the memory too (so a
    remembered continuation comes back greedily); without it (memory=True is the drafter's) the
    memory changes nothing."""
    model, tokenizer = tiny_model(0)
    writer = MemoryWriter(server_url, weight=1e6)
    writer.forget(random_tiny_set)
    options = dict(max_new_tokens=12, temperature=0.0, stop_at_eos=False)
    try:
        with Client(database_url=server_url, atom_set=random_tiny_set, spatial_tokenizer=tokenizer,
                    memory=True) as plain:
            before = plain.generate([5, 6, 7], path="spatial", **options).token_ids
            remembered = [(3 * j + 1) % VOCAB for j in range(12)]
            assert remembered != before
            writer.remember(random_tiny_set, [5, 6, 7], remembered, "exact", GREEDY)
            assert plain.generate([5, 6, 7], path="spatial", **options).token_ids == before
        with Client(database_url=server_url, atom_set=random_tiny_set, spatial_tokenizer=tokenizer,
                    spatial_memory=True) as reading:
            assert reading.generate([5, 6, 7], path="spatial", **options).token_ids == remembered
            with pytest.raises(UserError, match="in-database loop .* does not read the memory"):
                reading.engine("spatial", in_database=True)
    finally:
        writer.forget(random_tiny_set)
        writer.close()


def test_kept_drafts_say_where_they_came_from_when_asked(tiny_client, random_tiny_set):
    """With sources=True each kept draft's event names the source of the atom that voted for it
    most: a repeated request's drafts come from the memory (weight 10^6); other tokens carry none."""
    client, _writer = tiny_client
    options = dict(max_new_tokens=40, temperature=0.0, stop_at_eos=False)
    exact = client.generate("The capital of France is", path="exact", **options)
    events = list(client.stream("The capital of France is", path="speculative", sources=True, **options).events())
    assert [e.token_id for e in events] == exact.token_ids
    kept = [e.source for e in events if e.origin == "draft"]
    assert len(kept) > 30 and set(kept) == {"memory"}
    assert all(e.source is None for e in events if e.origin == "exact")
    quiet = list(client.stream("The capital of France is", path="speculative", **options).events())
    assert any(e.origin == "draft" for e in quiet) and all(e.source is None for e in quiet)
