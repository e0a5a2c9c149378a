"""Reconnect with bounded retry and backoff when the database goes away in the middle of work.

`ReconnectingConnection` wraps one autocommit psycopg connection. When a statement fails
because the connection was lost (server restart, crash, network), it reconnects with
exponential backoff and runs the statement again; inference statements only read, so running
one again is safe. The generation engine keeps its state (the token ids so far, the seed) in
Python, so a generation resumes where it was and gives the same tokens as without the fault.
Reconnecting is bounded by `RetryPolicy` (attempts and seconds); after that the caller gets
`DatabaseUnavailable`, one line that says what to do. Nothing here ever waits forever.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from hartonomous.errors import DatabaseUnavailable

log = logging.getLogger("hartonomous.db")

# SQLSTATEs of a lost connection: class 08 (connection exception) and the shutdown codes of class 57P.
LOST_SQLSTATES = ("57P01", "57P02", "57P03")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: at most `attempts` reconnects within `deadline_s` seconds."""

    attempts: int = 10
    first_delay_s: float = 0.25
    max_delay_s: float = 4.0
    deadline_s: float = 60.0
    connect_timeout_s: int = 5
    # TCP keepalives: a peer that vanished without closing the socket is noticed in ~15 s.
    keepalives: tuple[tuple[str, int], ...] = (("keepalives", 1), ("keepalives_idle", 5),
                                               ("keepalives_interval", 2), ("keepalives_count", 5))

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.deadline_s <= 0 or self.first_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("RetryPolicy needs attempts >= 1, deadline_s > 0 and delays >= 0")

    def delays(self) -> Iterator[float]:
        """Exponential backoff with jitter (50-100% of the step), capped at max_delay_s."""
        delay = self.first_delay_s
        for _ in range(self.attempts):
            yield min(self.max_delay_s, delay) * random.uniform(0.5, 1.0)
            delay *= 2


def connection_lost(exc: BaseException, conn: psycopg.Connection | None) -> bool:
    """Whether `exc` means the connection is gone (not a bad statement, not a cancel)."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    if conn is not None and (conn.closed or conn.broken):
        return True
    state = getattr(exc, "sqlstate", None) or ""
    return state.startswith("08") or state in LOST_SQLSTATES


class ReconnectingConnection:
    """An autocommit psycopg connection that reconnects and re-runs a statement after a lost connection.

    Everything but `execute` is passed through to the current underlying connection.
    """

    def __init__(self, url: str, policy: RetryPolicy | None = None, **connect_kwargs: Any):
        self.url = url
        self.policy = policy or RetryPolicy()
        self.connect_kwargs = {"autocommit": True, "connect_timeout": self.policy.connect_timeout_s,
                               **dict(self.policy.keepalives), **connect_kwargs}
        if not self.connect_kwargs["autocommit"]:
            raise ValueError("ReconnectingConnection re-runs statements, so it needs autocommit=True")
        self.reconnects = 0
        self._conn = self._connect()

    def _connect(self) -> psycopg.Connection:
        from hartonomous.db.connection import connect

        return connect(self.url, **self.connect_kwargs)

    @property
    def connection(self) -> psycopg.Connection:
        """The current underlying connection (a new object after each reconnect)."""
        return self._conn

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> psycopg.Cursor:
        """`Connection.execute`; after a lost connection, reconnect (bounded) and run it again."""
        try:
            return self._conn.execute(query, params, **kwargs)
        except psycopg.OperationalError as exc:
            if not connection_lost(exc, self._conn):
                raise
            first = exc
        return self._retry(first, query, params, kwargs)

    def _retry(self, first: BaseException, query: Any, params: Any, kwargs: dict) -> psycopg.Cursor:
        policy = self.policy
        deadline = time.monotonic() + policy.deadline_s
        last: BaseException = first
        attempts = 0
        log.warning("database connection lost (%s); reconnecting", _one_line(first))
        for delay in policy.delays():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(delay, remaining))
            attempts += 1
            try:
                self._replace_connection()
                result = self._conn.execute(query, params, **kwargs)
            except (psycopg.OperationalError, DatabaseUnavailable) as exc:
                if isinstance(exc, psycopg.OperationalError) and not connection_lost(exc, self._conn):
                    raise
                last = exc
                continue
            self.reconnects += 1
            log.warning("database connection re-established after %d attempt(s)", attempts)
            return result
        raise DatabaseUnavailable(
            f"lost the database connection ({_one_line(first)}) and could not reconnect in "
            f"{policy.deadline_s:g} s ({attempts} attempts; last error: {_one_line(last)}); "
            "check that the database is up (`hartonomous db status`) and try again") from last

    def _replace_connection(self) -> None:
        try:
            self._conn.close()
        except Exception:        # the old connection is already broken; closing it is best effort
            pass
        self._conn = self._connect()

    def close(self) -> None:
        self._conn.close()

    def __getattr__(self, name: str) -> Any:
        if name == "_conn":           # not connected yet (__init__ failed): no recursion
            raise AttributeError(name)
        return getattr(self._conn, name)

    def __enter__(self) -> "ReconnectingConnection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
