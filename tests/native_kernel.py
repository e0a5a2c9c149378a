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


def rounding_decides(relaxed: list, top_k: int | None, top_p: float | None, rel: float = 1e-9) -> bool:
    """Whether rounding may decide a step's rows: two candidates whose probabilities tie (to `rel`)
    across the top-k boundary, or across the top-p cut. `relaxed` is the reference's rows for the
    step at its temperature and penalty without top-k and top-p (probability descending). Repeated
    tokens make exactly equal keys, so such ties are real; the two kernels sum in other orders and
    may break them differently, which moves a whole distribution by its renormalisation."""
    ps = [r[1] for r in relaxed]

    def tie(a: float, b: float) -> bool:
        return abs(a - b) <= rel * max(abs(a), abs(b))

    k = top_k or 0
    if k and len(ps) > k and tie(ps[k - 1], ps[k]):
        return True
    kept = ps if not k or len(ps) <= k else ps[:k] + [p for p in ps[k:] if p >= ps[k - 1]]
    total = sum(kept)
    if top_p is None or top_p >= 1 or total <= 0:
        return False
    before = 0.0
    for i, p in enumerate(kept):
        if abs(before / total - top_p) <= rel:
            return True
        after = before + p
        if before / total < top_p <= after / total and i + 1 < len(kept) and tie(p, kept[i + 1]):
            return True
        before = after
    return False
