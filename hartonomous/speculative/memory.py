"""A memory of past generations: what the exact model said, kept beside an atom set for drafting.

Completed generations of the paths in REMEMBERED_PATHS (exact, speculative: every token the exact
model chose) can be written back, one atom per generated token at the key of the text before it
(sql/070_memory.sql). The speculative path's drafter reads them beside the set's atoms
(`draft_tokens(..., memory => true)`), so a repeated or similar request drafts what the model said
before, as SuffixDecoding does with its tree over past outputs. Atom sets stay immutable, and the
reader role never writes: a MemoryWriter holds its own connection as the database owner, and the
SQL function `remember()` validates, keeps the memory within the set's bound (`memory_bounds`,
written by the owner with `set_memory_bound()`) and evicts the oldest generations. Off by default
everywhere (`Client(memory=..., remember=...)`, `serve --remember`); `compare` reads it only with
`--memory`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hartonomous.errors import UserError

log = logging.getLogger("hartonomous.speculative.memory")

DEFAULT_MAX_ATOMS = 100_000          # a set's bound where the owner never set one (SQL ht_memory_bound)
MAX_ATOMS_LIMIT = 10_000_000         # set_memory_bound()'s own limit on a bound
# A whitelist of the paths whose every token is the exact model's choice: exact, and speculative
# (a draft is kept only where the model agrees). A path that mixes the store's guesses into the
# output is never remembered: the spatial path, hybrid (its spatial steps are the store's), augmented,
# and any later one until it is added here and to remember()'s own list
# on purpose. sql/070_memory.sql refuses any other path too.
REMEMBERED_PATHS = ("exact", "speculative")
REMEMBERED_REASONS = ("eos", "length", "stop_token", "stop_string")   # completed, not cancelled or failed


@dataclass(frozen=True)
class Remembered:
    """What one `remember()` did."""

    generation: int          # its number (later generations get larger ones)
    remembered: int          # atoms written (one per generated token)
    evicted: int             # atoms of older generations removed to stay within max_atoms
    atoms: int               # atoms in the set's memory afterwards


@dataclass(frozen=True)
class MemoryStatus:
    """What a set's memory holds."""

    atoms: int
    generations: int
    oldest: datetime | None
    newest: datetime | None


def check_max_atoms(max_atoms: int) -> int:
    if isinstance(max_atoms, bool) or not 1 <= int(max_atoms) <= MAX_ATOMS_LIMIT:
        raise UserError(f"the memory's max_atoms must be between 1 and {MAX_ATOMS_LIMIT:,}, got {max_atoms}")
    return int(max_atoms)


def status(conn: Any, atom_set: str | None) -> MemoryStatus:
    """What the set's memory holds now (any role may ask)."""
    from hartonomous import sqlcalls

    atoms, generations, oldest, newest = sqlcalls.memory_status(conn, atom_set)
    return MemoryStatus(int(atoms), int(generations), oldest, newest)


def worth_remembering(result: Any) -> bool:
    """A completed generation of a REMEMBERED_PATHS path (every token the exact model's), with tokens."""
    return (result.path in REMEMBERED_PATHS and result.finish_reason in REMEMBERED_REASONS
            and len(result.token_ids) > 0)


class MemoryWriter:
    """Writes completed generations into atom sets' memories through its own owner connection.

    Thread-safe: one connection, one lock (a remember() takes a few milliseconds). Connects on
    first use; `url` defaults to the owner's (the embedded cluster's), which the reader role's
    server never hands out. The bound is the set's (`remember()` enforces it): `max_atoms` None
    leaves every set's bound as it is; a number is the owner's configuration
    (`serve --memory-max-atoms`), and the writer sets it as the bound of each set it writes into,
    before each write (`set_memory_bound()`; nothing is written while it is unchanged).
    """

    def __init__(self, url: str | None = None, *, max_atoms: int | None = None, weight: float | None = None):
        if weight is not None and not (weight > 0 and weight < float("inf")):
            raise UserError(f"the memory's weight must be a positive finite number (or left out for the atom "
                            f"set's history_weight), got {weight}")
        self.url, self.weight = url, weight
        self.max_atoms = None if max_atoms is None else check_max_atoms(max_atoms)
        self._conn = None
        self._lock = threading.Lock()
        self.written = 0             # generations remembered by this writer
        self.failed = 0              # remember() calls that raised (logged, never the generation's error)

    def _connection(self):
        if self._conn is None or self._conn.closed:
            import psycopg

            from hartonomous.db.connection import owner_url

            self._conn = psycopg.connect(self.url or owner_url(), autocommit=True)
        return self._conn

    def remember(self, atom_set: str | None, prompt_ids: list[int], token_ids: list[int], path: str) -> Remembered:
        """Store one generation (prompt and generated ids) in `atom_set`'s memory (None: the default set)."""
        from hartonomous import sqlcalls

        with self._lock:
            conn = self._connection()
            if self.max_atoms is not None:
                sqlcalls.set_memory_bound(conn, atom_set, self.max_atoms)
            row = sqlcalls.remember(conn, atom_set, prompt_ids, token_ids, path, weight=self.weight)
            self.written += 1
        return Remembered(*row)

    def remember_result(self, atom_set: str | None, result: Any) -> Remembered | None:
        """Remember a GenerationResult if it is worth it (worth_remembering); failures are logged and
        counted, not raised: a generation that succeeded stays a success."""
        if not worth_remembering(result):
            return None
        try:
            return self.remember(atom_set, result.prompt_ids, result.token_ids, result.path)
        except Exception as exc:                     # noqa: BLE001 - the generation itself succeeded
            self.failed += 1
            log.warning("could not remember a %s generation in atom set %s: %s", result.path,
                        atom_set or "(default)", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            with self._lock:
                if self._conn is not None and not self._conn.closed:
                    self._conn.close()
                self._conn = None
            return None

    def set_bound(self, atom_set: str | None, max_atoms: int) -> int:
        """Set the set's memory bound (the owner's); the atoms evicted to fit it."""
        from hartonomous import sqlcalls

        with self._lock:
            return sqlcalls.set_memory_bound(self._connection(), atom_set, check_max_atoms(max_atoms))

    def forget(self, atom_set: str | None) -> int:
        """Empty the set's memory; the atoms removed."""
        from hartonomous import sqlcalls

        with self._lock:
            return sqlcalls.forget(self._connection(), atom_set)

    def status(self, atom_set: str | None) -> MemoryStatus:
        with self._lock:
            return status(self._connection(), atom_set)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
