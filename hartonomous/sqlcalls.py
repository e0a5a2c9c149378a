"""Every call of the database's inference functions, written once, with named arguments.

`next_token`, `next_token_batch`, `sample_next_token`, `generate_tokens`, `draft_tokens`, `draft_tree`, `draft_sources`,
`next_token_signals`, `ht_step_logits` (the native kernel's logits + signals), `store_distribution`, `ht_kernel`, `context_centroid`
and the memory's `remember`, `forget`, `set_memory_bound`, `set_memory_policy`, `memory_policy` and `memory_status` are called from here and nowhere else in Python. Arguments are passed by name (`top_k =>
%(top_k)s`), so a new SQL argument at the end of a signature changes this module only. The
sampler's defaults (sampler=None) are the generation config's; the test suite checks that the
SQL functions' own defaults are the same values.

Bad input raises SQLSTATE 22023 in the database; `run` turns it into a `UserError` carrying the
database's message, which names the argument.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import errors as pg_errors

from hartonomous.centroid import validate_history
from hartonomous.errors import UserError
from hartonomous.generation_config import GenerationConfig, SamplerArgs
from hartonomous.signals import StepSignals
from hartonomous.store import StoreStep

MAX_NEIGHBORS_LIMIT = 100_000   # next_token's bound on max_neighbors (sql/020_next_token.sql)


@dataclass(frozen=True)
class SpatialArgs:
    """The spatial path's own `next_token` arguments (everything but the context and the sampler).

    None means the SQL default: no search radius, and the atom set's own history settings.
    """

    search_radius: float | None = None
    max_neighbors: int = 100
    history_weight: float | None = None     # None: the atom set's calibrated weight; 0: no history atoms
    history_window: int | None = None       # None: the atom set's window

    def __post_init__(self) -> None:
        try:
            validate_history(self.history_weight, self.history_window)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if isinstance(self.max_neighbors, bool) or not 1 <= int(self.max_neighbors) <= MAX_NEIGHBORS_LIMIT:
            raise UserError(f"max_neighbors must be between 1 and {MAX_NEIGHBORS_LIMIT}, got {self.max_neighbors}")
        if self.search_radius is not None and not self.search_radius > 0:
            raise UserError(f"search_radius must be > 0 (or left out for no limit), got {self.search_radius}")


@dataclass(frozen=True)
class Query:
    """One SQL statement with its named parameters (EXPLAIN-able: prefix the text)."""

    sql: str
    params: dict


def _named(names: Sequence[str], casts: dict[str, str]) -> str:
    return ", ".join(f"{name} => %({name})s::{casts[name]}" for name in names)


_CASTS = {
    "temperature": "double precision", "top_k": "integer", "top_p": "double precision",
    "search_radius": "double precision", "max_neighbors": "integer", "atom_set": "text",
    "repetition_penalty": "double precision", "seed": "bigint", "step": "integer",
    "stop_tokens": "integer[]", "first_step": "integer", "history_weight": "double precision", "history_window": "integer",
    "memory": "boolean",
}
_KNN_ARGS = ("temperature", "top_k", "top_p", "search_radius", "max_neighbors", "atom_set", "repetition_penalty",
             "history_weight", "history_window")

NEXT_TOKEN_SQL = ("SELECT token_id, probability, cumulative_probability FROM "
                  f"next_token(%(context)s::integer[], {_named((*_KNN_ARGS, 'memory'), _CASTS)})")
NEXT_TOKEN_BATCH_SQL = ("SELECT context_index, token_id, probability, cumulative_probability FROM "
                        f"next_token_batch(%(contexts)s::jsonb, {_named(_KNN_ARGS, _CASTS)})")
SAMPLE_NEXT_TOKEN_SQL = ("SELECT sample_next_token(%(context)s::integer[], "
                         f"{_named((*_KNN_ARGS, 'seed', 'step'), _CASTS)})")
GENERATE_TOKENS_SQL = ("SELECT generate_tokens(%(context)s::integer[], %(max_new_tokens)s::integer, "
                       f"{_named((*_KNN_ARGS, 'seed', 'stop_tokens'), _CASTS)})")
DRAFT_TOKENS_SQL = ("SELECT token_id, token_ids, probabilities FROM draft_tokens(%(context)s::integer[], "
                    f"%(n)s::integer, {_named((*_KNN_ARGS, 'seed', 'first_step', 'stop_tokens', 'memory'), _CASTS)})")
_TREE_ARGS = ("search_radius", "max_neighbors", "atom_set", "repetition_penalty", "stop_tokens", "history_weight",
              "history_window", "memory")
DRAFT_TREE_SQL = ("SELECT branch, token_id FROM draft_tree(%(context)s::integer[], %(depth)s::integer, "
                  f"%(width)s::integer, {_named(_TREE_ARGS, _CASTS)}) ORDER BY branch, step")
_SOURCES_ARGS = ("search_radius", "max_neighbors", "atom_set", "history_weight", "history_window", "memory")
DRAFT_SOURCES_SQL = ("SELECT step, token_id, source FROM draft_sources(%(context)s::integer[], %(tokens)s::integer[], "
                     f"{_named(_SOURCES_ARGS, _CASTS)}) ORDER BY step")
_SETTINGS_CASTS = {"temperature": "double precision", "top_k": "integer", "top_p": "double precision",
                   "repetition_penalty": "double precision", "adaptive": "boolean", "ignore_eos": "boolean"}
REMEMBER_SQL = ("SELECT generation, remembered, evicted, atoms FROM remember(%(atom_set)s::text, %(context)s::integer[], "
                "%(generated)s::integer[], %(path)s::text, max_atoms => %(max_atoms)s::integer, "
                f"weight => %(weight)s::double precision, {_named(tuple(_SETTINGS_CASTS), _SETTINGS_CASTS)})")
_POLICY_CASTS = {"min_temperature": "double precision", "max_temperature": "double precision",
                 "min_top_p": "double precision", "max_top_p": "double precision", "max_top_k": "integer",
                 "allow_repetition_penalty": "boolean", "allow_adaptive": "boolean", "allow_ignore_eos": "boolean"}
SET_MEMORY_POLICY_SQL = f"SELECT set_memory_policy(%(atom_set)s::text, {_named(tuple(_POLICY_CASTS), _POLICY_CASTS)})"
MEMORY_POLICY_SQL = f"SELECT {', '.join(_POLICY_CASTS)}, set_at FROM memory_policy(%(atom_set)s::text)"
FORGET_SQL = "SELECT forget(%(atom_set)s::text)"
SET_MEMORY_BOUND_SQL = "SELECT set_memory_bound(%(atom_set)s::text, %(max_atoms)s::integer)"
MEMORY_STATUS_SQL = "SELECT atoms, generations, oldest, newest FROM memory_status(%(atom_set)s::text)"
_SIGNAL_ARGS = ("search_radius", "max_neighbors", "atom_set", "history_weight", "history_window")
NEXT_TOKEN_SIGNALS_SQL = ("SELECT h, h2, varentropy, r, top_probability, nearest_bandwidths, history_share, "
                          "distinct_tokens, ln_top_nearest_bandwidths, ln_top_stored_votes, ln_top_history_nearest_bandwidths, "
                          "risk, predicted_gap FROM "
                          f"next_token_signals(%(context)s::integer[], {_named(_SIGNAL_ARGS, _CASTS)})")
STEP_LOGITS_SQL = ("SELECT token_ids, logits, h, h2, varentropy, r, top_probability, nearest_bandwidths, "
                   "history_share, distinct_tokens, ln_top_nearest_bandwidths, ln_top_stored_votes, "
                   "ln_top_history_nearest_bandwidths, risk, predicted_gap FROM "
                   f"ht_step_logits(%(context)s::integer[], {_named(_SIGNAL_ARGS, _CASTS)})")
STORE_DISTRIBUTION_SQL = ("SELECT prefix_length, token_ids, probabilities, nearest_bandwidths, rung, matched_mass, "
                          "candidates, top_probability, entropy, stored_share, history_share, memory_share FROM "
                          "store_distribution(%(context)s::integer[], atom_set => %(atom_set)s::text, "
                          "max_neighbors => %(max_neighbors)s::integer, "
                          "history_weight => %(history_weight)s::double precision, "
                          "history_window => %(history_window)s::integer, memory => %(memory)s::boolean, "
                          "positions => %(positions)s::integer)")
KERNEL_SQL = "SELECT ht_kernel()"
CONTEXT_CENTROID_SQL = ("SELECT ST_X(c), ST_Y(c), ST_Z(c) FROM "
                        "context_centroid(%(context)s::integer[], atom_set => %(atom_set)s::text) AS c")


def default_sampler() -> SamplerArgs:
    """The generation config's sampler defaults (the one place they are written)."""
    return GenerationConfig().sampler


def _knn_params(sampler: SamplerArgs | None, spatial: SpatialArgs, atom_set: str | None) -> dict:
    sampler = sampler or default_sampler()
    return {"temperature": sampler.temperature, "top_k": sampler.top_k, "top_p": sampler.top_p,
            "search_radius": spatial.search_radius, "max_neighbors": spatial.max_neighbors,
            "atom_set": atom_set, "repetition_penalty": sampler.repetition_penalty,
            "history_weight": spatial.history_weight, "history_window": spatial.history_window}


def next_token_query(context: Sequence[int], sampler: SamplerArgs | None = None,
                     spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None, memory: bool = False) -> Query:
    """`next_token(context, ...)`: rows (token_id, probability, cumulative_probability); `memory`
    reads the set's memory of past generations too."""
    return Query(NEXT_TOKEN_SQL, {"context": [int(t) for t in context], **_knn_params(sampler, spatial, atom_set),
                                  "memory": bool(memory)})


def next_token_batch_query(contexts: Sequence[Sequence[int]], sampler: SamplerArgs | None = None,
                           spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None) -> Query:
    """`next_token_batch(contexts, ...)`: rows (context_index, token_id, probability, cumulative_probability)."""
    payload = json.dumps([[int(t) for t in ctx] for ctx in contexts])
    return Query(NEXT_TOKEN_BATCH_SQL, {"contexts": payload, **_knn_params(sampler, spatial, atom_set)})


def sample_next_token_query(context: Sequence[int], sampler: SamplerArgs | None = None,
                            spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None,
                            seed: int | None = None, step: int = 0) -> Query:
    """`sample_next_token(context, ..., seed, step)`: one token id."""
    return Query(SAMPLE_NEXT_TOKEN_SQL, {"context": [int(t) for t in context],
                                         **_knn_params(sampler, spatial, atom_set), "seed": seed, "step": step})


def generate_tokens_query(context: Sequence[int], max_new_tokens: int, sampler: SamplerArgs | None = None,
                          spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None,
                          seed: int | None = None, stop_tokens: Sequence[int] | None = None) -> Query:
    """`generate_tokens(context, max_new_tokens, ..., seed, stop_tokens)`: the generated ids."""
    return Query(GENERATE_TOKENS_SQL, {"context": [int(t) for t in context], "max_new_tokens": max_new_tokens,
                                       **_knn_params(sampler, spatial, atom_set), "seed": seed,
                                       "stop_tokens": [int(t) for t in stop_tokens] if stop_tokens else None})


def draft_tokens_query(context: Sequence[int], n: int, sampler: SamplerArgs | None = None,
                       spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None, seed: int | None = None,
                       first_step: int = 0, stop_tokens: Sequence[int] | None = None, memory: bool = False) -> Query:
    """`draft_tokens(context, n, ...)`: rows (token_id, token_ids, probabilities), one per drafted token;
    `memory` drafts from the set's memory of past generations too."""
    return Query(DRAFT_TOKENS_SQL, {"context": [int(t) for t in context], "n": n,
                                    **_knn_params(sampler, spatial, atom_set), "seed": seed, "first_step": first_step,
                                    "stop_tokens": [int(t) for t in stop_tokens] if stop_tokens else None,
                                    "memory": bool(memory)})


def next_token_signals_query(context: Sequence[int], spatial: SpatialArgs = SpatialArgs(),
                             atom_set: str | None = None) -> Query:
    """`next_token_signals(context, ...)`: one row of signals and the predicted risk."""
    params = _knn_params(None, spatial, atom_set)
    return Query(NEXT_TOKEN_SIGNALS_SQL, {"context": [int(t) for t in context],
                                          **{name: params[name] for name in _SIGNAL_ARGS}})


def context_centroid_query(context: Sequence[int], atom_set: str | None = None) -> Query:
    """`context_centroid(context, atom_set)` as (x, y, z)."""
    return Query(CONTEXT_CENTROID_SQL, {"context": [int(t) for t in context], "atom_set": atom_set})


def run(conn: psycopg.Connection, query: Query, *, prepare: bool | None = None) -> psycopg.Cursor:
    """Execute a query; SQLSTATE 22023 (bad input, named in the message) becomes a UserError."""
    try:
        return conn.execute(query.sql, query.params, prepare=prepare)
    except pg_errors.InvalidParameterValue as exc:
        if not conn.autocommit:
            conn.rollback()
        raise UserError(exc.diag.message_primary or str(exc)) from exc


def next_token(conn: psycopg.Connection, context: Sequence[int], sampler: SamplerArgs | None = None,
               spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None,
               prepare: bool | None = True, memory: bool = False) -> list[tuple[int, float]]:
    """(token_id, probability) rows of `next_token`, in its order (probability desc, token id asc)."""
    rows = run(conn, next_token_query(context, sampler, spatial, atom_set, memory), prepare=prepare).fetchall()
    return [(int(r[0]), float(r[1])) for r in rows]


def next_token_batch(conn: psycopg.Connection, contexts: Sequence[Sequence[int]],
                     sampler: SamplerArgs | None = None, spatial: SpatialArgs = SpatialArgs(),
                     atom_set: str | None = None) -> list[list[tuple[int, float]]]:
    """One `next_token` row list per context, in one database call."""
    out: list[list[tuple[int, float]]] = [[] for _ in contexts]
    for index, token, prob, _cum in run(conn, next_token_batch_query(contexts, sampler, spatial, atom_set)):
        out[int(index)].append((int(token), float(prob)))
    return out


def sample_next_token(conn: psycopg.Connection, context: Sequence[int], sampler: SamplerArgs | None = None,
                      spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None,
                      seed: int | None = None, step: int = 0) -> int | None:
    """The token `generate_tokens` would pick at `step` for this context and seed (None: no candidates)."""
    (token,) = run(conn, sample_next_token_query(context, sampler, spatial, atom_set, seed, step)).fetchone()
    return None if token is None else int(token)


def generate_tokens(conn: psycopg.Connection, context: Sequence[int], max_new_tokens: int,
                    sampler: SamplerArgs | None = None, spatial: SpatialArgs = SpatialArgs(),
                    atom_set: str | None = None, seed: int | None = None,
                    stop_tokens: Sequence[int] | None = None) -> list[int]:
    """The whole generation loop in the database: the generated ids (a stop token included)."""
    query = generate_tokens_query(context, max_new_tokens, sampler, spatial, atom_set, seed, stop_tokens)
    (ids,) = run(conn, query).fetchone()
    return [int(t) for t in ids or []]


def draft_tokens(conn: psycopg.Connection, context: Sequence[int], n: int, sampler: SamplerArgs | None = None,
                 spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None, seed: int | None = None,
                 first_step: int = 0, stop_tokens: Sequence[int] | None = None, memory: bool = False
                 ) -> list[tuple[int, list[int], list[float]]]:
    """Up to n drafted tokens, each with the distribution it was drawn from, in one database call."""
    query = draft_tokens_query(context, n, sampler, spatial, atom_set, seed, first_step, stop_tokens, memory)
    rows = run(conn, query, prepare=True).fetchall()
    return [(int(t), [int(i) for i in ids], [float(p) for p in probs]) for t, ids, probs in rows]


def draft_tree(conn: psycopg.Connection, context: Sequence[int], depth: int, width: int,
               sampler: SamplerArgs | None = None, spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None,
               stop_tokens: Sequence[int] | None = None, memory: bool = False) -> list[list[int]]:
    """A tree of greedy drafts in one database call: `width` branches (the most likely first tokens, each
    continued greedily), each up to `depth` tokens, most likely first."""
    params = _knn_params(sampler, spatial, atom_set)
    query = Query(DRAFT_TREE_SQL, {"context": [int(t) for t in context], "depth": depth, "width": width,
                                   **{name: params[name] for name in _TREE_ARGS if name in params},
                                   "stop_tokens": [int(t) for t in stop_tokens] if stop_tokens else None,
                                   "memory": bool(memory)})
    branches: dict[int, list[int]] = {}
    for branch, token in run(conn, query, prepare=True).fetchall():
        branches.setdefault(int(branch), []).append(int(token))
    return [branches[b] for b in sorted(branches)]


def draft_sources(conn: psycopg.Connection, context: Sequence[int], tokens: Sequence[int],
                  spatial: SpatialArgs = SpatialArgs(), atom_set: str | None = None,
                  memory: bool = False) -> list[str | None]:
    """`draft_sources(context, tokens, ...)`: per token, the source of the candidate atom that voted
    for it most (corpus | self-distilled | memory | context; None: no candidate voted for it)."""
    params = {"context": [int(t) for t in context], "tokens": [int(t) for t in tokens],
              "search_radius": spatial.search_radius, "max_neighbors": spatial.max_neighbors, "atom_set": atom_set,
              "history_weight": spatial.history_weight, "history_window": spatial.history_window,
              "memory": bool(memory)}
    return [source for _step, _token, source in run(conn, Query(DRAFT_SOURCES_SQL, params), prepare=True)]


def next_token_signals(conn: psycopg.Connection, context: Sequence[int], spatial: SpatialArgs = SpatialArgs(),
                       atom_set: str | None = None, prepare: bool | None = True) -> StepSignals:
    """The spatial path's signals for this context and the atom set's predicted risk and calibration gap
    (None without a predictor)."""
    return _signals(run(conn, next_token_signals_query(context, spatial, atom_set), prepare=prepare).fetchone())


def _signals(values: Sequence) -> StepSignals:
    return StepSignals(*[None if v is None else (int(v) if i == 7 else float(v)) for i, v in enumerate(values)])


def kernel(conn: psycopg.Connection) -> str:
    """Which next_token implementation this session runs: 'native' or 'plpgsql' (SQL ht_kernel())."""
    return run(conn, Query(KERNEL_SQL, {})).fetchone()[0]


def step_logits(conn: psycopg.Connection, context: Sequence[int], spatial: SpatialArgs = SpatialArgs(),
                atom_set: str | None = None, prepare: bool | None = True
                ) -> tuple[list[int], list[float], StepSignals]:
    """One step's raw token logits (ascending ids; before the sampler) and its signals, in one call
    (SQL ht_step_logits; the native kernel only): what next_token_signals and next_token would
    find twice."""
    params = _knn_params(None, spatial, atom_set)
    row = run(conn, Query(STEP_LOGITS_SQL, {"context": [int(t) for t in context],
                                            **{name: params[name] for name in _SIGNAL_ARGS}}),
              prepare=prepare).fetchone()
    return list(row[0]), list(row[1]), _signals(row[2:])


def context_centroid(conn: psycopg.Connection, context: Sequence[int],
                     atom_set: str | None = None) -> tuple[float, float, float]:
    x, y, z = run(conn, context_centroid_query(context, atom_set)).fetchone()
    return float(x), float(y), float(z)


def remember(conn: psycopg.Connection, atom_set: str | None, context: Sequence[int], generated: Sequence[int],
             path: str, settings: dict, max_atoms: int | None = None,
             weight: float | None = None) -> tuple[int, int, int, int]:
    """`remember(...)` (the owner's connection): (generation, remembered, evicted, atoms now in memory).
    `settings`: the sampler settings the generation ran with (temperature, top_k, top_p,
    repetition_penalty, adaptive, ignore_eos), which the set's memory policy must admit (else
    SQLSTATE 42501, nothing written). The set's bound holds; `max_atoms` may only lower it for this call."""
    row = run(conn, Query(REMEMBER_SQL, {"atom_set": atom_set, "context": [int(t) for t in context],
                                         "generated": [int(t) for t in generated], "path": path,
                                         "max_atoms": max_atoms, "weight": weight,
                                         **{name: settings[name] for name in _SETTINGS_CASTS}})).fetchone()
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


def set_memory_policy(conn: psycopg.Connection, atom_set: str | None, policy: dict) -> int:
    """`set_memory_policy(atom_set, ...)` (the owner's connection): None takes the default policy's
    value; the atoms of generations the new policy refuses, forgotten."""
    params = {"atom_set": atom_set, **{name: policy.get(name) for name in _POLICY_CASTS}}
    return int(run(conn, Query(SET_MEMORY_POLICY_SQL, params)).fetchone()[0])


def memory_policy(conn: psycopg.Connection, atom_set: str | None) -> dict:
    """`memory_policy(atom_set)`: the set's policy by field name (set_at None: the default policy)."""
    row = run(conn, Query(MEMORY_POLICY_SQL, {"atom_set": atom_set})).fetchone()
    return dict(zip((*_POLICY_CASTS, "set_at"), row))


def set_memory_bound(conn: psycopg.Connection, atom_set: str | None, max_atoms: int) -> int:
    """`set_memory_bound(atom_set, max_atoms)` (the owner's connection): the atoms evicted to fit it."""
    return int(run(conn, Query(SET_MEMORY_BOUND_SQL, {"atom_set": atom_set, "max_atoms": max_atoms})).fetchone()[0])


def forget(conn: psycopg.Connection, atom_set: str | None) -> int:
    """`forget(atom_set)` (the owner's connection): the atoms removed from the set's memory."""
    return int(run(conn, Query(FORGET_SQL, {"atom_set": atom_set})).fetchone()[0])


def memory_status(conn: psycopg.Connection, atom_set: str | None) -> tuple:
    """`memory_status(atom_set)`: (atoms, generations, oldest, newest)."""
    return tuple(run(conn, Query(MEMORY_STATUS_SQL, {"atom_set": atom_set})).fetchone())


def store_distribution(conn: psycopg.Connection, context: Sequence[int], *, atom_set: str | None = None,
                       max_neighbors: int = 100, history_weight: float | None = None,
                       history_window: int | None = None, memory: bool = False, positions: int = 1,
                       prepare: bool | None = True) -> list[StoreStep]:
    """The store's own distribution (next_token at T = 1, no top-k/top-p/penalty; ids ascending) and its
    features for the last `positions` prefixes of the context, shortest first, in one call (SQL
    store_distribution)."""
    params = {"context": [int(t) for t in context], "atom_set": atom_set, "max_neighbors": max_neighbors,
              "history_weight": history_weight, "history_window": history_window, "memory": bool(memory),
              "positions": positions}
    rows = run(conn, Query(STORE_DISTRIBUTION_SQL, params), prepare=prepare).fetchall()
    return [StoreStep(int(r[0]), [int(t) for t in r[1]], [float(p) for p in r[2]],
                      *[None if v is None else float(v) for v in r[3:4]],
                      None if r[4] is None else int(r[4]), float(r[5]), int(r[6]),
                      *[None if v is None else float(v) for v in r[7:]]) for r in rows]
