"""SQLAlchemy 2 models mirroring the schema that the Alembic migrations create."""

from __future__ import annotations

from datetime import datetime

from geoalchemy2 import Geometry
from pgvector.sqlalchemy import Vector
from sqlalchemy import (
    BigInteger, Boolean, CheckConstraint, DateTime, Double, ForeignKey, ForeignKeyConstraint, Index, Integer, LargeBinary, SmallInteger,
    Text, UniqueConstraint, func, text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column



def point_z() -> Geometry:
    """geometry(PointZ) with no SRID: PostGIS stores 0 ("unknown"), geoalchemy2 spells it -1, its
    default and what it reflects. One instance per column: geoalchemy2 copies a column's
    nullability into its type, so a shared instance would make every column NOT NULL."""
    return Geometry(geometry_type="POINTZ", dimension=3, spatial_index=False)


class Base(DeclarativeBase):
    pass


class AtomSet(Base):
    """One immutable build: which model, how it was projected, how to score it."""

    __tablename__ = "atom_sets"
    __table_args__ = (
        CheckConstraint("kind IN ('token', 'context')", name="atom_sets_kind_check"),
        CheckConstraint("kernel IN ('gaussian', 'exponential', 'backoff')", name="atom_sets_kernel_check"),
        CheckConstraint("kernel <> 'backoff' OR centroid_decay < 1", name="atom_sets_backoff_decay_check"),
        CheckConstraint("bandwidth > 0", name="atom_sets_bandwidth_check"),
        CheckConstraint("centroid_window IS NULL OR centroid_window > 0", name="atom_sets_window_check"),
        CheckConstraint("centroid_decay > 0 AND centroid_decay <= 1", name="atom_sets_decay_check"),
        CheckConstraint("history_weight >= 0 AND history_weight < 'Infinity'", name="atom_sets_history_weight_check"),
        CheckConstraint("history_window >= 0", name="atom_sets_history_window_check"),
        CheckConstraint("history_window <= 4096", name="atom_sets_history_window_max_check"),
        CheckConstraint("layout IN ('rows', 'tiles')", name="atom_sets_layout_check"),
        CheckConstraint("risk_model IS NULL OR jsonb_typeof(risk_model) = 'object'", name="atom_sets_risk_model_check"),
        CheckConstraint("route_spread > 0 AND route_spread < 0.5", name="atom_sets_route_spread_check"),
        Index("atom_sets_one_default", "is_default", unique=True, postgresql_where=text("is_default")),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(Text, unique=True)
    model: Mapped[str] = mapped_column(Text)
    vocab_size: Mapped[int] = mapped_column(Integer)
    embedding_dim: Mapped[int] = mapped_column(Integer)
    projection: Mapped[str] = mapped_column(Text)
    projection_params: Mapped[dict] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    kind: Mapped[str] = mapped_column(Text)
    centroid_window: Mapped[int | None] = mapped_column(Integer, nullable=True)
    centroid_decay: Mapped[float] = mapped_column(Double, server_default=text("1"))
    kernel: Mapped[str] = mapped_column(Text, server_default=text("'gaussian'"))
    bandwidth: Mapped[float] = mapped_column(Double, server_default=text("1"))
    stats: Mapped[dict] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    is_default: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    history_weight: Mapped[float] = mapped_column(Double, server_default=text("0"))
    history_window: Mapped[int] = mapped_column(Integer, server_default=text("512"))
    model_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    layout: Mapped[str] = mapped_column(Text, server_default=text("'rows'"))
    risk_model: Mapped[dict | None] = mapped_column(JSONB, nullable=True)  # the build's risk predictor (0006)
    # Where set (a lattice set, 0018): every key within it of its cell's centre; calls route on Citus.
    route_spread: Mapped[float | None] = mapped_column(Double, nullable=True)
    root: Mapped[str | None] = mapped_column(Text, nullable=True)  # the indexed directory (0021); NULL for builds


class Token(Base):
    """A vocabulary token of an atom set: its text, 3D position and full embedding."""

    __tablename__ = "tokens"

    atom_set_id: Mapped[int] = mapped_column(
        ForeignKey("atom_sets.id", ondelete="CASCADE"), primary_key=True
    )
    token_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    text: Mapped[str | None] = mapped_column(Text, nullable=True)
    position = mapped_column(point_z(), nullable=False)
    embedding = mapped_column(Vector(), nullable=True)


class Atom(Base):
    """A weighted point that votes for `token_id`; partitioned by atom set (one GiST each)."""

    __tablename__ = "atoms"
    __table_args__ = (
        CheckConstraint("weight > 0", name="atoms_weight_check"),
        CheckConstraint("source IN (0, 1)", name="atoms_source_check"),
        Index("atoms_position_gist", "position", postgresql_using="gist",
              postgresql_ops={"position": "gist_geometry_ops_nd"}),
        {"postgresql_partition_by": "LIST (atom_set_id)"},
    )

    atom_set_id: Mapped[int] = mapped_column(
        ForeignKey("atom_sets.id", ondelete="CASCADE"), primary_key=True
    )
    atom_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    token_id: Mapped[int] = mapped_column(Integer)
    position = mapped_column(point_z(), nullable=False)
    weight: Mapped[float] = mapped_column(Double, server_default=text("1"))
    key = mapped_column(Vector(), nullable=True)
    source: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))   # ATOM_SOURCES code
    # The cell code on a set that routes, else atom_id (0018; NULL on sets built before it). On
    # Citus: the distribution column, NOT NULL and in the primary key (hartonomous/db/citus.py).
    route: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class MemoryAtom(Base):
    """One token of a remembered generation, at the key of the text before it (migration 0011,
    sql/070_memory.sql); partitioned by atom set like `atoms`, written only by `remember()`, with
    the sampler settings the generation ran with (0020), which the set's policy admitted."""

    __tablename__ = "memory_atoms"
    __table_args__ = (
        CheckConstraint("step >= 0", name="memory_atoms_step_check"),
        CheckConstraint("weight > 0 AND weight < 'Infinity'", name="memory_atoms_weight_check"),
        CheckConstraint("path IN ('exact', 'speculative')", name="memory_atoms_path_check"),   # 0014
        CheckConstraint("temperature >= 0 AND temperature < 'Infinity'", name="memory_atoms_temperature_check"),
        CheckConstraint("top_k >= 0", name="memory_atoms_top_k_check"),
        CheckConstraint("top_p > 0 AND top_p <= 1", name="memory_atoms_top_p_check"),
        CheckConstraint("repetition_penalty > 0 AND repetition_penalty < 'Infinity'",
                        name="memory_atoms_repetition_penalty_check"),
        Index("memory_atoms_position_gist", "position", postgresql_using="gist",
              postgresql_ops={"position": "gist_geometry_ops_nd"}),
        {"postgresql_partition_by": "LIST (atom_set_id)"},
    )

    atom_set_id: Mapped[int] = mapped_column(
        ForeignKey("atom_sets.id", ondelete="CASCADE"), primary_key=True
    )
    generation: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    route: Mapped[int | None] = mapped_column(BigInteger, nullable=True)   # as atoms.route (0018)
    position = mapped_column(point_z(), nullable=False)
    token_id: Mapped[int] = mapped_column(Integer)
    weight: Mapped[float] = mapped_column(Double)
    path: Mapped[str] = mapped_column(Text)
    remembered_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # The settings the generation ran with (0020); top_k NULL or 0: off.
    temperature: Mapped[float] = mapped_column(Double)
    top_k: Mapped[int | None] = mapped_column(Integer, nullable=True)
    top_p: Mapped[float] = mapped_column(Double)
    repetition_penalty: Mapped[float] = mapped_column(Double)
    adaptive: Mapped[bool] = mapped_column(Boolean)
    ignore_eos: Mapped[bool] = mapped_column(Boolean)


class MemoryBound(Base):
    """A set's memory bound, in atoms (migration 0014, sql/070_memory.sql): written by the owner
    with `set_memory_bound()`, enforced by `remember()`; a set without a row has 100,000."""

    __tablename__ = "memory_bounds"
    __table_args__ = (
        CheckConstraint("max_atoms BETWEEN 1 AND 10000000", name="memory_bounds_max_atoms_check"),
    )

    atom_set_id: Mapped[int] = mapped_column(
        ForeignKey("atom_sets.id", ondelete="CASCADE"), primary_key=True
    )
    max_atoms: Mapped[int] = mapped_column(Integer)
    set_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class MemoryPolicy(Base):
    """A set's sampler policy for its memory (migration 0020, sql/070_memory.sql): the settings under
    which `remember()` keeps a generation; written by the owner with `set_memory_policy()`; a set
    without a row has the default policy (SQL ht_memory_policy)."""

    __tablename__ = "memory_policies"
    __table_args__ = (
        CheckConstraint("min_temperature >= 0 AND min_temperature <= max_temperature AND max_temperature <= 1e6",
                        name="memory_policies_temperature_check"),
        CheckConstraint("min_top_p >= 0 AND min_top_p <= max_top_p AND max_top_p > 0 AND max_top_p <= 1",
                        name="memory_policies_top_p_check"),
        CheckConstraint("max_top_k BETWEEN 0 AND 1000000", name="memory_policies_max_top_k_check"),
    )

    atom_set_id: Mapped[int] = mapped_column(
        ForeignKey("atom_sets.id", ondelete="CASCADE"), primary_key=True
    )
    min_temperature: Mapped[float] = mapped_column(Double)
    max_temperature: Mapped[float] = mapped_column(Double)
    min_top_p: Mapped[float] = mapped_column(Double)
    max_top_p: Mapped[float] = mapped_column(Double)
    max_top_k: Mapped[int] = mapped_column(Integer)                # 0: any top_k, off included
    allow_repetition_penalty: Mapped[bool] = mapped_column(Boolean)
    allow_adaptive: Mapped[bool] = mapped_column(Boolean)
    allow_ignore_eos: Mapped[bool] = mapped_column(Boolean)
    set_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class AugmentGate(Base):
    """The augmented path's gate of a set (migration 0017, sql/095_gates.sql): written by the owner
    with `save_gate()`, fitted on the calibration split (hartonomous/augment/gate.py)."""

    __tablename__ = "augment_gates"
    __table_args__ = (
        CheckConstraint("version >= 1", name="augment_gates_version_check"),
        CheckConstraint("positions >= 1", name="augment_gates_positions_check"),
        CheckConstraint("split = 'calibration'", name="augment_gates_split_check"),
        CheckConstraint("cardinality(features) >= 1 AND cardinality(means) = cardinality(features) "
                        "AND cardinality(scales) = cardinality(features) "
                        "AND cardinality(coefficients) = cardinality(features)", name="augment_gates_shape_check"),
    )

    atom_set_id: Mapped[int] = mapped_column(
        ForeignKey("atom_sets.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer)
    features: Mapped[list[str]] = mapped_column(ARRAY(Text))
    means: Mapped[list[float]] = mapped_column(ARRAY(Double))
    scales: Mapped[list[float]] = mapped_column(ARRAY(Double))
    coefficients: Mapped[list[float]] = mapped_column(ARRAY(Double))
    intercept: Mapped[float] = mapped_column(Double)
    calibration_loss: Mapped[float] = mapped_column(Double)
    exact_loss: Mapped[float] = mapped_column(Double)
    positions: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(Text)
    details: Mapped[dict] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    fitted_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class AtomSetFile(Base):
    """A file of an indexed set (migration 0021, hartonomous/repository/index.py): its tokens as the
    store ingested them and its line starts, enough to subtract its atoms and to cite it."""

    __tablename__ = "atom_set_files"
    __table_args__ = (
        CheckConstraint("split IN ('train', 'calibration', 'test')", name="atom_set_files_split_check"),
        CheckConstraint("license_source IN ('spdx-header', 'license-file', 'package-metadata', 'unknown')",
                        name="atom_set_files_license_source_check"),
        UniqueConstraint("atom_set_id", "path", name="atom_set_files_atom_set_id_path_key"),
        # The keys of a train file's 2-, 4- and 8-grams, stored only in this index (0022, citations).
        Index("atom_set_files_grams_gin", text("ht_file_grams(token_ids)"), postgresql_using="gin",
              postgresql_where=text("split = 'train'")),
    )

    atom_set_id: Mapped[int] = mapped_column(
        ForeignKey("atom_sets.id", ondelete="CASCADE"), primary_key=True
    )
    file_id: Mapped[int] = mapped_column(Integer, primary_key=True)   # stable within a set, never reused
    path: Mapped[str] = mapped_column(Text)                            # relative to the set's root, POSIX
    content_sha256: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    n_tokens: Mapped[int] = mapped_column(Integer)
    split: Mapped[str] = mapped_column(Text)
    license: Mapped[str | None] = mapped_column(Text, nullable=True)  # SPDX id; NULL when unknown
    license_source: Mapped[str] = mapped_column(Text)
    added_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    token_ids: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    # line_starts[i] (1-based) = index (0-based) into token_ids of line i's first token
    line_starts: Mapped[list[int]] = mapped_column(ARRAY(Integer))


class AtomSetFileGrams(Base):
    """A train file's tokens as 4-byte words for store_sources' byte search (migration 0022,
    sql/100_sources.sql; its gram keys are atom_set_files' GIN expression index); written by a
    trigger on atom_set_files."""

    __tablename__ = "atom_set_file_grams"
    __table_args__ = (
        ForeignKeyConstraint(["atom_set_id", "file_id"], ["atom_set_files.atom_set_id", "atom_set_files.file_id"],
                             ondelete="CASCADE", name="atom_set_file_grams_file_fkey"),
    )

    atom_set_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    file_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tokens: Mapped[bytes] = mapped_column(LargeBinary)      # the token ids as 4-byte big-endian words


class _SetCoordinates:
    """A row of one atom set holding coordinates as float8 arrays (xs[i], ys[i], zs[i])."""

    atom_set_id: Mapped[int] = mapped_column(
        ForeignKey("atom_sets.id", ondelete="CASCADE"), primary_key=True
    )
    xs: Mapped[list[float]] = mapped_column(ARRAY(Double))
    ys: Mapped[list[float]] = mapped_column(ARRAY(Double))
    zs: Mapped[list[float]] = mapped_column(ARRAY(Double))


class AtomTile(_SetCoordinates, Base):
    """The 'tiles' layout: atoms packed along the Hilbert curve, one row per tile (sql/015_knn.sql)."""

    __tablename__ = "atom_tiles"
    __table_args__ = (
        Index("atom_tiles_atoms_gist", "atoms", postgresql_using="gist",
              postgresql_ops={"atoms": "gist_geometry_ops_nd"}),
        {"postgresql_partition_by": "LIST (atom_set_id)"},
    )

    tile_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    atoms = mapped_column(Geometry(geometry_type="MULTIPOINTZ", dimension=3, spatial_index=False), nullable=False)
    token_ids: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    weights: Mapped[list[float]] = mapped_column(ARRAY(Double))


class TokenBlock(_SetCoordinates, Base):
    """Token positions in blocks of 256 consecutive ids (NaN: no such token), read by the centroid."""

    __tablename__ = "token_blocks"
    __table_args__ = (
        CheckConstraint("block >= 0 AND block <= 8388607", name="token_blocks_block_check"),
    )

    block: Mapped[int] = mapped_column(Integer, primary_key=True)


class Landmark(Base):
    """A landmark of the projection, stored so new vectors project the same way."""

    __tablename__ = "landmarks"

    atom_set_id: Mapped[int] = mapped_column(
        ForeignKey("atom_sets.id", ondelete="CASCADE"), primary_key=True
    )
    landmark_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    embedding = mapped_column(Vector(), nullable=False)
    position = mapped_column(point_z(), nullable=True)
