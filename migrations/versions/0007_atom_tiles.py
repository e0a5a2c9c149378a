"""Packed atom tiles (a second storage layout for the next-token KNN) and token position blocks.

`atom_sets.layout` records how a set's atoms are laid out for next_token's KNN: 'rows' (one row
per atom, GiST nd over the points; the original layout) or 'tiles' (the same atoms, also packed
along the Hilbert curve into tiles of a few dozen atoms, one row per tile; sql/015_knn.sql reads
them). `atom_tiles` is partitioned by atom set like `atoms`; every column is stored PLAIN (never
compressed or moved out of line) so that a tile is one heap tuple on one page, read with one
buffer access.

`token_blocks` holds every set's token positions in blocks of 256 consecutive token ids (arrays of
coordinates, NaN where the set has no such token), so that the centroid reads the positions of a
long context with one access per distinct block instead of one index probe per token.

Revision ID: 0007
Revises: 0005
"""
from alembic import op

revision = "0007"
down_revision = "0005"
branch_labels = None
depends_on = None

TILE_COLUMNS = ("atoms", "xs", "ys", "zs", "token_ids", "weights")


def upgrade() -> None:
    op.execute("""
        ALTER TABLE atom_sets ADD COLUMN layout text NOT NULL DEFAULT 'rows'
            CONSTRAINT atom_sets_layout_check CHECK (layout IN ('rows', 'tiles'))""")
    # atoms: the tile's atoms as one MULTIPOINT Z. The GiST nd index keys it by its bounding box,
    # and `atoms <<->> c` (rechecked exactly) is the distance from c to the tile's nearest atom,
    # the order in which the exact tile KNN visits tiles. The arrays hold the same atoms, in the
    # same order, unpacked: coordinates, token ids, weights.
    op.execute("""
        CREATE TABLE atom_tiles (
            atom_set_id integer NOT NULL REFERENCES atom_sets(id) ON DELETE CASCADE,
            tile_id     integer NOT NULL,
            atoms       geometry(MultiPointZ, 0) NOT NULL,
            xs          double precision[] NOT NULL,
            ys          double precision[] NOT NULL,
            zs          double precision[] NOT NULL,
            token_ids   integer[] NOT NULL,
            weights     double precision[] NOT NULL,
            PRIMARY KEY (atom_set_id, tile_id)
        ) PARTITION BY LIST (atom_set_id)""")
    for column in TILE_COLUMNS:
        op.execute(f"ALTER TABLE atom_tiles ALTER COLUMN {column} SET STORAGE PLAIN")
    op.execute("CREATE INDEX atom_tiles_atoms_gist ON atom_tiles USING gist (atoms gist_geometry_ops_nd)")
    op.execute("""
        CREATE TABLE token_blocks (
            atom_set_id integer NOT NULL REFERENCES atom_sets(id) ON DELETE CASCADE,
            block       integer NOT NULL,
            xs          double precision[] NOT NULL,
            ys          double precision[] NOT NULL,
            zs          double precision[] NOT NULL,
            PRIMARY KEY (atom_set_id, block)
        )""")
    for column in ("xs", "ys", "zs"):
        op.execute(f"ALTER TABLE token_blocks ALTER COLUMN {column} SET STORAGE PLAIN")
    op.execute("GRANT SELECT ON atom_tiles, token_blocks TO hartonomous_reader")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS token_blocks")
    op.execute("DROP TABLE IF EXISTS atom_tiles CASCADE")
    op.execute("ALTER TABLE atom_sets DROP COLUMN layout")
