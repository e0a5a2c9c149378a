"""Whether a test may run on the native kernel (ext/hartonomous_kernel) or must say why not.

`make install` builds and installs the extension and `migrate` creates it, so under CI=true a
missing native kernel is a failure; elsewhere (an external server, a machine without the server
headers) the tests that need it are skipped with the reason.
"""

from __future__ import annotations

import os

import pytest

REASON = ("the native kernel hartonomous_kernel is not installed on this server "
          "(`make install-kernel`, then `hartonomous migrate`)")


def require_native_kernel() -> None:
    if os.environ.get("CI"):
        pytest.fail(f"CI needs the native kernel: {REASON}")
    pytest.skip(REASON)


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
