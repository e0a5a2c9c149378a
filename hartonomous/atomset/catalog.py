"""Reading and managing the atom sets in the database: load, list, drop, set the default.

The only place (besides the SQL functions and `write.py`) that queries `atom_sets`; every
reader goes through `load_atom_set` / `list_atom_sets` and gets typed `AtomSet` records.
"""

from __future__ import annotations

import psycopg
from psycopg import errors as pg_errors
from psycopg.rows import dict_row

from hartonomous.atomset.record import AtomSet, BuildStats
from hartonomous.errors import UserError

_COLUMNS = """
    s.id, s.name, s.model, s.model_key, s.kind, s.vocab_size, s.embedding_dim, s.projection,
    s.projection_params, s.centroid_window, s.centroid_decay, s.kernel, s.bandwidth,
    s.history_weight, s.history_window, s.layout, s.risk_model, s.is_default, s.created_at, s.stats,
    (s.stats->'ingest'->>'atoms')::bigint AS atoms
"""
# Sets built before ingest stats were recorded are counted by a query of their own (Citus refuses a
# correlated subquery on the distributed atoms from a query on the reference table atom_sets).
_COUNT = "SELECT count(*) AS atoms FROM atoms WHERE atom_set_id = %s"
_SELECT = f"SELECT {_COLUMNS} FROM atom_sets s"


def _record(row: dict) -> AtomSet:
    return AtomSet(**{**row, "stats": BuildStats.from_json(row["stats"]), "atoms": int(row["atoms"] or 0),
                      "projection_params": row["projection_params"] or {}})


def _query(conn: psycopg.Connection, sql: str, params: tuple = ()) -> list[dict]:
    try:
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(sql, params).fetchall()
            for row in rows:
                if "atoms" in row and row["atoms"] is None:
                    row["atoms"] = cur.execute(_COUNT, (row["id"],)).fetchone()["atoms"]
            return rows
    except pg_errors.UndefinedTable as exc:
        raise UserError("the database has no hartonomous schema; run `hartonomous migrate`") from exc
    except pg_errors.UndefinedColumn as exc:
        raise UserError("the database schema is older than this version; run `hartonomous migrate`") from exc


def load_atom_set(conn: psycopg.Connection, name: str | None = None) -> AtomSet:
    """The named atom set, or the default one when `name` is None; a UserError that says what to do otherwise."""
    if name is None:
        rows = _query(conn, f"{_SELECT} WHERE s.is_default")
        if not rows:
            raise UserError("there is no atom set yet; build one with `hartonomous build`")
        return _record(rows[0])
    rows = _query(conn, f"{_SELECT} WHERE s.name = %s", (name,))
    if not rows:
        known = ", ".join(atom_set_names(conn)) or "none; build one with `hartonomous build`"
        raise UserError(f"no atom set named '{name}' (known: {known}); list them with `hartonomous atom-sets`")
    return _record(rows[0])


def list_atom_sets(conn: psycopg.Connection) -> list[AtomSet]:
    """Every atom set, the default first, then by name."""
    return [_record(row) for row in _query(conn, f"{_SELECT} ORDER BY s.is_default DESC, s.name")]


def atom_set_names(conn: psycopg.Connection) -> list[str]:
    return [row["name"] for row in _query(conn, "SELECT name FROM atom_sets ORDER BY name")]


def atom_set_exists(conn: psycopg.Connection, name: str) -> bool:
    return bool(_query(conn, "SELECT 1 AS one FROM atom_sets WHERE name = %s", (name,)))


def key_dimensions(conn: psycopg.Connection, atom_set: AtomSet) -> int | None:
    """The dimension of the atoms' full-dimensional keys (pgvector), or None when they have none."""
    row = conn.execute("SELECT vector_dims(key) FROM atoms WHERE atom_set_id = %s AND key IS NOT NULL LIMIT 1",
                       (atom_set.id,)).fetchone()
    return None if row is None else int(row[0])


def _locked_id(conn: psycopg.Connection, name: str) -> int:
    """Inside a transaction: the set's id, its row locked; a UserError when there is no such set."""
    row = conn.execute("SELECT id FROM atom_sets WHERE name = %s FOR UPDATE", (name,)).fetchone()
    if row is None:
        raise UserError(f"no atom set named '{name}'; list them with `hartonomous atom-sets`")
    return int(row[0])


def drop_atom_set(conn: psycopg.Connection, name: str) -> list[str]:
    """Remove an atom set, its partition, tokens and landmarks, and the control sets its build
    recorded (stats.controls, e.g. NAME.random-positions) in the same transaction; commits.
    Returns the names of the controls dropped with it."""
    with conn.transaction():
        set_id = _locked_id(conn, name)
        (controls,) = conn.execute("SELECT stats -> 'controls' FROM atom_sets WHERE id = %s", (set_id,)).fetchone()
        dropped = []
        for control in sorted(set((controls or {}).values()) - {None, name}):
            found = conn.execute("SELECT id FROM atom_sets WHERE name = %s FOR UPDATE", (control,)).fetchone()
            if found is not None:
                delete_atom_set_rows(conn, found[0])
                dropped.append(control)
        delete_atom_set_rows(conn, set_id)
    return dropped


def set_default_atom_set(conn: psycopg.Connection, name: str) -> None:
    """Make `name` the set that `next_token(..., atom_set => NULL)` uses; commits."""
    with conn.transaction():
        mark_default(conn, _locked_id(conn, name))


def partition_name(atom_set_id: int) -> str:
    return f"atoms_{int(atom_set_id)}"


def memory_partition_name(atom_set_id: int) -> str:
    """The set's memory_atoms partition (created by its first `remember()`, sql/070_memory.sql)."""
    return f"memory_atoms_{int(atom_set_id)}"


def tile_partition_name(atom_set_id: int) -> str:
    """The set's atom_tiles partition (sets of the 'tiles' layout have one)."""
    return f"atom_tiles_{int(atom_set_id)}"


def mark_default(conn: psycopg.Connection, set_id: int) -> None:
    """Inside a transaction: `set_id` becomes the one default set."""
    conn.execute("UPDATE atom_sets SET is_default = false WHERE is_default AND id <> %s", (set_id,))
    conn.execute("UPDATE atom_sets SET is_default = true WHERE id = %s", (set_id,))


def delete_atom_set_rows(conn: psycopg.Connection, set_id: int) -> None:
    """Inside a transaction: drop the set's partitions (atoms, tiles, memory) and its row (tokens and
    landmarks cascade)."""
    conn.execute(f"DROP TABLE IF EXISTS {partition_name(set_id)}")
    conn.execute(f"DROP TABLE IF EXISTS {tile_partition_name(set_id)}")
    conn.execute(f"DROP TABLE IF EXISTS {memory_partition_name(set_id)}")
    conn.execute("DELETE FROM atom_sets WHERE id = %s", (set_id,))


def tokenizer_for(atom_set: AtomSet):
    """The tokenizer of the model the set was built from, by the model key recorded at build time
    (read with `tokenizers` alone once cached: hartonomous.model.load_fast_tokenizer)."""
    from pathlib import Path

    from hartonomous.model import SMOLLM2, load_fast_tokenizer

    key = atom_set.model_key
    if key == SMOLLM2:
        return load_fast_tokenizer(SMOLLM2)
    if key and Path(key).expanduser().is_dir():
        return load_fast_tokenizer(key)
    raise UserError(f"atom set '{atom_set.name}' was built from model '{key or atom_set.model}', whose tokenizer "
                    "is not available here; pass a tokenizer (Client(spatial_tokenizer=...)) or rebuild the set")


def model_name_for(atom_set: AtomSet) -> str:
    """The load_model name of the set's model, as recorded at build time: 'smollm2' or a local model folder."""
    from pathlib import Path

    from hartonomous.model import SMOLLM2

    key = atom_set.model_key
    if key == SMOLLM2 or (key and Path(key).expanduser().is_dir()):
        return key
    raise UserError(f"atom set '{atom_set.name}' was built from model '{key or atom_set.model}', which is not "
                    "available here; install it or rebuild the set from 'smollm2' or a local model folder")
