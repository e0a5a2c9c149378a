"""The augmented path's gates: `augment_gates`, one fitted gate per atom set, beside it.

A gate (hartonomous/augment/gate.py) weighs the atom store against the exact model at every step
of the augmented path. It is fitted on the set's calibration split and written by the owner with
`save_gate()` (sql/095_gates.sql), which checks it; atom sets stay immutable. The reader role may
read the gates, not write them. Existing sets have no gate until `hartonomous gate fit SET` (new
builds with corpus labels fit one).

Revision ID: 0017
Revises: 0016
"""
from alembic import op

from hartonomous.db.migrate import install_sql_functions

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE augment_gates (
            atom_set_id      integer PRIMARY KEY REFERENCES atom_sets(id) ON DELETE CASCADE,
            version          integer NOT NULL CONSTRAINT augment_gates_version_check CHECK (version >= 1),
            features         text[] NOT NULL,
            means            double precision[] NOT NULL,
            scales           double precision[] NOT NULL,
            coefficients     double precision[] NOT NULL,
            intercept        double precision NOT NULL,
            calibration_loss double precision NOT NULL,
            exact_loss       double precision NOT NULL,
            positions        integer NOT NULL CONSTRAINT augment_gates_positions_check CHECK (positions >= 1),
            split            text NOT NULL CONSTRAINT augment_gates_split_check CHECK (split = 'calibration'),
            details          jsonb NOT NULL DEFAULT '{}'::jsonb,
            fitted_at        timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT augment_gates_shape_check CHECK (
                cardinality(features) >= 1 AND cardinality(means) = cardinality(features)
                AND cardinality(scales) = cardinality(features)
                AND cardinality(coefficients) = cardinality(features))
        )""")
    op.execute("GRANT SELECT ON augment_gates TO hartonomous_reader")
    install_sql_functions(op.get_bind().connection.driver_connection.execute)


def downgrade() -> None:
    op.execute("DROP FUNCTION IF EXISTS save_gate(text, text[], double precision[], double precision[], "
               "double precision[], double precision, double precision, double precision, integer, text, "
               "integer, jsonb)")
    op.execute("DROP FUNCTION IF EXISTS ht_check_finite_array(text, double precision[], integer)")
    op.execute("DROP TABLE IF EXISTS augment_gates")
