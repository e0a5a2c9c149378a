"""A memory of past generations: `memory_atoms`, partitioned per atom set like `atoms`.

Atom sets stay immutable. What the exact model said in completed generations (the exact,
speculative and hybrid paths) can be remembered beside a set: one atom per generated token, at
the key of the text before it (the history atoms' definition, sql/010_context_centroid.sql),
written only through `remember()` (sql/070_memory.sql), which validates its input, bounds the
memory's size and evicts the oldest generations. Readers (the hartonomous_reader role) may
SELECT the memory, which `draft_tokens(..., memory => true)` and `next_token(..., memory => true)`
read beside the set's atoms; they may not write it. A set's partition (memory_atoms_<id>) is
created by its first `remember()`.

Revision ID: 0011
Revises: 0010
"""
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE SEQUENCE memory_generation_seq")
    op.execute("""
        CREATE TABLE memory_atoms (
            atom_set_id   integer NOT NULL REFERENCES atom_sets(id) ON DELETE CASCADE,
            generation    bigint NOT NULL,
            step          integer NOT NULL CONSTRAINT memory_atoms_step_check CHECK (step >= 0),
            position      geometry(PointZ, 0) NOT NULL,
            token_id      integer NOT NULL,
            weight        double precision NOT NULL
                CONSTRAINT memory_atoms_weight_check CHECK (weight > 0 AND weight < 'Infinity'),
            path          text NOT NULL
                CONSTRAINT memory_atoms_path_check CHECK (path IN ('exact', 'speculative', 'hybrid')),
            remembered_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (atom_set_id, generation, step)
        ) PARTITION BY LIST (atom_set_id)""")
    op.execute("CREATE INDEX memory_atoms_position_gist ON memory_atoms USING gist (position gist_geometry_ops_nd)")
    op.execute("GRANT SELECT ON memory_atoms TO hartonomous_reader")
    # 0002 installed sql/ (remember() and forget() among it) before 0003 granted the reader EXECUTE
    # on every function: take the writers back (sql/070_memory.sql does the same on a reinstall).
    op.execute("""DO $$ BEGIN
        IF to_regprocedure('remember(text, integer[], integer[], text, integer, double precision)') IS NOT NULL THEN
            REVOKE EXECUTE ON FUNCTION remember(text, integer[], integer[], text, integer, double precision)
                FROM PUBLIC, hartonomous_reader;
            REVOKE EXECUTE ON FUNCTION forget(text) FROM PUBLIC, hartonomous_reader;
        END IF; END $$""")


def downgrade() -> None:
    # The memory's bound (0014), which 0014's downgrade keeps for the functions of sql/, goes with it.
    op.execute("DROP TABLE IF EXISTS memory_bounds")
    op.execute("DROP TABLE IF EXISTS memory_atoms CASCADE")
    op.execute("DROP SEQUENCE IF EXISTS memory_generation_seq")
