"""Follow a CREATE INDEX running on one connection from a second one, for a progress bar with an ETA.

A GiST build spends its time scanning the heap and inserting each row into the tree; PostgreSQL
reports that scan in `pg_stat_progress_create_index` (blocks_done of blocks_total). The building
connection is busy inside its transaction, so a short-lived second connection polls the view by
the builder's backend pid and hands the new blocks to `advance` (a progress bar's callback).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

POLL_SECONDS = 0.25
PROGRESS = "SELECT blocks_done, blocks_total FROM pg_stat_progress_create_index WHERE pid = %s"


def heap_blocks(conn: psycopg.Connection, table: str) -> int:
    """The table's size in blocks: what the index build's heap scan will report as its total."""
    (blocks,) = conn.execute("SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                             (table,)).fetchone()
    return int(blocks)


@contextmanager
def watch_index_build(conn: psycopg.Connection, total: int, advance: Callable[[int], None]) -> Iterator[None]:
    """While the body runs a CREATE INDEX on `conn`, call `advance(n)` with each n heap blocks the
    build has newly scanned, and with the rest of `total` when the body succeeds (the last poll may
    precede the end of the scan). The watcher never raises into the build: if it cannot connect (a
    server that refuses a second connection), the bar only moves at the end."""
    stop = threading.Event()
    lock = threading.Lock()
    seen = 0
    pid = conn.info.backend_pid
    conninfo = conn.info.dsn
    password = conn.pgconn.password

    def poll() -> None:
        nonlocal seen
        try:
            kwargs = {"password": password.decode()} if password else {}
            with psycopg.connect(conninfo, autocommit=True, application_name="hartonomous-index-progress",
                                 connect_timeout=5, **kwargs) as watcher:
                while not stop.wait(POLL_SECONDS):
                    row = watcher.execute(PROGRESS, (pid,)).fetchone()
                    with lock:
                        if row is not None and min(row[0], total) > seen:
                            advance(min(int(row[0]), total) - seen)
                            seen = min(int(row[0]), total)
        except psycopg.Error:
            return

    thread = threading.Thread(target=poll, name="index-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
    with lock:
        if total > seen:
            advance(total - seen)
            seen = total
