"""The native kernel's own backend state and its failures: a cancel stops a long step, what a backend
keeps stays within hartonomous_kernel.max_state_memory, a set rebuilt under a reused id is read
again, and a bad token_blocks row is a clear error, not a crash (docs/sql.md "The native kernel").

Each test runs in a backend of its own (fresh state and counters), in a transaction rolled back at
the end; some take locks (DROP of a partition, ALTER TABLE token_blocks) that a module-wide open
transaction, as tests/test_kernel_native.py keeps, would block.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from hand_sets import add_set, random_set, reference_sets
from native_kernel import assert_same_rows, module_connection, nonzero, require_native_kernel

TOL = 1e-12
NEXT_TOKEN = ("SELECT * FROM next_token(%(context)s, %(temperature)s, %(top_k)s, %(top_p)s, %(search_radius)s, "
              "%(max_neighbors)s, %(atom_set)s, %(repetition_penalty)s, %(history_weight)s, %(history_window)s)")


@pytest.fixture
def own(server_url: str) -> Iterator[psycopg.Connection]:
    """A backend of its own (fresh kernel state and counters), in a transaction rolled back at the end."""
    with module_connection(server_url, "native") as conn:
        yield conn


def test_a_long_native_step_answers_a_cancel_and_the_backend_goes_on(own) -> None:
    """A context of 2^19 tokens (read from a table, so the call's time is the kernel's) whose state
    is too large to keep: every call computes all its keys, 64 weights each. With a
    statement_timeout a tenth of the call's time the cancel comes within half of it (without the
    kernel's interrupt checks it waits for the keys to be done), and the connection goes on."""
    import math
    import time

    s = random_set("kerneltest_wide", 31, kernel="gaussian", bandwidth=0.2, window=64, decay=0.99)
    set_id = add_set(own, s)
    own.execute("CREATE TEMP TABLE kerneltest_context ON COMMIT DROP AS "
                "SELECT ARRAY(SELECT (i % 50)::integer FROM generate_series(1, 524288) i) AS c")
    call = ("SELECT d.token_ids IS NOT NULL FROM kerneltest_context t, htk_next_token(%s, 64, 0.99, 0, 'gaussian', "
            "0.2, 0, t.c[1:%s], 1.0, 40, 0.9, NULL, 100, 1.0) d")
    start = time.perf_counter()
    assert own.execute(call, (set_id, 1 << 19)).fetchone() == (True,)
    full = time.perf_counter() - start
    assert own.execute("SELECT kept_contexts FROM htk_stats()").fetchone() == (0,)   # not kept: a fresh state each call
    timeout_ms = max(50, math.floor(full * 100))
    with own.transaction():
        own.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
        start = time.perf_counter()
        with pytest.raises(psycopg.errors.QueryCanceled):
            with own.transaction():
                own.execute(call, (set_id, 1 << 19))
        cancelled = time.perf_counter() - start
        own.execute("SET LOCAL statement_timeout = 0")
    assert cancelled < full / 2, (cancelled, full)
    assert own.execute("SELECT count(*) FROM atom_sets WHERE id = %s", (set_id,)).fetchone() == (1,)
    assert own.execute(call, (set_id, 100)).fetchone() == (True,)


def test_the_state_kept_stays_within_max_state_memory_and_steps_stay_right(own) -> None:
    """With a 256 kB bound, contexts of 500 tokens (~150 kB of state each) push each other out; a
    context of 3,000 tokens is served without being kept; every step gives the reference's rows."""
    s = reference_sets()["gauss"]
    add_set(own, s)
    own.execute("SET hartonomous_kernel.max_state_memory = '256kB'")
    bound = 256 * 1024
    args = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "search_radius": None, "max_neighbors": 50,
            "repetition_penalty": 1.3, "history_weight": 2.0, "history_window": 64, "atom_set": s.name}
    contexts = [[(7 * i + j * j) % 50 for j in range(500)] for i in range(5)]
    contexts += [contexts[0] + [3], contexts[2] + [4, 5], [j % 47 for j in range(3000)]]
    steps = 0
    for context in contexts:
        own.execute("SELECT set_config('hartonomous.kernel', '', false)")
        native = own.execute(NEXT_TOKEN, {**args, "context": context}).fetchall()
        kept, n_sets, n_contexts, evicted, counted = own.execute(
            "SELECT kept_bytes, kept_sets, kept_contexts, evictions, steps FROM htk_stats()").fetchone()
        steps += 1
        assert counted == steps                     # served in C
        assert 0 < kept <= bound and n_sets <= 1 and n_contexts in (1, 2)
        own.execute("SELECT set_config('hartonomous.kernel', 'plpgsql', false)")
        reference = own.execute(NEXT_TOKEN, {**args, "context": context}).fetchall()
        assert_same_rows(nonzero(native), nonzero(reference), TOL)
    assert evicted >= len(contexts) - 3
    own.execute("RESET hartonomous.kernel")
    own.execute("RESET hartonomous_kernel.max_state_memory")


def test_a_set_rebuilt_under_a_reused_id_is_read_again(own) -> None:
    """The kernel's cache holds a set's positions; the set is deleted, its id handed out again
    (ALTER SEQUENCE ... RESTART) to a set with other positions, in the same backend and
    transaction: the step reads the new set's positions, not the cached ones."""
    from hartonomous.atomset.catalog import delete_atom_set_rows

    first = random_set("kerneltest_reused", 41, kernel="gaussian", bandwidth=0.15, window=3, decay=0.6)
    second = random_set("kerneltest_reused", 42, kernel="gaussian", bandwidth=0.15, window=3, decay=0.6)
    context = [1, 2, 3, 4, 5, 6]
    args = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "search_radius": None, "max_neighbors": 50,
            "repetition_penalty": 1.0, "history_weight": None, "history_window": None,
            "atom_set": first.name, "context": context}
    set_id = add_set(own, first)
    before = own.execute(NEXT_TOKEN, args).fetchall()
    assert own.execute("SELECT steps, kept_sets FROM htk_stats()").fetchone() == (1, 1)
    delete_atom_set_rows(own, set_id)
    (sequence,) = own.execute("SELECT pg_get_serial_sequence('atom_sets', 'id')").fetchone()
    own.execute(f"ALTER SEQUENCE {sequence} RESTART WITH {set_id}")
    assert add_set(own, second) == set_id
    native = own.execute(NEXT_TOKEN, args).fetchall()
    assert own.execute("SELECT steps FROM htk_stats()").fetchone() == (2,)
    own.execute("SET LOCAL hartonomous.kernel = 'plpgsql'")
    reference = own.execute(NEXT_TOKEN, args).fetchall()
    assert nonzero(reference) != nonzero(before)     # the two sets answer differently
    assert_same_rows(nonzero(native), nonzero(reference), TOL)


LOOP_STEP = ("SELECT token_ids, probabilities FROM htk_next_token(%(id)s, 3, 0.6, 0, 'gaussian', 0.15, 0, "
             "%(context)s, 1.0, NULL, NULL, NULL, 50, 1.0)")


def _rebuild_under_the_same_id(conn: psycopg.Connection, set_id: int, s) -> None:
    """Delete set `set_id` and write `s` under the same id (the sequence restarted)."""
    from hartonomous.atomset.catalog import delete_atom_set_rows

    delete_atom_set_rows(conn, set_id)
    (sequence,) = conn.execute("SELECT pg_get_serial_sequence('atom_sets', 'id')").fetchone()
    conn.execute(f"ALTER SEQUENCE {sequence} RESTART WITH {set_id}")
    assert add_set(conn, s) == set_id


def _reference_step(conn: psycopg.Connection, name: str, context: list[int]) -> list[tuple]:
    """next_token's rows on the PL/pgSQL reference with LOOP_STEP's arguments."""
    conn.execute("SELECT set_config('hartonomous.kernel', 'plpgsql', false)")
    rows = conn.execute("SELECT token_id, probability FROM next_token(%s, 1.0, NULL, NULL, NULL, 50, %s, 1.0, 0)",
                        (context, name)).fetchall()
    conn.execute("SELECT set_config('hartonomous.kernel', '', false)")
    return rows


def _as_rows(step: tuple) -> list[tuple]:
    return list(zip(step[0], step[1]))


def test_a_loop_step_reads_a_set_rebuilt_in_its_own_transaction(own) -> None:
    """The loops' step (htk_next_token) reads the set's row version only where the snapshot may see
    another one; a rebuild earlier in the same transaction is such a change: the next step reads
    the new set's positions, not the cached ones."""
    first = random_set("kerneltest_loop_own", 43, kernel="gaussian", bandwidth=0.15, window=3, decay=0.6)
    second = random_set("kerneltest_loop_own", 44, kernel="gaussian", bandwidth=0.15, window=3, decay=0.6)
    context = [1, 2, 3, 4, 5, 6]
    set_id = add_set(own, first)
    before = _as_rows(own.execute(LOOP_STEP, {"id": set_id, "context": context}).fetchone())
    assert _as_rows(own.execute(LOOP_STEP, {"id": set_id, "context": context}).fetchone()) == before
    _rebuild_under_the_same_id(own, set_id, second)
    after = _as_rows(own.execute(LOOP_STEP, {"id": set_id, "context": context}).fetchone())
    reference = _reference_step(own, second.name, context)
    assert nonzero(reference) != nonzero(before)     # the two sets answer differently
    assert_same_rows(nonzero(after), nonzero(reference), TOL)


def test_a_loop_step_reads_a_set_another_transaction_rebuilt(server_url: str) -> None:
    """Between two steps of one backend another transaction rebuilds the set under the same id and
    commits: the next step reads the new set, as a loop's next statement sees the commit."""
    first = random_set("kerneltest_loop_other", 45, kernel="gaussian", bandwidth=0.15, window=3, decay=0.6)
    second = random_set("kerneltest_loop_other", 46, kernel="gaussian", bandwidth=0.15, window=3, decay=0.6)
    context = [6, 5, 4, 3, 2, 1]
    with psycopg.connect(server_url) as writer, psycopg.connect(server_url, autocommit=True) as reader:
        set_id = add_set(writer, first)
        writer.commit()
        try:
            if reader.execute("SELECT ht_kernel()").fetchone() != ("native",):
                require_native_kernel()
            before = _as_rows(reader.execute(LOOP_STEP, {"id": set_id, "context": context}).fetchone())
            assert _as_rows(reader.execute(LOOP_STEP, {"id": set_id, "context": context}).fetchone()) == before
            _rebuild_under_the_same_id(writer, set_id, second)
            writer.commit()
            after = _as_rows(reader.execute(LOOP_STEP, {"id": set_id, "context": context}).fetchone())
            reference = _reference_step(reader, second.name, context)
            assert nonzero(reference) != nonzero(before)
            assert_same_rows(nonzero(after), nonzero(reference), TOL)
        finally:
            from hartonomous.atomset.catalog import delete_atom_set_rows

            writer.rollback()
            delete_atom_set_rows(writer, set_id)
            writer.commit()


BLOCK = "INSERT INTO token_blocks (atom_set_id, block, xs, ys, zs) VALUES (%s, %s, %s, %s, %s)"


def test_token_blocks_refuse_a_negative_block(own) -> None:
    set_id = add_set(own, reference_sets()["expo"])
    with pytest.raises(psycopg.errors.CheckViolation, match="token_blocks_block_check"):
        with own.transaction():
            own.execute(BLOCK, (set_id, -1, [0.5] * 256, [0.5] * 256, [0.5] * 256))


@pytest.mark.parametrize("block,xs,error,message", [
    (-1, [0.5] * 256, psycopg.errors.NumericValueOutOfRange, r"block -1 is outside 0 \.\. 8388607"),
    (1, None, psycopg.errors.NullValueNotAllowed, "block 1 has NULL xs"),
    (1, [0.5] * 10, psycopg.errors.ArraySubscriptError, "block 1's xs must be 256 numbers"),
    (1, [float("inf")] * 256, psycopg.errors.NumericValueOutOfRange, "block 1's xs must be finite or NaN"),
    (1, [0.5] + [float("nan")] * 255, psycopg.errors.NumericValueOutOfRange, "token 257 has NaN in some"),
])
def test_a_bad_token_blocks_row_is_a_clear_error_and_the_backend_goes_on(own, block, xs, error, message) -> None:
    """Rows the table's constraints would refuse, written with them dropped (as only the owner can):
    the kernel names the set and the block (a data error, not XX000, no crash), and serves the set
    once the row is gone."""
    set_id = add_set(own, reference_sets()["expo"])
    with pytest.raises(error, match=rf"token_blocks of atom set {set_id}: {message}"):
        with own.transaction():
            own.execute("ALTER TABLE token_blocks DROP CONSTRAINT token_blocks_block_check")
            own.execute("ALTER TABLE token_blocks ALTER COLUMN xs DROP NOT NULL")
            own.execute(BLOCK, (set_id, block, xs, [0.5] * 256, [0.5] * 256))
            own.execute("SELECT htk_serves(%s)", (set_id,))
    assert own.execute("SELECT htk_serves(%s)", (set_id,)).fetchone() == (True,)


def test_a_set_whose_positions_exceed_the_bound_takes_the_sql_path(own) -> None:
    """The largest block a token id can have: 6.4 GB of positions, not cached (no overflow, no
    error), so next_token answers on its SQL path."""
    s = reference_sets()["expo"]
    set_id = add_set(own, s)
    own.execute(BLOCK, (set_id, 8388607, [0.5] * 256, [0.5] * 256, [0.5] * 256))
    assert own.execute("SELECT htk_serves(%s)", (set_id,)).fetchone() == (False,)
    rows = own.execute("SELECT * FROM next_token(ARRAY[1, 2, 3], atom_set => %s)", (s.name,)).fetchall()
    assert rows and own.execute("SELECT steps, kept_bytes FROM htk_stats()").fetchone() == (0, 0)


# --- the C answers what the PL/pgSQL reference answers, or raises its error class ---------------

KEYS = [0.1, 0.2, 0.3]          # a centre, no history keys
STORE = ("SELECT * FROM htk_store(ARRAY[1, 2], %(keys)s, ARRAY[3, 4], ARRAY[1.0, 1.0], %(d)s, ARRAY[false, false], "
         "%(kernel)s, %(h)s, %(decay)s, NULL)")
# the reference of htk_store (sql/090_store.sql), for the same candidates
STORE_REFERENCE = ("SELECT * FROM ht_store_step(ARRAY[1, 2], ST_MakePoint(0.1, 0.2, 0.3), NULL, ARRAY[3, 4], "
                   "ARRAY[1.0, 1.0], %(d)s, ARRAY[false, false], %(kernel)s, %(h)s, %(decay)s, 0)")
DISTRIBUTION = ("SELECT * FROM htk_distribution(ARRAY[1, 2], %(keys)s, ARRAY[3, 4], ARRAY[1.0, 1.0], %(d)s, "
                "%(kernel)s, %(h)s, %(decay)s, NULL, 1.0, NULL, NULL, NULL, 1.0)")
LOGITS = ("SELECT * FROM htk_logits(ARRAY[1, 2], %(keys)s, ARRAY[3, 4], ARRAY[1.0, 1.0], %(d)s, %(kernel)s, %(h)s, "
          "%(decay)s, NULL, NULL)")


def raised(conn: psycopg.Connection, sql: str, args: dict) -> tuple[str | None, str]:
    """The SQLSTATE and message `sql` raises (None and its rows where it returns)."""
    try:
        with conn.transaction():
            return None, str(conn.execute(sql, args).fetchall())
    except psycopg.Error as e:
        return e.sqlstate, e.diag.message_primary


@pytest.mark.parametrize("kernel,h,d,decay,message", [
    ("gaussian", 1e-150, [1e10, 1e10], 0.5, "value out of range: overflow"),        # (d / h)^2 > 1.8e308
    ("exponential", 1e-300, [1e10, 1e10], 0.5, "value out of range: overflow"),     # d / h
    ("gaussian", 1.0, [1e-200, 1e-200], 0.5, "value out of range: underflow"),      # (d / h)^2 < 4.9e-324
    ("backoff", 1e-300, [0.1, 0.2], 0.9999999999999999, "integer out of range"),    # the rung, ~ -6e18
])
def test_overflow_is_the_references_error_not_nan_or_an_undefined_integer(own, kernel, h, d, decay, message) -> None:
    """The issue's calls: distances 1e10 at bandwidth 1e-150 gave probabilities {NaN, NaN}, and the
    backoff rung at decay 0.9999999999999999 and bandwidth 1e-300 gave -2147483648 (a double cast to
    int out of its range). The reference raises 22003 for both; so does the C, in every entry point
    that computes the term or the rung."""
    args = {"keys": KEYS, "d": d, "kernel": kernel, "h": h, "decay": decay}
    assert raised(own, STORE_REFERENCE, args) == ("22003", message)
    assert raised(own, STORE, args) == ("22003", message)
    if kernel != "backoff":     # the rung is store_distribution's alone
        assert raised(own, DISTRIBUTION, args) == ("22003", message)
        assert raised(own, LOGITS, args) == ("22003", message)


def test_within_range_the_c_and_the_reference_agree_at_the_edges(own) -> None:
    """The same calls one step inside the range answer, and as the reference."""
    args = {"keys": KEYS, "d": [1e10, 2e10], "kernel": "gaussian", "h": 1e-140, "decay": 0.5}
    (native,) = own.execute(STORE, args).fetchall()
    (reference,) = own.execute(STORE_REFERENCE, args).fetchall()
    assert native[0] == reference[0] == [3, 4]
    assert native[1] == pytest.approx(reference[1], abs=1e-12) and native[1] == [1.0, 0.0]
    args = {**args, "d": [0.1, 0.2], "kernel": "backoff", "h": 1e-300, "decay": 0.999999}
    (native,) = own.execute(STORE, args).fetchall()
    (reference,) = own.execute(STORE_REFERENCE, args).fetchall()
    assert native[3] == reference[3] < -600_000_000


@pytest.mark.parametrize("args,message", [
    ((None, [1.0], 0.5), "probabilities must not be NULL"),
    (([1.0], None, 0.5), "cumulative must not be NULL"),
    (([1.0], [1.0], None), "u must not be NULL"),
    (([0.5, 0.5], [0.5, 1.0], float("nan")), "u must be a finite number, got NaN"),
    (([0.5, 0.5], [0.5, 1.0], float("inf")), "u must be a finite number, got Infinity"),
    (([0.5, float("nan")], [0.5, 1.0], 0.7), r"probabilities must hold finite numbers >= 0, got NaN \(element 2\)"),
    (([0.5, 0.5], [0.5, float("nan")], 0.7), r"cumulative must hold finite numbers, got NaN \(element 2\)"),
])
def test_htk_pick_refuses_null_and_nan_naming_the_argument(own, args, message) -> None:
    """u = NaN returned 2 and NULL returned NULL (a draw without a pick); now 22023 naming it."""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=rf"^{message}$"):
        with own.transaction():
            own.execute("SELECT htk_pick(%s::float8[], %s::float8[], %s::float8)", args)
    assert own.execute("SELECT htk_pick(ARRAY[0.5, 0.5], ARRAY[0.5, 1.0], 0.7)").fetchone() == (2,)


def test_the_repetition_penalty_sort_of_a_long_context_answers_a_cancel(own) -> None:
    """sampler_rows sorts the context's ids for the repetition penalty: 2^23 shuffled ids (read from
    a table, so the call's time is the kernel's), no history. With a statement_timeout a tenth of the
    call's time the cancel comes within half of it; without an interrupt check in the sort it waited
    for the sort."""
    import math
    import time

    own.execute("CREATE TEMP TABLE kerneltest_ids ON COMMIT DROP AS "
                "SELECT ARRAY(SELECT ((i::bigint * 2654435761) % 1000003)::integer "
                "FROM generate_series(1, 8388608) i) AS c")
    call = ("SELECT cardinality(d.token_ids) FROM kerneltest_ids t, htk_distribution(t.c, ARRAY[0.1, 0.2, 0.3], "
            "ARRAY[3, 4], ARRAY[1.0, 1.0], ARRAY[0.1, 0.2], 'gaussian', 0.5, 0.5, NULL, 1.0, NULL, NULL, NULL, 1.3) d")
    start = time.perf_counter()
    assert own.execute(call).fetchone() == (2,)
    full = time.perf_counter() - start
    timeout_ms = max(50, math.floor(full * 100))
    with own.transaction():
        own.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
        start = time.perf_counter()
        with pytest.raises(psycopg.errors.QueryCanceled):
            with own.transaction():
                own.execute(call)
        cancelled = time.perf_counter() - start
        own.execute("SET LOCAL statement_timeout = 0")
    assert cancelled < full / 2, (cancelled, full)
    assert own.execute("SELECT htk_pick(ARRAY[1.0], ARRAY[1.0], 0.5)").fetchone() == (1,)
