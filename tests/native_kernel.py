"""Whether a test may run on the native kernel (ext/hartonomous_kernel) or must say why not.

`make install` builds and installs the extension and `migrate` creates it, so under CI=true a
missing native kernel is a failure; elsewhere (an external server, a machine without the server
headers) the tests that need it are skipped with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

REASON = ("the native kernel hartonomous_kernel is not installed on this server "
          "(`make install-kernel`, then `hartonomous migrate`)")


def require_native_kernel() -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI needs the native kernel: {REASON}")
    pytest.skip(REASON)


@contextmanager
def module_connection(server_url: str, kernel: str) -> Iterator[psycopg.Connection]:
    """One connection whose transaction spans a test module (atom sets are written inside it and
    rolled back at the end), on `kernel`: 'native' (the hartonomous_kernel C extension) or 'plpgsql'
    (its reference, SET hartonomous.kernel = 'plpgsql'); skips (fails under CI) without the native one."""
    with psycopg.connect(server_url) as conn:
        conn.execute("SELECT 1")  # open the transaction, so write_atom_set cannot commit
        if kernel == "plpgsql":
            conn.execute("SET hartonomous.kernel = 'plpgsql'")
        (active,) = conn.execute("SELECT ht_kernel()").fetchone()
        if active != kernel:
            require_native_kernel()
        yield conn
        conn.rollback()


def use(conn: psycopg.Connection, kernel: str) -> None:
    """This transaction's kernel: '' lets ht_kernel() choose (native where it runs), 'plpgsql' forces the
    reference."""
    conn.execute("SELECT set_config('hartonomous.kernel', %s, true)", (kernel,))
    assert conn.execute("SELECT ht_kernel()").fetchone()[0] == (kernel or "native")


def both(conn: psycopg.Connection, sql: str, params) -> tuple[list, list]:
    """The rows of `sql` on the native kernel, then on the PL/pgSQL reference (same transaction)."""
    use(conn, "")
    native = conn.execute(sql, params).fetchall()
    use(conn, "plpgsql")
    reference = conn.execute(sql, params).fetchall()
    use(conn, "")
    return native, reference


# --- comparing next_token rows across implementations -------------------------------------------

def nonzero(rows: list) -> list:
    """The rows of probability > 0: exact pruning may drop rows whose probability is exactly 0."""
    return [r for r in rows if r[1] > 0]


def assert_same_rows(got: list, want: list, tol: float) -> None:
    """(token_id, probability, cumulative...) rows agree: probabilities and the rest within tol, and
    the same ids in the same order, except that rows whose probabilities tie to within tol may come
    in either order (sums run in another order in C: a tie in exact arithmetic is broken by
    rounding, docs/sql.md "The native kernel")."""
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want):
        assert g[1:] == pytest.approx(w[1:], abs=tol)
    i = 0
    while i < len(want):
        j = i + 1
        while j < len(want) and abs(want[j][1] - want[j - 1][1]) <= tol:
            j += 1
        assert sorted(r[0] for r in got[i:j]) == sorted(r[0] for r in want[i:j]), (got, want)
        i = j


def first_difference(a: list, b: list) -> int | None:
    """The first index where two sequences differ (the shorter one's length if one is a prefix)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def undecided_rows(relaxed: list, top_k: int | None, top_p: float | None, rel: float = 1e-9) -> set[int]:
    """The token ids whose place in a step's rows rounding may decide: those whose probability ties
    (to `rel`) the top-k boundary, or the row at the top-p cut where the mass before or after it
    ties p (with the rows tying it). `relaxed` is the reference's rows for the step at its
    temperature and penalty without top-k and top-p (probability descending). Repeated tokens make
    exactly equal keys, so such ties are real; the two kernels sum in other orders and may break
    them differently. A tie at the top-k boundary with top-p on changes the mass the cut sees, so
    then every row from the tie on may move. Empty: rounding decides nothing."""
    ids = [r[0] for r in relaxed]
    ps = [r[1] for r in relaxed]

    def tie(a: float, b: float) -> bool:
        return abs(a - b) <= rel * max(abs(a), abs(b))

    def group(i: int) -> set[int]:
        return {ids[j] for j in range(len(ps)) if tie(ps[j], ps[i])}

    k = top_k or 0
    top_p_on = top_p is not None and top_p < 1
    if k and len(ps) > k and tie(ps[k - 1], ps[k]):
        tied = group(k - 1)
        if not top_p_on:
            return tied
        first = min(i for i in range(len(ps)) if ids[i] in tied)
        return tied | set(ids[first:])
    n_kept = len(ps) if not k or len(ps) <= k else k + sum(1 for p in ps[k:] if p >= ps[k - 1])
    total = sum(ps[:n_kept])
    if not top_p_on or total <= 0:
        return set()
    before = 0.0
    for i in range(n_kept):
        after = before + ps[i]
        if abs(before / total - top_p) <= rel:
            return group(i)                     # row i kept or not
        if before / total < top_p <= after / total:    # row i is the last row kept
            if i + 1 < n_kept and abs(after / total - top_p) <= rel:
                return group(i + 1)             # the next one may be kept too
            if i + 1 < n_kept and tie(ps[i], ps[i + 1]):
                return group(i)                 # which of the tied rows is kept
            return set()
        before = after
    return set()


def rounding_decides(relaxed: list, top_k: int | None, top_p: float | None, rel: float = 1e-9) -> bool:
    """Whether rounding may decide any of a step's rows (undecided_rows is not empty)."""
    return bool(undecided_rows(relaxed, top_k, top_p, rel))


def assert_same_rows_but(got: list, want: list, undecided: set[int], tol: float) -> None:
    """Rows agree except for the undecided token ids, which either may hold or lack: every other
    row is in both, and over the rows both hold the probabilities agree after renormalising
    (dropping or adding an undecided row rescales the others) and come in the same order
    (assert_same_rows)."""
    g = {r[0]: r[1] for r in got}
    w = {r[0]: r[1] for r in want}
    assert set(g) ^ set(w) <= undecided, (got, want, undecided)
    common_got = [r[0] for r in got if r[0] in w]
    common_want = [r[0] for r in want if r[0] in g]
    sg, sw = sum(g[i] for i in common_got), sum(w[i] for i in common_want)
    assert_same_rows([(i, g[i] / sg) for i in common_got], [(i, w[i] / sw) for i in common_want], tol)
