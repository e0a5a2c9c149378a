"""The native kernel (ext/hartonomous_kernel) against its PL/pgSQL reference, and how it is chosen.

tests/test_sql_next_token.py runs its whole specification on both kernels; here the two answer the
same random calls side by side (next_token, draft_tokens, generate_tokens, where the native loops
carry the context's positions from step to step), and the migration, the session setting and
`db status` decide and say which one runs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hartonomous.db import migrate
from hand_sets import add_set, reference_sets
from native_kernel import (assert_same_rows, assert_same_rows_but, both, first_difference, module_connection, nonzero,
                           require_native_kernel, rounding_decides, undecided_rows, use)

TOL = 1e-12


@pytest.fixture(scope="module")
def db(server_url: str) -> Iterator[psycopg.Connection]:
    with module_connection(server_url, "native") as conn:
        yield conn


@pytest.fixture(scope="module")
def sets(db: psycopg.Connection) -> dict:
    found = reference_sets()
    for s in found.values():
        add_set(db, s)
    return found


def relaxed_reference(db: psycopg.Connection, context: list[int], args: dict, atom_set: str) -> list:
    """The reference's rows after `context` at the step's temperature (1 for a greedy step) and
    penalty, without top-k and top-p: every candidate, by probability."""
    use(db, "plpgsql")
    rows = db.execute(NEXT_TOKEN, {**args, "context": context, "atom_set": atom_set, "top_k": 0, "top_p": 1.0,
                                   "temperature": args["temperature"] or 1.0}).fetchall()
    use(db, "")
    return rows


def assert_tied_picks(db: psycopg.Connection, context: list[int], args: dict, atom_set: str, a: int, b: int) -> None:
    """Two implementations picked a and b after `context`: fine only where rounding may decide,
    i.e. the two have the same probability in the reference, or a tie sits at the step's top-k
    boundary or top-p cut (rounding_decides)."""
    relaxed = relaxed_reference(db, context, args, atom_set)
    p = {r[0]: r[1] for r in relaxed}
    tied = a in p and b in p and p[a] == pytest.approx(p[b], abs=TOL)
    assert tied or (args["temperature"] > 0 and rounding_decides(relaxed, args["top_k"], args["top_p"])), (a, b, p)


def assert_same_step(db: psycopg.Connection, context: list[int], args: dict, atom_set: str, got: list,
                     want: list) -> None:
    """A step's rows of non-zero probability agree (assert_same_rows), but for the rows whose place
    rounding may decide (a tie at the top-k boundary or the top-p cut: undecided_rows), which
    either may hold or lack; the others agree once renormalised (assert_same_rows_but)."""
    try:
        assert_same_rows(nonzero(got), nonzero(want), TOL)
    except AssertionError:
        undecided = undecided_rows(relaxed_reference(db, context, args, atom_set), args["top_k"], args["top_p"])
        if not undecided:
            raise
        assert_same_rows_but(nonzero(got), nonzero(want), undecided, TOL)


calls = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 0.7, 1.0, 2.5]), "top_k": st.sampled_from([None, 0, 1, 5, 40]),
    "top_p": st.sampled_from([None, 0.5, 0.9, 1.0]), "search_radius": st.none() | st.floats(0.05, 0.6),
    "max_neighbors": st.integers(1, 300), "repetition_penalty": st.sampled_from([1.0, 1.3, 0.8]),
    "history_weight": st.none() | st.sampled_from([0.0, 0.5, 3.0]),
    "history_window": st.none() | st.integers(0, 80)})
NEXT_TOKEN = ("SELECT * FROM next_token(%(context)s, %(temperature)s, %(top_k)s, %(top_p)s, %(search_radius)s, "
              "%(max_neighbors)s, %(atom_set)s, %(repetition_penalty)s, %(history_weight)s, %(history_window)s)")


@settings(max_examples=150, deadline=None)
@given(which=st.sampled_from(["gauss", "expo", "steep", "slow", "long"]),
       context=st.lists(st.integers(0, 49), min_size=1, max_size=120), args=calls)
def test_next_token_rows_are_the_references_to_1e12(db, sets, which, context, args) -> None:
    native, reference = both(db, NEXT_TOKEN, {**args, "context": context, "atom_set": sets[which].name})
    if args["temperature"] == 0 and native != reference:
        assert_tied_picks(db, context, args, sets[which].name, native[0][0], reference[0][0])
    else:
        assert_same_step(db, context, args, sets[which].name, native, reference)


@settings(max_examples=40, deadline=None)
@given(which=st.sampled_from(["gauss", "expo", "long"]), context=st.lists(st.integers(0, 49), min_size=1, max_size=60),
       n=st.integers(1, 12), seed=st.integers(0, 2**31), args=calls)
def test_draft_tokens_carries_its_state_to_the_same_drafts(db, sets, which, context, n, seed, args) -> None:
    sql = ("SELECT step, token_id, token_ids, probabilities FROM draft_tokens(%(context)s, %(n)s, %(temperature)s, "
           "%(top_k)s, %(top_p)s, %(search_radius)s, %(max_neighbors)s, %(atom_set)s, %(repetition_penalty)s, "
           "%(seed)s, 0, NULL, %(history_weight)s, %(history_window)s)")
    native, reference = both(db, sql, {**args, "context": context, "atom_set": sets[which].name, "n": n,
                                       "seed": seed})
    split = first_difference([r[1] for r in native], [r[1] for r in reference])
    if split is not None:           # only a tie to rounding may part them (then they go their own ways)
        assert split < min(len(native), len(reference)), (native, reference)
        drafted = [r[1] for r in reference[:split]]
        assert_tied_picks(db, context + drafted, args, sets[which].name, native[split][1], reference[split][1])
    for i, (got, want) in enumerate(list(zip(native, reference))[:split]):
        assert got[0] == want[0]
        assert_same_step(db, context + [r[1] for r in reference[:i]], args, sets[which].name,
                         list(zip(got[2], got[3])), list(zip(want[2], want[3])))


@settings(max_examples=30, deadline=None)
@given(which=st.sampled_from(["gauss", "expo", "slow", "long"]),
       context=st.lists(st.integers(0, 49), min_size=1, max_size=60), seed=st.integers(0, 2**31), args=calls)
def test_generate_tokens_gives_the_references_ids(db, sets, which, context, seed, args) -> None:
    sql = ("SELECT generate_tokens(%(context)s, 24, %(temperature)s, %(top_k)s, %(top_p)s, %(search_radius)s, "
           "%(max_neighbors)s, %(atom_set)s, %(repetition_penalty)s, %(seed)s, NULL, %(history_weight)s, "
           "%(history_window)s)")
    native, reference = both(db, sql, {**args, "context": context, "atom_set": sets[which].name, "seed": seed})
    split = first_difference(native, reference)
    if split is not None:           # only a tie to rounding may part them (then they go their own ways)
        assert split < min(len(native), len(reference)), (native, reference)
        assert_tied_picks(db, context + reference[:split], args, sets[which].name, native[split], reference[split])


def test_next_token_batch_is_the_reference(db, sets) -> None:
    contexts = [[1, 2, 3], [4] * 30, list(range(50))]
    sql = "SELECT * FROM next_token_batch(%s::jsonb, 0.9, 10, 0.95, NULL, 50, %s, 1.2, 2.0, 40)"
    native, reference = both(db, sql, (json.dumps(contexts), sets["expo"].name))
    for i in range(len(contexts)):
        assert_same_rows(nonzero([r[1:] for r in native if r[0] == i]),
                         nonzero([r[1:] for r in reference if r[0] == i]), TOL)


@pytest.mark.parametrize("call", [
    "SELECT * FROM next_token(ARRAY[1, 999], atom_set => %s)",
    "SELECT generate_tokens(ARRAY[1, 999], 3, atom_set => %s)",
    "SELECT * FROM draft_tokens(ARRAY[999, 1], 2, atom_set => %s)",
])
def test_a_token_the_set_lacks_is_named_on_the_native_path(db, sets, call: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"context: token id 999 \(element \d\) is not in"):
        with db.transaction():
            db.execute(call, (sets["gauss"].name,))


def test_the_session_setting_forces_the_reference(server_url: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        if conn.execute("SELECT ht_kernel()").fetchone()[0] != "native":
            require_native_kernel()
        conn.execute("SET hartonomous.kernel = 'plpgsql'")
        assert conn.execute("SELECT ht_kernel()").fetchone()[0] == "plpgsql"
        conn.execute("RESET hartonomous.kernel")
        assert conn.execute("SELECT ht_kernel()").fetchone()[0] == "native"


def test_the_migration_creates_the_extension_and_its_downgrade_drops_it(scratch_database: str) -> None:
    def kernel() -> tuple[str, bool]:
        with psycopg.connect(scratch_database) as conn:
            installed = conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'hartonomous_kernel'")
            return conn.execute("SELECT ht_kernel()").fetchone()[0], bool(installed.fetchone()[0])

    migrate.upgrade(scratch_database, "0008")
    assert kernel() == ("plpgsql", False)          # the PL/pgSQL path runs without the extension
    migrate.upgrade(scratch_database)
    if kernel()[1] is False:
        require_native_kernel()
    assert kernel() == ("native", True)
    assert migrate.active_kernel(scratch_database) == {"kernel": "native", "kernel_available": True,
                                                       "kernel_installed": True}
    migrate.downgrade(scratch_database, "0008")
    assert kernel() == ("plpgsql", False)


STORE_STEP = "htk_store_step(integer[], text, integer, double precision, integer, integer)"
KERNEL_VERSION = "SELECT extversion FROM pg_extension WHERE extname = 'hartonomous_kernel'"


def test_a_1_4_database_without_htk_store_step_is_brought_to_a_working_augmented_call(scratch_database: str) -> None:
    """Version 1.4 was amended in place: a database that reached it before htk_store_step existed
    holds 1.4 without that function, and store_distribution (the augmented path) raised 42883 on
    every call while `migrate` saw nothing to update. Reproduced by dropping the function from an
    installed kernel labelled 1.4; `migrate` brings it to the newest version, whose call runs in C
    and answers as the reference."""
    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        if conn.execute(KERNEL_VERSION).fetchone() is None:
            require_native_kernel()
        newest = conn.execute(KERNEL_VERSION).fetchone()[0]
        # a whole 1.4 updates in place (ALTER EXTENSION ... UPDATE: the view on it stays)
        conn.execute("UPDATE pg_extension SET extversion = '1.4' WHERE extname = 'hartonomous_kernel'")
        conn.execute("CREATE VIEW kerneltest_pick AS SELECT htk_pick(ARRAY[1.0], ARRAY[1.0], 0.5) AS i")
        migrate.ensure_native_kernel(scratch_database)
        assert conn.execute(KERNEL_VERSION).fetchone()[0] == newest
        conn.execute("DROP VIEW kerneltest_pick")
        # one without htk_store_step: ALTER EXTENSION ... UPDATE refuses it, saying what to do
        conn.execute(f"ALTER EXTENSION hartonomous_kernel DROP FUNCTION {STORE_STEP}")
        conn.execute(f"DROP FUNCTION {STORE_STEP}")
        conn.execute("UPDATE pg_extension SET extversion = '1.4' WHERE extname = 'hartonomous_kernel'")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="without htk_store_step"):
            conn.execute("ALTER EXTENSION hartonomous_kernel UPDATE")
    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database) as conn:
        s = reference_sets()["expo"]
        add_set(conn, s)
        call = "SELECT * FROM store_distribution(ARRAY[1, 2, 3, 4], %s, 50, NULL, NULL, false, 2)"
        native = conn.execute(call, (s.name,)).fetchall()
        assert conn.execute(f"SELECT count(*) FROM {STORE_STEP.split('(')[0]}(ARRAY[1, 2, 3, 4], %s, 50, NULL, "
                            "NULL, 2)", (s.name,)).fetchone()[0] == 2      # served in C
        conn.execute("SET LOCAL hartonomous.kernel = 'plpgsql'")
        reference = conn.execute(call, (s.name,)).fetchall()
        assert [r[:2] for r in native] == [r[:2] for r in reference]
        for got, want in zip(native, reference):
            assert got[2] == pytest.approx(want[2], abs=TOL)
        conn.rollback()
        assert conn.execute(KERNEL_VERSION).fetchone()[0] == newest != "1.4"
        assert conn.execute("SELECT to_regprocedure(%s) IS NOT NULL", (STORE_STEP,)).fetchone()[0]


def test_migrate_brings_a_database_from_before_the_cut_to_the_one_version(scratch_database: str) -> None:
    """The kernel has one version (the cut, 0019), so a database whose extension is older (1.0-1.3,
    whose scripts are gone: reproduced as an install labelled 1.2 without the functions 1.3 and 1.4
    added) runs the PL/pgSQL path (sql/ is written for the one version) until `migrate` installs
    that version afresh, whose step then runs in C; a downgrade below the cut drops the extension
    and the PL/pgSQL path serves there."""
    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        if conn.execute(KERNEL_VERSION).fetchone() is None:
            require_native_kernel()
        newest = conn.execute(KERNEL_VERSION).fetchone()[0]
        for signature in (STORE_STEP, "htk_store(integer[], double precision[], integer[], double precision[], "
                          "double precision[], boolean[], text, double precision, double precision, double precision)"):
            conn.execute(f"ALTER EXTENSION hartonomous_kernel DROP FUNCTION {signature}")
            conn.execute(f"DROP FUNCTION {signature}")
        conn.execute("UPDATE pg_extension SET extversion = '1.2' WHERE extname = 'hartonomous_kernel'")
        assert conn.execute("SELECT ht_kernel()").fetchone()[0] == "plpgsql"
        assert conn.execute("SELECT count(*) FROM pg_extension_update_paths('hartonomous_kernel') "
                            "WHERE source = '1.2' AND path IS NOT NULL").fetchone()[0] == 0
    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database) as conn:
        assert conn.execute(KERNEL_VERSION).fetchone()[0] == newest
        assert conn.execute("SELECT ht_kernel()").fetchone()[0] == "native"
        s = reference_sets()["expo"]
        add_set(conn, s)
        assert conn.execute("SELECT steps, kept_sets, kept_contexts FROM htk_stats()").fetchone() == (0, 0, 0)
        conn.execute("SELECT * FROM next_token(ARRAY[1, 2, 3], atom_set => %s)", (s.name,)).fetchall()
        assert conn.execute("SELECT steps, kept_sets, kept_contexts FROM htk_stats()").fetchone() == (1, 1, 1)
        assert conn.execute("SELECT count(*) FROM store_distribution(ARRAY[1, 2, 3], %s)", (s.name,)).fetchone() == (1,)
        conn.rollback()
    migrate.downgrade(scratch_database, "0018")
    with psycopg.connect(scratch_database) as conn:
        assert conn.execute(KERNEL_VERSION).fetchone() is None
        assert conn.execute("SELECT ht_kernel()").fetchone()[0] == "plpgsql"
        s = reference_sets()["expo"]
        add_set(conn, s)
        assert conn.execute("SELECT * FROM next_token(ARRAY[1, 2, 3], atom_set => %s)", (s.name,)).fetchall()
        assert conn.execute("SELECT count(*) FROM store_distribution(ARRAY[1, 2, 3], %s)", (s.name,)).fetchone() == (1,)
        conn.rollback()
    migrate.downgrade(scratch_database, "0012")         # 0013-0016 took the kernel to 1.1-1.3 before the cut
    with psycopg.connect(scratch_database) as conn:
        assert conn.execute(KERNEL_VERSION).fetchone() is None
    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database) as conn:
        assert conn.execute(KERNEL_VERSION).fetchone()[0] == newest
        assert conn.execute("SELECT ht_kernel()").fetchone()[0] == "native"


@pytest.mark.parametrize("symbol", ["htk_distribution", "htk_logits", "htk_next_token", "htk_step_logits"])
def test_the_symbols_of_the_versions_before_the_cut_are_gone(db, symbol: str) -> None:
    """1.0-1.2 declared these with a `gaussian boolean` argument; the library no longer has those
    symbols, so a database still declaring them gets an error, never a call with the wrong arguments."""
    (library,) = db.execute("SELECT probin FROM pg_proc WHERE proname = 'htk_pick'").fetchone()
    with pytest.raises(psycopg.errors.UndefinedFunction, match=f'could not find function "{symbol}"'):
        with db.transaction():
            db.execute(f"CREATE FUNCTION kerneltest_{symbol}() RETURNS void AS '{library}', '{symbol}' LANGUAGE C")


def test_migrate_refuses_to_reinstall_a_kernel_others_depend_on_and_says_what_to_do(scratch_database: str) -> None:
    """An extension that must be installed afresh (no update leads to the newest) but has a view on
    one of its functions is left alone: `migrate` names the view and what to do."""
    from hartonomous.errors import UserError

    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        if conn.execute(KERNEL_VERSION).fetchone() is None:
            require_native_kernel()
        conn.execute("CREATE VIEW kerneltest_pick AS SELECT htk_pick(ARRAY[1.0], ARRAY[1.0], 0.5) AS i")
        conn.execute("UPDATE pg_extension SET extversion = '0.9' WHERE extname = 'hartonomous_kernel'")
    with pytest.raises(UserError, match=r"hartonomous_kernel 0\.9 cannot be brought to .* view kerneltest_pick "
                                        r"depend on its functions: drop them, then run `hartonomous migrate` again"):
        migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert conn.execute(KERNEL_VERSION).fetchone() == ("0.9",)
        conn.execute("DROP VIEW kerneltest_pick")
    migrate.upgrade(scratch_database)
    with psycopg.connect(scratch_database) as conn:
        assert conn.execute(KERNEL_VERSION).fetchone()[0] != "0.9"
        assert conn.execute("SELECT ht_kernel()").fetchone()[0] == "native"


# --- one call per step: the raw logits and the signals together ---------------------------------

SIGNALS = ("SELECT h, h2, varentropy, r, top_probability, nearest_bandwidths, history_share, distinct_tokens, "
           "ln_top_nearest_bandwidths, ln_top_stored_votes, ln_top_history_nearest_bandwidths, risk, predicted_gap "
           "FROM {}(%(context)s, %(search_radius)s, %(max_neighbors)s, %(atom_set)s, %(history_weight)s, "
           "%(history_window)s)")


@settings(max_examples=120, deadline=None)
@given(which=st.sampled_from(["gauss", "expo", "steep", "slow", "long"]),
       context=st.lists(st.integers(0, 49), min_size=1, max_size=80), args=calls)
def test_step_logits_carry_next_token_signals_and_next_tokens_rows(db, sets, which, context, args) -> None:
    from hartonomous.backends.spatial import sample_logits
    from hartonomous.generation_config import SamplerArgs

    use(db, "")
    params = {**args, "context": context, "atom_set": sets[which].name}
    (got,) = db.execute(SIGNALS.format("ht_step_logits"), params).fetchall()
    (want,) = db.execute(SIGNALS.format("next_token_signals"), params).fetchall()
    assert [v is None for v in got] == [v is None for v in want]
    assert [v for v in got if v is not None] == pytest.approx([v for v in want if v is not None], abs=TOL)
    ids, logits = db.execute("SELECT token_ids, logits FROM ht_step_logits(%(context)s, %(search_radius)s, "
                             "%(max_neighbors)s, %(atom_set)s, %(history_weight)s, %(history_window)s)",
                             params).fetchone()
    assert ids == sorted(ids)
    sampler = SamplerArgs(args["temperature"], args["top_k"], 1.0 if args["top_p"] is None else args["top_p"],
                          args["repetition_penalty"])
    dist = sample_logits(ids, logits, context, sampler)
    rows = db.execute(NEXT_TOKEN, params).fetchall()
    from_logits = list(zip(dist.token_ids, dist.probabilities, dist.probabilities))
    if args["temperature"] == 0 and from_logits[:1] != rows[:1]:
        assert_tied_picks(db, context, args, sets[which].name, from_logits[0][0], rows[0][0])
    else:
        assert_same_rows(nonzero([r[:2] for r in from_logits]), nonzero([r[:2] for r in rows]), TOL)


def test_step_logits_refuse_the_plpgsql_path(db, sets) -> None:
    use(db, "plpgsql")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="needs the native kernel"):
        with db.transaction():
            db.execute("SELECT * FROM ht_step_logits(ARRAY[1, 2], atom_set => %s)", (sets["expo"].name,))
    use(db, "")


def test_the_spatial_backend_makes_one_call_per_step_when_it_needs_signals_too(db, sets, monkeypatch) -> None:
    from hartonomous import sqlcalls
    from hartonomous.backends.spatial import SpatialBackend
    from hartonomous.generation_config import SamplerArgs

    use(db, "")
    backend = SpatialBackend(db, sets["expo"].name, tokenizer=object())
    assert backend.native
    calls = []
    real_run = sqlcalls.run
    monkeypatch.setattr(sqlcalls, "run", lambda conn, query, **kw: calls.append(query.sql) or real_run(conn, query, **kw))
    sampler = SamplerArgs(0.8, 5, 0.9, 1.2)
    state = backend.start([3, 1, 4, 1, 5, 9, 2, 6])
    for token in (5, 3, 5):
        signals = backend.signals(state)
        dist = backend.distribution(state, sampler)
        assert len(calls) == 1 and "ht_step_logits" in calls[0]
        calls.clear()
        # the same as the two calls of the PL/pgSQL path
        use(db, "plpgsql")
        want_signals = sqlcalls.next_token_signals(db, state.ids, backend.spatial, backend.atom_set.name)
        want = sqlcalls.next_token(db, state.ids, sampler, backend.spatial, backend.atom_set.name)
        use(db, "")
        calls.clear()
        assert dist.token_ids == [r[0] for r in want]
        assert dist.probabilities == pytest.approx([r[1] for r in want], abs=TOL)
        assert signals.h == pytest.approx(want_signals.h, abs=TOL)
        assert signals.distinct_tokens == want_signals.distinct_tokens
        backend.advance(state, token)
    # without signals, distribution is next_token itself
    backend.distribution(state, sampler)
    assert len(calls) == 1 and "next_token(" in calls[0]


# --- every entry point checks its arguments, answers a cancel, and bounds what it keeps -----------

# Valid arguments of each entry point, in order, with their SQL types.
ENTRY_POINTS = {
    "htk_keys": [("positions", "float8[]", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]), ("centroid_window", "integer", 3),
                 ("centroid_decay", "float8", 0.5), ("history_window", "integer", 8)],
    "htk_distribution": [("context", "integer[]", [1, 2]), ("keys", "float8[]", [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]),
                         ("knn_token_ids", "integer[]", [3, 4]), ("knn_weights", "float8[]", [1.0, 2.0]),
                         ("knn_distances", "float8[]", [0.1, 0.2]), ("kernel", "text", "gaussian"),
                         ("bandwidth", "float8", 0.1), ("centroid_decay", "float8", 0.5),
                         ("history_weight", "float8", 1.0),
                         ("temperature", "float8", 1.0), ("top_k", "integer", 40), ("top_p", "float8", 0.9),
                         ("search_radius", "float8", None), ("repetition_penalty", "float8", 1.2)],
    "htk_next_token": [("atom_set_id", "integer", -1), ("centroid_window", "integer", 3),
                       ("centroid_decay", "float8", 0.5), ("history_window", "integer", 8),
                       ("kernel", "text", "gaussian"), ("bandwidth", "float8", 0.1), ("history_weight", "float8", 1.0),
                       ("context", "integer[]", [1, 2]), ("temperature", "float8", 1.0), ("top_k", "integer", 40),
                       ("top_p", "float8", 0.9), ("search_radius", "float8", None), ("max_neighbors", "integer", 100),
                       ("repetition_penalty", "float8", 1.0)],
    "htk_step_logits": [("atom_set_id", "integer", -1), ("centroid_window", "integer", 3),
                        ("centroid_decay", "float8", 0.5), ("history_window", "integer", 8),
                        ("kernel", "text", "gaussian"), ("bandwidth", "float8", 0.1),
                        ("history_weight", "float8", 1.0), ("context", "integer[]", [1, 2]),
                        ("max_neighbors", "integer", 100), ("search_radius", "float8", None)],
}
ENTRY_POINTS["htk_logits"] = ENTRY_POINTS["htk_distribution"][:9] + [("search_radius", "float8", None)]
ENTRY_POINTS["htk_store"] = ENTRY_POINTS["htk_distribution"][:5] + [("knn_memory", "boolean[]", [False, True])] \
    + ENTRY_POINTS["htk_distribution"][5:9]
ENTRY_POINTS["htk_pick"] = [("probabilities", "float8[]", [0.5, 0.5]), ("cumulative", "float8[]", [0.5, 1.0]),
                            ("u", "float8", 0.7)]

# The entry points that answer bad input instead of raising, so that their SQL caller's checked path
# raises (next_token, store_distribution, draft_tokens): their valid arguments (SET: a hand set's name
# or id, filled in per test) and what they answer for anything else.
SET = object()
ANSWERING = {
    "htk_step": [("context", "integer[]", [1, 2]), ("temperature", "float8", 1.0), ("top_k", "integer", 40),
                 ("top_p", "float8", 0.9), ("search_radius", "float8", None), ("max_neighbors", "integer", 100),
                 ("atom_set", "text", SET), ("repetition_penalty", "float8", 1.2), ("history_weight", "float8", None),
                 ("history_window", "integer", None)],
    "htk_store_step": [("context", "integer[]", [1, 2]), ("atom_set", "text", SET), ("max_neighbors", "integer", 100),
                       ("history_weight", "float8", None), ("history_window", "integer", None),
                       ("positions", "integer", 2)],
    "htk_serves": [("atom_set_id", "integer", SET)],
}
NOT_SERVED = {"htk_step": [(None, None, None)], "htk_store_step": [], "htk_serves": [(False,)]}
# Entry points without arguments: nothing to refuse (their rows are tested where they are used).
NO_ARGUMENTS = {"htk_stats"}

NAN, INF = float("nan"), float("inf")
# Bad values of each argument (an argument missing here accepts any value, NULL included).
BAD_VALUES = {
    "positions": [None, [], [0.1, 0.2], [NAN, 0.0, 0.0], [INF, 0.0, 0.0]],
    "centroid_window": [0, -3],
    "centroid_decay": [None, 0.0, -0.5, 1.5, NAN],
    "history_window": [-1, 4097],
    "context": [None, [], [1, None], [[1, 2], [3, 4]]],
    "keys": [None, [], [0.1, 0.2, 0.3, 0.4], [0.1] * 3 * 4098, [NAN, 0.0, 0.0, 0.1, 0.2, 0.3],
             [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]],      # the last: 2 history keys for 2 elements
    "knn_token_ids": [None, [3], [3, 4, 5], list(range(100001))],
    "knn_weights": [None, [1.0], [1.0, 0.0], [1.0, -2.0], [1.0, NAN], [1.0, INF]],
    "knn_distances": [None, [0.1], [0.1, -0.2], [0.1, NAN], [0.1, INF]],
    "kernel": [None, "cauchy", "Gaussian"],
    "bandwidth": [None, 0.0, -1.0, NAN, INF],
    "history_weight": [-1.0, NAN, INF],
    "temperature": [None, -1.0, NAN, INF, 1e-7, 1e7],
    "top_k": [-1],
    "top_p": [0.0, -0.5, 1.5, NAN],
    "search_radius": [-1.0, NAN],
    "max_neighbors": [None, 0, 100001],
    "repetition_penalty": [None, 0.0, -1.0, NAN, INF, 1e-7, 1e7],
    "atom_set_id": [None],
    "knn_memory": [None, [False], [False, None]],
    "probabilities": [None, [0.5, NAN], [0.5, -0.1], [[0.5, 0.5], [0.5, 0.5]]],
    "cumulative": [None, [0.5], [0.5, NAN]],
    "u": [None, NAN, INF, -INF],
    "atom_set": ["kerneltest_no_such_set"],
    "htk_store_step.positions": [None, 0, 3],     # a count there, at most the context's length
}


def bad_values(fn: str, name: str) -> list:
    """The bad values of argument `name` of `fn`: its own where an argument of another function shares
    the name with another meaning, else the name's."""
    return BAD_VALUES.get(f"{fn}.{name}", BAD_VALUES.get(name, []))

BAD_CALLS = [(fn, name, value) for fn, params in ENTRY_POINTS.items() for name, _, _ in params
             for value in bad_values(fn, name)]


def call_sql(fn: str, params: list) -> str:
    return f"SELECT * FROM {fn}(" + ", ".join(f"%s::{t}" for _, t, _ in params) + ")"


def test_the_sweep_holds_every_htk_function_of_the_extension_with_its_arguments(db) -> None:
    """Every function of the installed extension is swept (ENTRY_POINTS, ANSWERING) or has no
    arguments, with its arguments by name in order: a new htk_* function, or a new argument, fails
    here until the sweep holds it."""
    installed = dict(db.execute(
        "SELECT p.proname::text, coalesce(p.proargnames[1:p.pronargs], '{}') FROM pg_depend d "
        "JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'hartonomous_kernel' "
        "JOIN pg_proc p ON p.oid = d.objid WHERE d.classid = 'pg_proc'::regclass AND d.deptype = 'e'").fetchall())
    swept = {**ENTRY_POINTS, **ANSWERING}
    assert set(installed) == set(swept) | NO_ARGUMENTS
    assert not set(ENTRY_POINTS) & set(ANSWERING)
    for fn, params in swept.items():
        assert installed[fn] == [name for name, _, _ in params], fn
        assert any(bad_values(fn, name) for name, _, _ in params), fn
    for fn in NO_ARGUMENTS:
        assert installed[fn] == [], fn


ANSWERED_CALLS = [(fn, name, value) for fn, params in ANSWERING.items() for name, _, _ in params
                  for value in bad_values(fn, name)]


def answering_values(db: psycopg.Connection, sets: dict, params: list) -> list:
    (set_id,) = db.execute("SELECT id FROM atom_sets WHERE name = %s", (sets["gauss"].name,)).fetchone()
    return [(set_id if t == "integer" else sets["gauss"].name) if v is SET else v for _, t, v in params]


def test_the_answering_entry_points_serve_their_good_arguments(db, sets) -> None:
    """The valid call of each is served (so the sweep below tests what it claims)."""
    use(db, "")
    for fn, params in ANSWERING.items():
        rows = db.execute(call_sql(fn, params), answering_values(db, sets, params)).fetchall()
        assert rows and rows != NOT_SERVED[fn], fn


@pytest.mark.parametrize("fn,name,value", ANSWERED_CALLS,
                         ids=[f"{f}-{n}-{i}" for i, (f, n, _) in enumerate(ANSWERED_CALLS)])
def test_the_answering_entry_points_do_not_serve_a_bad_argument(db, sets, fn: str, name: str, value) -> None:
    params = ANSWERING[fn]
    values = answering_values(db, sets, params)
    values = [value if p == name else v for (p, _, _), v in zip(params, values)]
    assert db.execute(call_sql(fn, params), values).fetchall() == NOT_SERVED[fn]


@pytest.fixture(scope="module")
def reader(reader_url: str, db) -> Iterator[psycopg.Connection]:
    """The least-privilege role, which may run next_token and so every htk_* function it calls."""
    with psycopg.connect(reader_url, autocommit=True) as conn:
        yield conn


@pytest.mark.parametrize("fn,name,value", BAD_CALLS, ids=[f"{f}-{n}-{i}" for i, (f, n, _) in enumerate(BAD_CALLS)])
def test_the_reader_gets_22023_naming_each_bad_argument(reader, fn: str, name: str, value) -> None:
    params = ENTRY_POINTS[fn]
    values = [value if p == name else v for p, _, v in params]
    if name == "knn_token_ids" and value is not None and len(value) <= 100000:
        name = "knn_weights"            # a length the weights do not share: they are named
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=rf"^{name} must"):
        reader.execute(call_sql(fn, params), values)


def test_the_reader_runs_every_entry_point_with_good_arguments(reader) -> None:
    for fn, params in ENTRY_POINTS.items():
        rows = reader.execute(call_sql(fn, params), [v for _, _, v in params]).fetchall()
        assert len(rows) == 1, fn
    # a set the reader cannot see or that does not exist is not served: the SQL path answers
    assert reader.execute(call_sql("htk_next_token", ENTRY_POINTS["htk_next_token"]),
                          [v for _, _, v in ENTRY_POINTS["htk_next_token"]]).fetchone() == (None, None, None)


def test_the_issues_call_with_bandwidth_0_and_a_negative_radius_is_refused(reader) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"^bandwidth must be a finite number > 0, got 0"):
        reader.execute("SELECT * FROM htk_next_token(1, 3, 0.01, 8, 'gaussian', 0, 1, ARRAY[1,2], 1, 40, 0.9, -1, 100, 1)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=r"^search_radius must be >= 0, got -1"):
        reader.execute("SELECT * FROM htk_next_token(1, 3, 0.01, 8, 'gaussian', 0.1, 1, ARRAY[1,2], 1, 40, 0.9, -1, 100, 1)")


@pytest.mark.parametrize("fn", ["htk_distribution", "htk_logits", "htk_next_token", "htk_step_logits"])
def test_the_backoff_kernel_needs_a_decay_below_one(reader, fn: str) -> None:
    params = ENTRY_POINTS[fn]
    values = ["backoff" if p == "kernel" else 1.0 if p == "centroid_decay" else v for p, _, v in params]
    with pytest.raises(psycopg.errors.InvalidParameterValue,
                       match=r"^centroid_decay must be below 1 for the backoff kernel, got 1$"):
        reader.execute(call_sql(fn, params), values)
