"""Schema: extensions, atom_sets, tokens, atoms (partitioned per atom set, GiST nd), landmarks.

Revision ID: 0001
Revises:
"""
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS postgis")
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.execute("""
        CREATE TABLE atom_sets (
            id                serial PRIMARY KEY,
            name              text NOT NULL UNIQUE,
            model             text NOT NULL,
            vocab_size        integer NOT NULL,
            embedding_dim     integer NOT NULL,
            projection        text NOT NULL,
            projection_params jsonb NOT NULL DEFAULT '{}'::jsonb,
            kind              text NOT NULL CONSTRAINT atom_sets_kind_check CHECK (kind IN ('token', 'context')),
            centroid_window   integer CONSTRAINT atom_sets_window_check CHECK (centroid_window IS NULL OR centroid_window > 0),
            centroid_decay    double precision NOT NULL DEFAULT 1
                              CONSTRAINT atom_sets_decay_check CHECK (centroid_decay > 0 AND centroid_decay <= 1),
            kernel            text NOT NULL DEFAULT 'gaussian'
                              CONSTRAINT atom_sets_kernel_check CHECK (kernel IN ('gaussian', 'exponential')),
            bandwidth         double precision NOT NULL DEFAULT 1 CONSTRAINT atom_sets_bandwidth_check CHECK (bandwidth > 0),
            stats             jsonb NOT NULL DEFAULT '{}'::jsonb,
            is_default        boolean NOT NULL DEFAULT false,
            created_at        timestamptz NOT NULL DEFAULT now()
        )""")
    op.execute("CREATE UNIQUE INDEX atom_sets_one_default ON atom_sets (is_default) WHERE is_default")
    op.execute("""
        CREATE TABLE tokens (
            atom_set_id integer NOT NULL REFERENCES atom_sets(id) ON DELETE CASCADE,
            token_id    integer NOT NULL,
            text        text,
            position    geometry(PointZ, 0) NOT NULL,
            embedding   vector,
            PRIMARY KEY (atom_set_id, token_id)
        )""")
    # One partition per atom set: a KNN for one set walks only that set's GiST index.
    op.execute("""
        CREATE TABLE atoms (
            atom_set_id integer NOT NULL REFERENCES atom_sets(id) ON DELETE CASCADE,
            atom_id     bigint NOT NULL,
            token_id    integer NOT NULL,
            position    geometry(PointZ, 0) NOT NULL,
            weight      double precision NOT NULL DEFAULT 1 CONSTRAINT atoms_weight_check CHECK (weight > 0),
            key         vector,
            PRIMARY KEY (atom_set_id, atom_id)
        ) PARTITION BY LIST (atom_set_id)""")
    op.execute("CREATE INDEX atoms_position_gist ON atoms USING gist (position gist_geometry_ops_nd)")
    op.execute("""
        CREATE TABLE landmarks (
            atom_set_id integer NOT NULL REFERENCES atom_sets(id) ON DELETE CASCADE,
            landmark_id integer NOT NULL,
            embedding   vector NOT NULL,
            position    geometry(PointZ, 0),
            PRIMARY KEY (atom_set_id, landmark_id)
        )""")


def downgrade() -> None:
    op.execute("DROP TABLE IF EXISTS landmarks")
    op.execute("DROP TABLE IF EXISTS atoms CASCADE")
    op.execute("DROP TABLE IF EXISTS tokens")
    op.execute("DROP TABLE IF EXISTS atom_sets")
