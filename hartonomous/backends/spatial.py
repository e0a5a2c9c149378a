"""The spatial backend: SQL `next_token` per step on one connection.

Per step, `next_token` runs as a prepared statement (psycopg `prepare=True`) and returns the
distribution after the shared sampler; the engine picks the token with
`seeded_uniform(seed, step)`, exactly as the database's `generate_tokens` does, so the two modes
give the same ids for the same seed. next_token takes ids, not a centroid, so the context sent
each step is cut to the atom set's centroid window when no repetition penalty needs the rest:
the work per step then stays constant as the text grows, with identical results.
The whole loop in one `generate_tokens` call is `hartonomous.backends.in_database.InDatabaseBackend`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import errors as pg_errors

from hartonomous.backends.base import Distribution, SamplerArgs
from hartonomous.errors import UserError

NEXT_TOKEN_SQL = (
    "SELECT token_id, probability FROM next_token(%s::integer[], %s::double precision, %s::integer, "
    "%s::double precision, %s::double precision, %s::integer, %s::text, %s::double precision)"
)
GENERATE_TOKENS_SQL = (
    "SELECT generate_tokens(%s::integer[], %s::integer, %s::double precision, %s::integer, "
    "%s::double precision, %s::double precision, %s::integer, %s::text, %s::double precision, "
    "%s::bigint, %s::integer[])"
)


@dataclass(frozen=True)
class AtomSetInfo:
    name: str
    model: str
    vocab_size: int
    centroid_window: int | None = None


@dataclass
class SpatialState:
    ids: list[int]


def find_atom_set(conn: psycopg.Connection, name: str | None) -> AtomSetInfo:
    """The named atom set, or the default one; a UserError that says what to do otherwise."""
    try:
        if name is None:
            row = conn.execute("SELECT name, model, vocab_size, centroid_window FROM atom_sets WHERE is_default").fetchone()
        else:
            row = conn.execute("SELECT name, model, vocab_size, centroid_window FROM atom_sets WHERE name = %s", (name,)).fetchone()
    except pg_errors.UndefinedTable as exc:
        raise UserError("the database has no hartonomous schema; run `hartonomous migrate`") from exc
    if row is None and name is None:
        raise UserError("there is no atom set yet; build one with `hartonomous build`")
    if row is None:
        raise UserError(f"no atom set named '{name}'; list them with `hartonomous atom-sets`")
    return AtomSetInfo(row[0], row[1], int(row[2]), row[3])


def tokenizer_for(info: AtomSetInfo):
    """The tokenizer of the model an atom set was built from ('smollm2' or a local model folder)."""
    from hartonomous.model import SMOLLM2, load_tokenizer

    model = info.model
    if model.lower() in (SMOLLM2, "smollm2-135m-instruct") or "smollm2" in model.lower():
        return load_tokenizer(SMOLLM2)
    if Path(model).expanduser().is_dir():
        return load_tokenizer(model)
    raise UserError(f"atom set '{info.name}' was built from model '{model}', whose tokenizer is not "
                    "available here; pass a tokenizer (Client(spatial_tokenizer=...)) or rebuild the set")


class SpatialBackend:
    """Next-token distributions from PostGIS; one connection, prepared statements."""

    name = "spatial"

    def __init__(self, conn: psycopg.Connection, atom_set: str | None = None, *, tokenizer=None,
                 search_radius: float | None = None, max_neighbors: int = 100,
                 owns_connection: bool = False):
        if not (1 <= int(max_neighbors) <= 100_000):
            raise UserError(f"max_neighbors must be between 1 and 100000, got {max_neighbors}")
        if search_radius is not None and not search_radius > 0:
            raise UserError(f"search_radius must be > 0 (or left out for no limit), got {search_radius}")
        self.conn = conn
        self.owns_connection = owns_connection
        self.atom_set = find_atom_set(conn, atom_set)
        self.tokenizer = tokenizer if tokenizer is not None else tokenizer_for(self.atom_set)
        self.search_radius = search_radius
        self.max_neighbors = int(max_neighbors)

    @classmethod
    def connect(cls, url: str, atom_set: str | None = None, **kwargs) -> "SpatialBackend":
        from hartonomous.db.connection import connect

        conn = connect(url, autocommit=True)
        try:
            return cls(conn, atom_set, owns_connection=True, **kwargs)
        except BaseException:
            conn.close()
            raise

    @property
    def atom_set_name(self) -> str:
        """The name of the atom set this backend reads."""
        return self.atom_set.name

    def eos_token_ids(self) -> set[int]:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        return set() if eos is None else {int(eos)}

    def start(self, prompt_ids: list[int]) -> SpatialState:
        if not prompt_ids:
            raise UserError("the prompt is empty; give at least one token of text")
        return SpatialState([int(i) for i in prompt_ids])

    def distribution(self, state: SpatialState, sampler: SamplerArgs) -> Distribution:
        rows = self._execute(NEXT_TOKEN_SQL, (self._context(state, sampler), *self._sampler_params(sampler)),
                             prepare=True).fetchall()
        return Distribution([int(r[0]) for r in rows], [float(r[1]) for r in rows])

    def advance(self, state: SpatialState, token_id: int) -> None:
        state.ids.append(int(token_id))

    def close(self) -> None:
        if self.owns_connection:
            self.conn.close()

    # -- helpers -------------------------------------------------------------------------

    def _context(self, state: SpatialState, sampler: SamplerArgs) -> list[int]:
        """The ids next_token needs: only the centroid's window when no repetition penalty reads the rest."""
        window = self.atom_set.centroid_window
        if window and sampler.repetition_penalty == 1 and len(state.ids) > window:
            return state.ids[-window:]
        return state.ids

    def _sampler_params(self, s: SamplerArgs) -> tuple:
        return (s.temperature, s.top_k, s.top_p, self.search_radius, self.max_neighbors, self.atom_set.name,
                s.repetition_penalty)

    def _execute(self, sql: str, params: tuple, prepare: bool | None = None) -> psycopg.Cursor:
        try:
            return self.conn.execute(sql, params, prepare=prepare)
        except pg_errors.InvalidParameterValue as exc:   # SQLSTATE 22023: bad input, named in the message
            if not self.conn.autocommit:
                self.conn.rollback()
            raise UserError(exc.diag.message_primary or str(exc)) from exc
