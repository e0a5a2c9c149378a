"""A memory of past generations: what the exact model said, kept beside an atom set for drafting.

Completed generations of the paths in REMEMBERED_PATHS (exact, speculative: every token the exact
model chose) can be written back, one atom per generated token at the key of the text before it
(sql/070_memory.sql). The speculative path's drafter reads them beside the set's atoms
(`draft_tokens(..., memory => true)`), so a repeated or similar request drafts what the model said
before, as SuffixDecoding does with its tree over past outputs; the augmented path's store reads
them too. Atom sets stay immutable, and the reader role never writes: a MemoryWriter holds its own
connection as the database owner, and the SQL function `remember()` validates, admits only the
sampler settings the set's owner allows (`memory_policies`, `set_memory_policy()`: by default
greedy and the sampler's defaults, nothing hotter), keeps the memory within the set's bound
(`memory_bounds`, `set_memory_bound()`) and evicts the oldest generations. What the memory did with
a generation (a MemoryOutcome: remembered, or not and why) goes on its result (`result.memory`),
which the HTTP response and the CLI show. Off by default everywhere (`Client(memory=...,
remember=...)`, `serve --remember`); `compare` reads it only with `--memory`.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from hartonomous.errors import UserError
from hartonomous.paths import remembered_paths

log = logging.getLogger("hartonomous.memory")

DEFAULT_MAX_ATOMS = 100_000          # a set's bound where the owner never set one (SQL ht_memory_bound)
MAX_ATOMS_LIMIT = 10_000_000         # set_memory_bound()'s own limit on a bound
# A whitelist of the paths whose every token is the exact model's choice, read from the paths'
# declarations (`remembered=True`, hartonomous/paths/): exact, and speculative verifying against
# the exact model (a draft is kept only where the model agrees). A path that mixes the store's
# guesses into the output is never remembered: the spatial path, hybrid (its spatial steps are the
# store's), augmented (and speculative verifying against it), and any later one until its
# declaration says so and remember()'s own list in sql/070_memory.sql names it too, on purpose
# (the SQL refuses any other path).
REMEMBERED_PATHS = remembered_paths()
REMEMBERED_REASONS = ("eos", "length", "stop_token", "stop_string")   # completed, not cancelled or failed
# set_memory_policy()'s arguments (sql/070_memory.sql, rule 2a); the values live there, not here.
POLICY_FIELDS = {"min_temperature": float, "max_temperature": float, "min_top_p": float, "max_top_p": float,
                 "max_top_k": int, "allow_repetition_penalty": bool, "allow_adaptive": bool,
                 "allow_ignore_eos": bool}
REFUSED = "42501"      # remember()'s SQLSTATE when the set's policy does not admit the settings...
REFUSED_PREFIX = "not remembered: "              # ...and how its message starts
WRITE_FAILED = "the memory could not be written (the server log says why)"


@dataclass(frozen=True)
class Remembered:
    """What one `remember()` did."""

    generation: int          # its number (later generations get larger ones)
    remembered: int          # atoms written (one per generated token)
    evicted: int             # atoms of older generations removed to stay within max_atoms
    atoms: int               # atoms in the set's memory afterwards

    def as_dict(self) -> dict:
        """The API's `memory` object (hartonomous/server/schemas.py MemoryOut)."""
        return {"remembered": True, "reason": None, "generation": self.generation, "atoms": self.remembered}

    def line(self) -> str:
        return (f"remembered as generation {self.generation} ({self.remembered} atoms, {self.evicted} older "
                f"evicted; the set's memory holds {self.atoms})")


@dataclass(frozen=True)
class NotRemembered:
    """A generation the memory did not keep, and why (the path, its end, or the set's policy)."""

    reason: str
    failed: bool = False     # the write failed (logged and counted), rather than being refused

    def as_dict(self) -> dict:
        return {"remembered": False, "reason": self.reason, "generation": None, "atoms": 0}

    def line(self) -> str:
        return f"not remembered: {self.reason}"


MemoryOutcome = Remembered | NotRemembered


@dataclass(frozen=True)
class SamplerSettings:
    """The settings a generation ran with, as remember() records them and checks them against the
    set's policy: the shared sampler's, whether adaptive sampling ran, whether EOS was ignored."""

    temperature: float
    top_k: int | None
    top_p: float
    repetition_penalty: float
    adaptive: bool
    ignore_eos: bool

    def as_dict(self) -> dict:
        """remember()'s arguments."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "repetition_penalty": self.repetition_penalty, "adaptive": self.adaptive,
                "ignore_eos": self.ignore_eos}

    @classmethod
    def of(cls, config: Any) -> "SamplerSettings":
        """A GenerationConfig's."""
        return cls(float(config.temperature), config.top_k, float(config.top_p), float(config.repetition_penalty),
                   bool(config.adaptive), not config.stop_at_eos)


@dataclass(frozen=True)
class MemoryPolicy:
    """A set's sampler policy for its memory, as set_memory_policy() takes it: None leaves a field at
    the default policy's value (greedy and the sampler's defaults; SQL ht_memory_policy)."""

    min_temperature: float | None = None
    max_temperature: float | None = None
    min_top_p: float | None = None
    max_top_p: float | None = None
    max_top_k: int | None = None          # 0: any top_k, off included
    allow_repetition_penalty: bool | None = None
    allow_adaptive: bool | None = None
    allow_ignore_eos: bool | None = None

    @classmethod
    def parse(cls, text: str) -> "MemoryPolicy":
        """`KEY=VALUE[,KEY=VALUE...]` with set_memory_policy()'s argument names (`serve --memory-policy`);
        the database checks the values' ranges."""
        values: dict[str, Any] = {}
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            key, sep, raw = (x.strip() for x in item.partition("="))
            if not sep or key not in POLICY_FIELDS:
                raise UserError(f"the memory policy takes KEY=VALUE pairs with KEY one of {', '.join(POLICY_FIELDS)}; "
                                f"got {item!r}")
            values[key] = _policy_value(key, raw)
        return cls(**values)

    def arguments(self) -> dict:
        return {name: getattr(self, name) for name in POLICY_FIELDS}


def _policy_value(key: str, raw: str) -> Any:
    kind = POLICY_FIELDS[key]
    if kind is bool:
        if raw.lower() in ("true", "yes", "1", "on"):
            return True
        if raw.lower() in ("false", "no", "0", "off"):
            return False
        raise UserError(f"the memory policy's {key} must be true or false, got {raw!r}")
    try:
        value = kind(raw)
    except ValueError:
        raise UserError(f"the memory policy's {key} must be a number, got {raw!r}") from None
    if kind is float and not math.isfinite(value):
        raise UserError(f"the memory policy's {key} must be a finite number, got {raw!r}")
    return value


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


def why_not_remembered(result: Any) -> str | None:
    """Why a result is not even offered to remember() (None: it is): only a completed generation of
    a REMEMBERED_PATHS path (every token the exact model's), with tokens and known settings. The
    sampler settings are the set's policy's to judge, in SQL."""
    if result.path not in REMEMBERED_PATHS:
        return f"the {result.path} path's output holds the store's guesses, not only the exact model's words"
    if getattr(result.stats, "target", "exact") != "exact":
        return "verified against the augmented path, whose output holds the store's guesses"
    if result.finish_reason not in REMEMBERED_REASONS:
        return f"the generation did not complete ({result.finish_reason})"
    if len(result.token_ids) == 0:
        return "no tokens were generated"
    if getattr(result, "config", None) is None:
        return "the sampler settings it ran with are unknown"
    return None


def policy_refusal(exc: BaseException) -> str | None:
    """What remember() said when the set's policy refused a generation's settings (SQLSTATE 42501,
    "not remembered: WHY"): WHY; None for any other error."""
    if getattr(exc, "sqlstate", None) != REFUSED:
        return None
    message = getattr(getattr(exc, "diag", None), "message_primary", None) or ""
    if not message.startswith(REFUSED_PREFIX):
        return None
    return message[len(REFUSED_PREFIX):]


def worth_remembering(result: Any) -> bool:
    """Whether a result is offered to remember() (why_not_remembered says why not)."""
    return why_not_remembered(result) is None


class MemoryWriter:
    """Writes completed generations into atom sets' memories through its own owner connection.

    Thread-safe: one connection, one lock (a remember() takes a few milliseconds). Connects on
    first use; `url` defaults to the owner's (the embedded cluster's), which the reader role's
    server never hands out. The bound and the sampler policy are the set's (`remember()` enforces
    both): `max_atoms` and `policy` None leave every set's as they are; a value is the owner's
    configuration (`serve --memory-max-atoms`, `serve --memory-policy`), and the writer sets it on
    each set it writes into, before each write (`set_memory_bound()`, `set_memory_policy()`;
    nothing is written while it is unchanged).
    """

    def __init__(self, url: str | None = None, *, max_atoms: int | None = None, weight: float | None = None,
                 policy: MemoryPolicy | None = None):
        if weight is not None and not (weight > 0 and weight < float("inf")):
            raise UserError(f"the memory's weight must be a positive finite number (or left out for the atom "
                            f"set's history_weight), got {weight}")
        self.url, self.weight, self.policy = url, weight, policy
        self.max_atoms = None if max_atoms is None else check_max_atoms(max_atoms)
        self._conn = None
        self._lock = threading.Lock()
        self.written = 0             # generations remembered by this writer
        self.refused = 0             # generations the set's policy refused (their settings), nothing written
        self.failed = 0              # remember() calls that raised otherwise (logged, never the generation's error)

    def _connection(self):
        if self._conn is None or self._conn.closed:
            import psycopg

            from hartonomous.db.connection import owner_url

            self._conn = psycopg.connect(self.url or owner_url(), autocommit=True)
        return self._conn

    def remember(self, atom_set: str | None, prompt_ids: list[int], token_ids: list[int], path: str,
                 settings: SamplerSettings) -> Remembered:
        """Store one generation (prompt and generated ids, the sampler settings it ran with) in
        `atom_set`'s memory (None: the default set). Raises psycopg's InsufficientPrivilege
        (42501, "not remembered: ...") where the set's policy does not admit the settings."""
        from hartonomous import sqlcalls

        with self._lock:
            conn = self._connection()
            if self.max_atoms is not None:
                sqlcalls.set_memory_bound(conn, atom_set, self.max_atoms)
            if self.policy is not None:
                sqlcalls.set_memory_policy(conn, atom_set, self.policy.arguments())
            row = sqlcalls.remember(conn, atom_set, prompt_ids, token_ids, path, settings.as_dict(),
                                    weight=self.weight)
            self.written += 1
        return Remembered(*row)

    def remember_result(self, atom_set: str | None, result: Any) -> MemoryOutcome:
        """Offer a GenerationResult to the set's memory: Remembered, or NotRemembered with why (its
        path or end, why_not_remembered; or the set's policy, which refused its settings). A failed
        write is logged and counted, not raised: a generation that succeeded stays a success."""
        reason = why_not_remembered(result)
        if reason is not None:
            return NotRemembered(reason)
        try:
            return self.remember(atom_set, result.prompt_ids, result.token_ids, result.path,
                                 SamplerSettings.of(result.config))
        except Exception as exc:                     # noqa: BLE001 - the generation itself succeeded
            refusal = policy_refusal(exc)
            if refusal is not None:
                self.refused += 1
                log.info("a %s generation in atom set %s was not remembered: %s", result.path,
                         atom_set or "(default)", refusal)
                return NotRemembered(refusal)
            self.failed += 1
            log.warning("could not remember a %s generation in atom set %s: %s", result.path,
                        atom_set or "(default)", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            with self._lock:
                if self._conn is not None and not self._conn.closed:
                    self._conn.close()
                self._conn = None
            return NotRemembered(WRITE_FAILED, failed=True)

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
