"""Write one atom set atomically: binary COPY (Hilbert order), GiST nd index, optional CLUSTER, ANALYZE, attach.

Everything happens in one transaction. The atoms go into a standalone table that is attached
as the set's partition only at the end, so readers of other sets are never blocked and an
interrupted build (Ctrl-C, a killed process) leaves nothing visible behind.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import numpy as np
import psycopg

from hartonomous.atomset.catalog import delete_atom_set_rows, mark_default, partition_name, tile_partition_name
from hartonomous.atomset.routing import atom_routes, route_spread
from hartonomous.db.citus import begin_build, distribute_partition
from hartonomous.atomset.record import BuildStats, IngestStats
from hartonomous.errors import UserError
from hartonomous.atomset.hilbert import hilbert_order
from hartonomous.atomset.index_progress import heap_blocks, watch_index_build
from hartonomous.atomset.pgcopy import HEADER, TRAILER, ewkb_pointz, fixed_width_payload, vector_bytes

COPY_CHUNK_ROWS = 200_000
MAINTENANCE_WORK_MEM = "256MB"  # per build, for the GiST/PK index builds (SET LOCAL)
# How atoms are laid out for the KNN (docs/benchmarks.md has the measurements): rows are COPYed
# along a 3-D Hilbert curve and the GiST nd index is built over them with the buffering build
# and half-full pages. At 10^6 uniform atoms a KNN-100 then evaluates ~2,500 index entries
# (Morton order, default build: ~5,300; random order: ~15,000) and runs ~2x faster than with
# the Morton/default layout, for an index ~1.8x larger. CLUSTER is not used: it rewrites the
# heap in the GiST's scan order, which is not spatially coherent, and made the KNN 2-4x slower.
GIST_OPTIONS = "buffering = on, fillfactor = 50"
INDEX_LAYOUT = f"Hilbert COPY order, GiST nd WITH ({GIST_OPTIONS}), no CLUSTER"
# Storage layouts for next_token's KNN (atom_sets.layout; sql/015_knn.sql reads them). 'tiles'
# writes the rows too (other readers use them: keys, the compare claims) and packs the atoms,
# in the same Hilbert order, into tiles of TILE_ATOMS atoms: one row (and one page) per tile.
LAYOUTS = ("rows", "tiles")
DEFAULT_LAYOUT = "rows"
TILE_ATOMS = 32
MAX_TILE_ATOMS = 128  # a tile row is ~60 bytes per atom, stored PLAIN: at most one 8 KiB page
TOKEN_BLOCK = 256  # token positions per token_blocks row (sql/010_context_centroid.sql ht_token_positions)

# A progress bar: bar(description, total, unit) opens one and yields its advance(n) (projection.progress).
Bar = Callable[[str, int, str], AbstractContextManager[Callable[[int], None]]]


def _no_bar(_description: str, _total: int, _unit: str) -> AbstractContextManager[Callable[[int], None]]:
    return nullcontext(lambda _n=1: None)


@dataclass
class AtomSetSpec:
    """The atom_sets row of a build (`AtomSet` is the same row read back, with id and counts)."""

    name: str
    model: str
    vocab_size: int
    embedding_dim: int
    projection: str
    kind: str
    projection_params: dict = field(default_factory=dict)
    centroid_window: int | None = None
    centroid_decay: float = 1.0
    kernel: str = "gaussian"
    bandwidth: float = 1.0
    stats: BuildStats = field(default_factory=BuildStats)
    make_default: bool = False
    model_key: str | None = None
    history_weight: float = 0.0
    history_window: int = 512
    layout: str = DEFAULT_LAYOUT
    tile_atoms: int = TILE_ATOMS
    risk_model: dict | None = None      # hartonomous.risk.RiskModel as JSON (atom_sets.risk_model)


@dataclass
class TokenRows:
    """Every vocabulary token: id, decoded text, 3D position, optional full embedding."""

    token_ids: np.ndarray
    texts: list[str | None]
    positions: np.ndarray
    embeddings: np.ndarray | None = None


# Where an atom came from, by the code stored in atoms.source (migration 0012): the index here.
# SQL names them with ht_atom_source (sql/080_draft_sources.sql; tests/test_draft_sources.py checks
# the two agree). Memory atoms and history atoms are not stored atoms: 'memory' and 'context'.
ATOM_SOURCES = ("corpus", "self-distilled")
CORPUS, SELF_DISTILLED = 0, 1


@dataclass
class AtomRows:
    """The atoms: which token each votes for, where, with what weight, optional full-dim key, and
    where each came from (`sources`: ATOM_SOURCES codes; None: every atom from the corpus)."""

    token_ids: np.ndarray
    positions: np.ndarray
    weights: np.ndarray | None = None
    keys: np.ndarray | None = None
    sources: np.ndarray | None = None


@dataclass
class LandmarkRows:
    embeddings: np.ndarray
    positions: np.ndarray | None = None


@dataclass
class IngestReport:
    atom_set_id: int
    atoms: int
    copy_seconds: float
    index_seconds: float
    cluster_seconds: float
    total_seconds: float
    disk_bytes: int = 0     # the atoms partition with its indexes (this server's part of it on Citus)

    @property
    def atoms_per_second(self) -> float:
        return self.atoms / self.total_seconds if self.total_seconds > 0 else float("inf")

    def stats(self) -> IngestStats:
        """Timings for atom_sets.stats.ingest (the commit itself is not included)."""
        return IngestStats(atoms=self.atoms, copy_seconds=self.copy_seconds, index_seconds=self.index_seconds,
                           cluster_seconds=self.cluster_seconds, total_seconds=self.total_seconds,
                           atoms_per_second=self.atoms_per_second, layout=INDEX_LAYOUT, disk_bytes=self.disk_bytes,
                           bytes_per_million_atoms=self.disk_bytes / self.atoms * 1e6 if self.atoms else None)

    def as_dict(self) -> dict:
        return self.stats().model_dump(mode="json")


def write_atom_set(
    conn: psycopg.Connection,
    spec: AtomSetSpec,
    tokens: TokenRows,
    atoms: AtomRows,
    landmarks: LandmarkRows | None = None,
    *,
    replace: bool = False,
    cluster: bool = False,
    progress: Callable[[str], None] | None = None,
    bar: Bar | None = None,
) -> IngestReport:
    """Insert the whole atom set in one transaction and return timings; commits on success.
    `progress` hears each step; `bar` opens a progress bar for the COPY (atoms sent) and one for
    the GiST build (heap blocks scanned, followed from a second connection)."""
    say = progress or (lambda _msg: None)
    bar = bar or _no_bar
    _validate(spec, tokens, atoms)
    start = time.perf_counter()
    with conn.transaction():
        citus = begin_build(conn)
        if citus and spec.layout == "tiles":
            raise UserError("the tiles layout is single-node (its KNN cannot run on Citus shards); "
                            "build with --layout rows on a Citus cluster")
        existing = conn.execute("SELECT id FROM atom_sets WHERE name = %s FOR UPDATE",
                                (spec.name,)).fetchone()
        if existing and not replace:
            raise UserError(f"atom set '{spec.name}' already exists; drop it with "
                            f"`hartonomous atom-sets drop {spec.name}` or pass --replace")
        was_default = False
        if existing:
            was_default = bool(conn.execute("SELECT is_default FROM atom_sets WHERE id = %s",
                                            existing).fetchone()[0])
            delete_atom_set_rows(conn, existing[0])
        # Routing keys (migration 0018); a database at an earlier revision has none to write.
        routed_schema = conn.execute("SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'atoms'::regclass "
                                     "AND attname = 'route' AND NOT attisdropped)").fetchone()[0]
        spread = route_spread(tokens.positions, spec.centroid_decay, spec.centroid_window) if routed_schema else None
        routes = atom_routes(atoms.positions, spread)
        set_id = _insert_atom_set(conn, spec, None if routes is None else spread, routed_schema)
        say(f"tokens: {len(tokens.token_ids)}")
        _copy_tokens(conn, set_id, tokens)
        _write_token_blocks(conn, set_id, tokens)
        if landmarks is not None:
            _copy_landmarks(conn, set_id, landmarks)
        table = partition_name(set_id)
        conn.execute(f"CREATE TABLE {table} (LIKE atoms INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_set CHECK (atom_set_id = {set_id})")
        distributed = distribute_partition(conn, table)  # Citus: shards first, then COPY routes rows
        t0 = time.perf_counter()
        say(f"COPY {len(atoms.token_ids)} atoms (binary, Hilbert order)")
        with bar("COPY atoms", len(atoms.token_ids), "atom") as copied:
            _copy_atoms(conn, table, set_id, atoms, routes, routed_schema, freeze=not distributed, copied=copied)
        t1 = time.perf_counter()
        say("building the GiST nd index")
        conn.execute(f"SET LOCAL maintenance_work_mem = '{MAINTENANCE_WORK_MEM}'")
        blocks = heap_blocks(conn, table)  # 0 on a Citus coordinator: the shards build their own
        with bar("GiST nd index (heap scan)", blocks, "block") as scanned, \
                watch_index_build(conn, blocks, scanned) if blocks else nullcontext():
            conn.execute(f"CREATE INDEX {table}_position_idx ON {table} USING gist (position gist_geometry_ops_nd) "
                         f"WITH ({GIST_OPTIONS})")
        t2 = time.perf_counter()
        if cluster:
            say("CLUSTER on the GiST index")
            conn.execute(f"CLUSTER {table} USING {table}_position_idx")
        # The primary key comes after CLUSTER, which would otherwise rebuild it a second time.
        (primary_key,) = conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                                      "WHERE conrelid = 'atoms'::regclass AND contype = 'p'").fetchone()
        conn.execute(f"ALTER TABLE {table} ADD {primary_key}")  # the parent's (with route on Citus)
        conn.execute(f"ANALYZE {table}")
        t3 = time.perf_counter()
        conn.execute(f"ALTER TABLE atoms ATTACH PARTITION {table} FOR VALUES IN ({set_id})")
        if spec.layout == "tiles":
            say(f"packing the atoms into tiles of {spec.tile_atoms}")
            _write_tiles(conn, set_id, table, spec.tile_atoms)
        conn.execute(f"ANALYZE tokens")
        has_default = conn.execute("SELECT 1 FROM atom_sets WHERE is_default").fetchone()
        if spec.make_default or was_default or not has_default:
            mark_default(conn, set_id)
        (disk,) = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
        report = IngestReport(set_id, len(atoms.token_ids), t1 - t0, t2 - t1, t3 - t2, time.perf_counter() - start,
                              int(disk))
        conn.execute("UPDATE atom_sets SET stats = stats || %s::jsonb WHERE id = %s",
                     (json.dumps({"ingest": report.as_dict()}), set_id))
    return report


def check_layout(layout: str, tile_atoms: int = TILE_ATOMS) -> None:
    """A UserError unless `layout` is a storage layout and `tile_atoms` fits a tile in a page."""
    if layout not in LAYOUTS:
        raise UserError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    if not 1 <= tile_atoms <= MAX_TILE_ATOMS:
        raise UserError(f"tile_atoms must be between 1 and {MAX_TILE_ATOMS}, got {tile_atoms}")


def _write_tiles(conn: psycopg.Connection, set_id: int, atoms_table: str, tile_atoms: int) -> None:
    """Pack the set's atoms into its atom_tiles partition, `tile_atoms` consecutive atoms of the
    Hilbert order per tile. The atoms partition was created and filled by one COPY in Hilbert
    order in this transaction, so its physical (ctid) order is that order."""
    table = tile_partition_name(set_id)
    conn.execute(f"CREATE TABLE {table} (LIKE atom_tiles INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
                 f"INCLUDING STORAGE)")
    conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT {table}_set CHECK (atom_set_id = {set_id})")
    conn.execute(f"""
        INSERT INTO {table} (atom_set_id, tile_id, atoms, xs, ys, zs, token_ids, weights)
        SELECT {set_id}, q.r / {tile_atoms}, ST_Collect(q.position ORDER BY q.r),
               array_agg(ST_X(q.position) ORDER BY q.r), array_agg(ST_Y(q.position) ORDER BY q.r),
               array_agg(ST_Z(q.position) ORDER BY q.r), array_agg(q.token_id ORDER BY q.r),
               array_agg(q.weight ORDER BY q.r)
          FROM (SELECT a.position, a.token_id, a.weight, row_number() OVER (ORDER BY a.ctid) - 1 AS r
                  FROM {atoms_table} a) q
         GROUP BY q.r / {tile_atoms}
         ORDER BY 2""")
    conn.execute(f"CREATE INDEX {table}_atoms_idx ON {table} USING gist (atoms gist_geometry_ops_nd)")
    conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY (atom_set_id, tile_id)")
    conn.execute(f"ANALYZE {table}")
    conn.execute(f"ALTER TABLE atom_tiles ATTACH PARTITION {table} FOR VALUES IN ({set_id})")


def _validate(spec: AtomSetSpec, tokens: TokenRows, atoms: AtomRows) -> None:
    check_layout(spec.layout, spec.tile_atoms)
    if not (spec.history_weight >= 0 and np.isfinite(spec.history_weight)):
        raise UserError(f"history_weight must be a finite number >= 0, got {spec.history_weight}")
    if spec.history_window < 0:
        raise UserError(f"history_window must be >= 0, got {spec.history_window}")
    if spec.kind not in ("token", "context"):
        raise UserError(f"kind must be 'token' or 'context', got {spec.kind!r}")
    if len(atoms.token_ids) == 0:
        raise UserError("an atom set needs at least one atom")
    known = set(np.asarray(tokens.token_ids).tolist())
    unknown = set(np.unique(atoms.token_ids).tolist()) - known
    if unknown:
        raise UserError(f"{len(unknown)} atom token ids are not in the token table (e.g. {min(unknown)})")
    if atoms.weights is not None and not np.all(np.asarray(atoms.weights) > 0):
        raise UserError("atom weights must be > 0")
    if atoms.sources is not None and (len(atoms.sources) != len(atoms.token_ids)
                                      or not np.isin(atoms.sources, np.arange(len(ATOM_SOURCES))).all()):
        raise UserError(f"atom sources must be one code per atom, each one of {dict(enumerate(ATOM_SOURCES))}")
    for arr, what in ((tokens.positions, "token positions"), (atoms.positions, "atom positions")):
        if np.asarray(arr).ndim != 2 or np.asarray(arr).shape[1] != 3 or not np.all(np.isfinite(arr)):
            raise UserError(f"{what} must be finite (n, 3) arrays")


def _insert_atom_set(conn: psycopg.Connection, spec: AtomSetSpec, route_spread: float | None,
                     routed_schema: bool = True) -> int:
    (set_id,) = conn.execute(
        f"""INSERT INTO atom_sets (name, model, model_key, vocab_size, embedding_dim, projection, projection_params,
                                   kind, centroid_window, centroid_decay, kernel, bandwidth, history_weight,
                                   history_window, layout, stats, risk_model{", route_spread" if routed_schema else ""})
            VALUES (%s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s::jsonb
                    {", %s" if routed_schema else ""})
            RETURNING id""",
        (spec.name, spec.model, spec.model_key, spec.vocab_size, spec.embedding_dim, spec.projection,
         json.dumps(spec.projection_params), spec.kind, spec.centroid_window, spec.centroid_decay,
         spec.kernel, spec.bandwidth, spec.history_weight, spec.history_window, spec.layout,
         json.dumps(_stats_json(spec.stats)), None if spec.risk_model is None else json.dumps(spec.risk_model),
         *((route_spread,) if routed_schema else ())),
    ).fetchone()
    return int(set_id)


def _copy_tokens(conn: psycopg.Connection, set_id: int, tokens: TokenRows) -> None:
    cols = "atom_set_id, token_id, text, position" + (", embedding" if tokens.embeddings is not None else "")
    with conn.cursor().copy(f"COPY tokens ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
        buf = bytearray(HEADER)
        nfields = 5 if tokens.embeddings is not None else 4
        for i, token_id in enumerate(np.asarray(tokens.token_ids).tolist()):
            buf += struct.pack(">hii", nfields, 4, set_id) + struct.pack(">ii", 4, token_id)
            text = tokens.texts[i]
            if text is None:
                buf += struct.pack(">i", -1)
            else:
                raw = text.replace("\x00", "\ufffd").encode("utf-8", "surrogatepass")
                buf += struct.pack(">i", len(raw)) + raw
            point = ewkb_pointz(*map(float, tokens.positions[i]))
            buf += struct.pack(">i", len(point)) + point
            if tokens.embeddings is not None:
                vec = vector_bytes(tokens.embeddings[i])
                buf += struct.pack(">i", len(vec)) + vec
            if len(buf) > 8 << 20:
                copy.write(bytes(buf))
                buf.clear()
        buf += TRAILER
        copy.write(bytes(buf))


def _write_token_blocks(conn: psycopg.Connection, set_id: int, tokens: TokenRows) -> None:
    """The token positions again, TOKEN_BLOCK consecutive ids per row, NaN where there is no token."""
    ids = np.asarray(tokens.token_ids, dtype=np.int64)
    positions = np.asarray(tokens.positions, dtype=np.float64)
    if len(ids) == 0 or ids.min() < 0:
        return  # negative ids never come from a tokenizer; such sets read the tokens table only
    grid = np.full((int(ids.max()) // TOKEN_BLOCK + 1) * TOKEN_BLOCK * 3, np.nan).reshape(-1, 3)
    grid[ids] = positions
    blocks = grid.reshape(-1, TOKEN_BLOCK, 3)
    rows = [(set_id, b, *(block[:, axis].tolist() for axis in range(3)))
            for b, block in enumerate(blocks) if not np.isnan(block[:, 0]).all()]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO token_blocks (atom_set_id, block, xs, ys, zs) VALUES (%s, %s, %s, %s, %s)", rows)


def _copy_landmarks(conn: psycopg.Connection, set_id: int, landmarks: LandmarkRows) -> None:
    n = len(landmarks.embeddings)
    columns = [("int4", np.full(n, set_id)), ("int4", np.arange(n)),
               ("vector", np.asarray(landmarks.embeddings, dtype=np.float32))]
    names = "atom_set_id, landmark_id, embedding"
    if landmarks.positions is not None:
        columns.append(("pointz", np.asarray(landmarks.positions, dtype=np.float64)))
        names += ", position"
    with conn.cursor().copy(f"COPY landmarks ({names}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.write(fixed_width_payload(columns))


def _copy_atoms(conn: psycopg.Connection, table: str, set_id: int, atoms: AtomRows, routes: np.ndarray | None,
                routed_schema: bool, freeze: bool, copied: Callable[[int], None]) -> None:
    """COPY the atoms in Hilbert order; `route` (where the schema has it) is the cell code on a set
    that routes, else the atom's id (hartonomous/atomset/routing.py)."""
    positions = np.asarray(atoms.positions, dtype=np.float64)
    order = hilbert_order(positions)
    n = len(order)
    weights = np.ones(n) if atoms.weights is None else np.asarray(atoms.weights, dtype=np.float64)
    names = ("atom_set_id, atom_id, token_id, position, weight" + (", route" if routed_schema else "")
             + (", key" if atoms.keys is not None else "")
             + (", source" if atoms.sources is not None else ""))
    # FREEZE: the table was created in this transaction, so the rows can be written frozen and
    # all-visible; the first queries then do not dirty every page to set hint bits, and the
    # autovacuum that follows a large insert has nothing to rewrite. (Not for Citus shards: the
    # coordinator's COPY reaches them over other connections.)
    options = "FORMAT BINARY, FREEZE" if freeze else "FORMAT BINARY"
    with conn.cursor().copy(f"COPY {table} ({names}) FROM STDIN ({options})") as copy:
        for lo in range(0, n, COPY_CHUNK_ROWS):
            idx = order[lo:lo + COPY_CHUNK_ROWS]
            columns = [("int4", np.full(len(idx), set_id)), ("int8", idx),
                       ("int4", np.asarray(atoms.token_ids)[idx]), ("pointz", positions[idx]),
                       ("float8", weights[idx])]
            if routed_schema:
                columns.append(("int8", idx if routes is None else routes[idx]))
            if atoms.keys is not None:
                columns.append(("vector", np.asarray(atoms.keys, dtype=np.float32)[idx]))
            if atoms.sources is not None:
                columns.append(("int2", np.asarray(atoms.sources)[idx]))
            copy.write(fixed_width_payload(columns, header=lo == 0, trailer=lo + COPY_CHUNK_ROWS >= n))
            copied(len(idx))


def _stats_json(stats: BuildStats | dict) -> dict:
    """Stats pass through the type even when a caller hands a dict (unknown keys are kept)."""
    return (stats if isinstance(stats, BuildStats) else BuildStats.from_json(stats)).to_json()
