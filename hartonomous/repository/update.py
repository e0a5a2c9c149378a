"""An indexed set updated in place: the files that changed add or subtract their atoms' counts.

A set written by `hartonomous index` keys its atoms exactly as a whole build would (lattice or
projection keys, the set's frozen window and decay, corpus labels, radius-0 merging), from its
training files' chunks alone (hartonomous/repository/chunking.py). So a new file adds its atoms'
counts, a removed one subtracts the counts of the tokens its row recorded, a changed one does
both, and an atom whose count reaches 0 is deleted: the set then holds what a fresh index of the
files would hold with the same parameters. Nothing calibrated is touched (the bandwidth, history
weight and window, risk model and gate stay as fitted); `index --recalibrate` refits them.

`apply_changes` runs inside the caller's transaction, so an update is one transaction: killed at
any point it leaves the previous set answering as before. The atom_sets row is written too (its
stats), which is the version readers' caches of the set key on.
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass

import numpy as np
import psycopg

from hartonomous.atomset.catalog import partition_name
from hartonomous.atomset.pgcopy import fixed_width_payload
from hartonomous.errors import UserError
from hartonomous.repository.chunking import Key, add_counts, file_chunks, merged_file_atoms

FILE_COLUMNS = ("atom_set_id, file_id, path, content_sha256, size_bytes, n_tokens, split, license, license_source, "
                "token_ids, line_starts")


@dataclass(frozen=True)
class FileEntry:
    """A file as an indexed set records it (one atom_set_files row, without its id)."""

    path: str
    sha256: bytes
    size: int
    token_ids: np.ndarray
    line_starts: np.ndarray
    split: str
    license: str | None
    license_source: str


@dataclass(frozen=True)
class SetParams:
    """What keying a file's atoms needs of a set: its token positions, window, decay and chunk length."""

    set_id: int
    name: str
    positions: np.ndarray
    window: int | None
    decay: float
    context_length: int
    route_spread: float | None
    layout: str
    stats: dict


@dataclass(frozen=True)
class StoredFile:
    file_id: int
    path: str
    sha256: bytes
    split: str
    n_tokens: int


@dataclass(frozen=True)
class Applied:
    """What an update did to the atoms."""

    inserted: int
    updated: int
    deleted: int


def read_params(conn: psycopg.Connection, name: str, *, lock: bool = False) -> SetParams:
    """The set's keying parameters and token positions (FOR UPDATE with `lock`)."""
    row = conn.execute("SELECT id, centroid_window, centroid_decay, route_spread, layout, stats, vocab_size "
                       "FROM atom_sets WHERE name = %s" + (" FOR UPDATE" if lock else ""), (name,)).fetchone()
    if row is None:
        raise UserError(f"atom set '{name}' does not exist")
    set_id, window, decay, spread, layout, stats, vocab = row
    positions = np.full((int(vocab), 3), np.nan)
    for token, x, y, z in conn.execute("SELECT token_id, ST_X(position), ST_Y(position), ST_Z(position) FROM tokens "
                                       "WHERE atom_set_id = %s", (set_id,)):
        positions[token] = (x, y, z)
    context_length = int(((stats or {}).get("corpus") or {}).get("context_length") or 512)
    return SetParams(int(set_id), name, positions, window, float(decay), context_length, spread, layout, stats or {})


def stored_files(conn: psycopg.Connection, set_id: int) -> dict[str, StoredFile]:
    """The set's file table without the token arrays, by path."""
    return {path: StoredFile(file_id, path, bytes(sha), split, n)
            for file_id, path, sha, split, n in conn.execute(
                "SELECT file_id, path, content_sha256, split, n_tokens FROM atom_set_files WHERE atom_set_id = %s",
                (set_id,))}


def stored_tokens(conn: psycopg.Connection, set_id: int, file_ids: list[int]) -> dict[int, np.ndarray]:
    """The token ids the set ingested for each of `file_ids`."""
    if not file_ids:
        return {}
    return {file_id: np.asarray(tokens, dtype=np.int64) for file_id, tokens in conn.execute(
        "SELECT file_id, token_ids FROM atom_set_files WHERE atom_set_id = %s AND file_id = ANY(%s)",
        (set_id, file_ids))}


def file_atom_delta(params: SetParams, added: list[np.ndarray], removed: list[np.ndarray]) -> dict[Key, float]:
    """The net change of each atom's count: + the atoms of the `added` token arrays, - the `removed` ones'."""
    delta: dict[Key, float] = {}
    for tokens, sign in [(t, 1.0) for t in added] + [(t, -1.0) for t in removed]:
        atoms = merged_file_atoms(file_chunks(tokens, params.context_length), params.positions, params.window,
                                  params.decay)
        add_counts(delta, atoms, sign)
    return {k: v for k, v in delta.items() if v != 0}


def apply_delta(conn: psycopg.Connection, params: SetParams, delta: dict[Key, float]) -> Applied:
    """Add each count to its atom (matched by token and exact position), delete atoms left at 0 and
    insert the new ones; inside the caller's transaction. A subtraction the set cannot hold (no
    such atom, or below 0) means the set is not what its file table says: refused, nothing kept."""
    if not delta:
        return Applied(0, 0, 0)
    table = partition_name(params.set_id)
    keys = list(delta)
    conn.execute("CREATE TEMP TABLE ht_index_delta (token_id integer, x float8, y float8, z float8, dw float8) "
                 "ON COMMIT DROP")
    columns = [("int4", np.array([k[0] for k in keys])), ("float8", np.array([k[1] for k in keys])),
               ("float8", np.array([k[2] for k in keys])), ("float8", np.array([k[3] for k in keys])),
               ("float8", np.array([delta[k] for k in keys]))]
    with conn.cursor().copy("COPY ht_index_delta FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(fixed_width_payload(columns))
    conn.execute(f"""
        CREATE TEMP TABLE ht_index_match ON COMMIT DROP AS
        SELECT d.token_id, d.x, d.y, d.z, d.dw, a.atom_id, a.weight + d.dw AS w
          FROM ht_index_delta d
          LEFT JOIN LATERAL (
                SELECT a.atom_id, a.weight FROM {table} a
                 WHERE a.position &&& ST_MakePoint(d.x, d.y, d.z) AND a.token_id = d.token_id
                   AND ST_X(a.position) = d.x AND ST_Y(a.position) = d.y AND ST_Z(a.position) = d.z) a ON true""")
    conn.execute("ANALYZE ht_index_match")          # a few rows: the deletes and updates below probe the key
    bad = conn.execute("SELECT count(*) FROM ht_index_match WHERE (atom_id IS NULL AND dw < 0) OR w < 0").fetchone()[0]
    if bad:
        raise UserError(f"atom set '{params.name}' does not hold the atoms its file table records ({bad} atoms "
                        f"short); rebuild it with `hartonomous index DIR --name {params.name} --recalibrate`")
    deleted = conn.execute(f"DELETE FROM {table} a USING ht_index_match m WHERE a.atom_set_id = %s "
                           "AND m.atom_id IS NOT NULL AND a.atom_id = m.atom_id AND m.w = 0", (params.set_id,)).rowcount
    updated = conn.execute(f"UPDATE {table} a SET weight = m.w FROM ht_index_match m WHERE a.atom_set_id = %s "
                           "AND m.atom_id IS NOT NULL AND a.atom_id = m.atom_id AND m.w > 0", (params.set_id,)).rowcount
    (base,) = conn.execute(f"SELECT coalesce(max(atom_id), -1) + 1 FROM {table} WHERE atom_set_id = %s",
                           (params.set_id,)).fetchone()
    route = "ht_route_cell(n.x, n.y, n.z)" if params.route_spread is not None else "n.atom_id"
    inserted = conn.execute(f"""
        INSERT INTO {table} (atom_set_id, atom_id, token_id, position, weight, route)
        SELECT %s, n.atom_id, n.token_id, ST_MakePoint(n.x, n.y, n.z), n.dw, {route}
          FROM (SELECT m.token_id, m.x, m.y, m.z, m.dw, %s + row_number() OVER (ORDER BY m.token_id, m.x, m.y, m.z) - 1 AS atom_id
                  FROM ht_index_match m WHERE m.atom_id IS NULL AND m.dw > 0) n""",
                            (params.set_id, base)).rowcount
    conn.execute("DROP TABLE ht_index_match")
    conn.execute("DROP TABLE ht_index_delta")
    return Applied(inserted, updated, deleted)


def _int_array(values: np.ndarray) -> bytes:
    """A PostgreSQL binary int4[] (one dimension, lower bound 1; empty: no dimensions)."""
    values = np.asarray(values, dtype=">i4")
    if len(values) == 0:
        return struct.pack(">iii", 0, 0, 23)
    body = np.empty(len(values), dtype=[("len", ">i4"), ("v", ">i4")])
    body["len"], body["v"] = 4, values
    return struct.pack(">iiiii", 1, 0, 23, len(values), 1) + body.tobytes()


def insert_files(conn: psycopg.Connection, set_id: int, entries: list[FileEntry], first_id: int) -> None:
    """Write file rows with ids first_id, first_id + 1, ... (binary COPY: the token arrays are the bulk)."""
    if not entries:
        return
    from hartonomous.atomset.pgcopy import HEADER, TRAILER

    with conn.cursor().copy(f"COPY atom_set_files ({FILE_COLUMNS}) FROM STDIN (FORMAT BINARY)") as copy:
        buf = bytearray(HEADER)
        for i, e in enumerate(entries):
            fields = [struct.pack(">i", set_id), struct.pack(">i", first_id + i), e.path.encode("utf-8"), e.sha256,
                      struct.pack(">q", e.size), struct.pack(">i", len(e.token_ids)), e.split.encode(),
                      None if e.license is None else e.license.encode("utf-8"), e.license_source.encode(),
                      _int_array(e.token_ids), _int_array(e.line_starts)]
            buf += struct.pack(">h", len(fields))
            for f in fields:
                buf += struct.pack(">i", -1) if f is None else struct.pack(">i", len(f)) + f
            if len(buf) > 8 << 20:
                copy.write(bytes(buf))
                buf.clear()
        buf += TRAILER
        copy.write(bytes(buf))


def next_file_id(conn: psycopg.Connection, params: SetParams) -> int:
    """File ids are never reused within a set: the next one after every id the set ever gave."""
    given = int((params.stats.get("repository") or {}).get("next_file_id") or 0)
    (top,) = conn.execute("SELECT coalesce(max(file_id), -1) + 1 FROM atom_set_files WHERE atom_set_id = %s",
                          (params.set_id,)).fetchone()
    return max(given, int(top))


def delete_files(conn: psycopg.Connection, set_id: int, file_ids: list[int]) -> None:
    if file_ids:
        conn.execute("DELETE FROM atom_set_files WHERE atom_set_id = %s AND file_id = ANY(%s)", (set_id, file_ids))


def record(conn: psycopg.Connection, set_id: int, section: dict, atoms_change: int) -> None:
    """Merge `section` into stats.repository and move the atom counts (stats.atoms.count and
    stats.ingest.atoms, what `hartonomous atom-sets` shows) by `atoms_change`: a new row version of
    the set, which readers' caches key on."""
    conn.execute("""UPDATE atom_sets SET stats = jsonb_set(jsonb_set(
                        stats || jsonb_build_object('repository', coalesce(stats->'repository', '{}'::jsonb) || %s::jsonb),
                        '{atoms,count}', to_jsonb(coalesce((stats#>>'{atoms,count}')::bigint, 0) + %s), true),
                        '{ingest,atoms}', to_jsonb(coalesce((stats#>>'{ingest,atoms}')::bigint, 0) + %s), true)
                     WHERE id = %s""", (json.dumps(section), atoms_change, atoms_change, set_id))


def write_fresh(conn: psycopg.Connection, like: str, name: str, root: str, entries: list[FileEntry]) -> int:
    """A new set `name` indexing `entries` from scratch with set `like`'s frozen parameters (its
    token positions, keys, kernel, bandwidth, history, risk model and gate): every training file's
    chunks keyed and merged at once, as the first index does, written by the build's own writer
    (hartonomous/atomset/write.py). What an updated set must equal; returns the new set's id."""
    from hartonomous.atomset import AtomSetSpec, TokenRows, load_atom_set, write_atom_set
    from hartonomous.atomset.context import context_atoms, merge_atoms
    from hartonomous.augment.gates import load_gate, save_gate

    info = load_atom_set(conn, like)
    params = read_params(conn, like)
    texts = dict(conn.execute("SELECT token_id, text FROM tokens WHERE atom_set_id = %s", (params.set_id,)).fetchall())
    conn.rollback()
    chunks = [c for e in entries if e.split == "train" for c in file_chunks(e.token_ids, params.context_length)]
    atoms = merge_atoms(context_atoms(chunks, None, params.positions, params.window, params.decay, "corpus"), 0.0)
    vocab = len(params.positions)
    tokens = TokenRows(np.arange(vocab), [texts.get(i) for i in range(vocab)], params.positions)
    spec = AtomSetSpec(name, info.model, info.vocab_size, info.embedding_dim, info.projection, info.kind,
                       info.projection_params, info.centroid_window, info.centroid_decay, info.kernel, info.bandwidth,
                       info.stats, False, model_key=info.model_key, history_weight=info.history_weight,
                       history_window=info.history_window, layout="rows",
                       risk_model=None if info.risk_model is None else info.risk_model.model_dump(mode="json"))
    report = write_atom_set(conn, spec, tokens, atoms, None)
    with conn.transaction():
        t0 = time.perf_counter()
        insert_files(conn, report.atom_set_id, entries, 0)
        repo = {**(info.stats.model_dump().get("repository") or {}), "root": root, "next_file_id": len(entries),
                "updates": 0, "calibration_changed_tokens": 0, "train_changed_tokens": 0, "frozen_from": like,
                "file_table_seconds": round(time.perf_counter() - t0, 3)}
        conn.execute("UPDATE atom_sets SET root = %s, stats = stats || jsonb_build_object('repository', %s::jsonb) "
                     "WHERE id = %s", (root, json.dumps(repo, default=str), report.atom_set_id))
        try:
            save_gate(conn, name, load_gate(conn, like))
        except UserError:
            pass                                  # `like` has no gate: neither has the copy
    return report.atom_set_id
