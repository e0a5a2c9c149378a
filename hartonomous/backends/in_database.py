"""In-database generation: the whole loop in one SQL `generate_tokens` call.

The database picks every token with `seeded_uniform(seed, step)` on the same sampler as
`next_token`, so for the same seed this backend gives the same ids as the step-by-step
`SpatialBackend` (tested). It is a `SpatialBackend` (same atom set, options and errors) that the
engine drives as a `WholeLoopBackend`: one call, no per-step distributions.
"""

from __future__ import annotations

import threading

from psycopg import errors as pg_errors

from hartonomous import sqlcalls
from hartonomous.backends.base import Cancelled, WholeLoopBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.generation_config import SamplerArgs

CANCEL_POLL_S = 0.05


class InDatabaseBackend(SpatialBackend, WholeLoopBackend):
    """`generate_tokens` on one connection; a cancel event interrupts the running query."""

    def generate_all(self, prompt_ids: list[int], max_new_tokens: int, sampler: SamplerArgs, seed: int,
                     stop_token_ids: list[int], cancel: threading.Event) -> list[int]:
        """The generated ids (a final stop token included); raises Cancelled if `cancel` fires first."""
        query = sqlcalls.generate_tokens_query(prompt_ids, max_new_tokens, sampler, self.spatial, self.atom_set.name,
                                               seed, stop_token_ids)
        if cancel.is_set():
            raise Cancelled()
        done = threading.Event()
        watcher = threading.Thread(target=self._cancel_when, args=(cancel, done), daemon=True)
        watcher.start()
        try:
            row = sqlcalls.run(self.conn, query).fetchone()
        except pg_errors.QueryCanceled as exc:
            if not self.conn.autocommit:
                self.conn.rollback()
            if cancel.is_set():
                raise Cancelled() from exc
            raise
        finally:
            done.set()
            watcher.join()
        return [int(t) for t in (row[0] or [])]

    def _cancel_when(self, cancel: threading.Event, done: threading.Event) -> None:
        """Watcher thread: cancel the running query when `cancel` fires before the call is done."""
        while not done.is_set():
            if cancel.wait(CANCEL_POLL_S):
                if not done.is_set():
                    cancel_query = getattr(self.conn, "cancel_safe", None) or self.conn.cancel
                    cancel_query()
                return
