"""On a Citus coordinator: atom_sets, tokens, landmarks as reference tables; atoms hash-distributed.

Detects Citus by its extension on the server migrated (a coordinator: `hartonomous cluster up`,
or HARTONOMOUS_DATABASE_URL at any Citus coordinator) and does nothing on a single node.
hartonomous/db/citus.py holds the layout and why; docs/scale-out.md the rest. Atom sets built
afterwards get their partition distributed by the build (hartonomous/atomset/write.py). A
database migrated to head before Citus was installed stays local: build on a fresh cluster.

Revision ID: 0008
Revises: 0006 (after 0007, atom tiles, and 0006, the risk model, which follows it)
"""
from alembic import op

from hartonomous.db.citus import distribute_schema, undistribute_schema

revision = "0008"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    distribute_schema(op.get_bind().connection.driver_connection)


def downgrade() -> None:
    undistribute_schema(op.get_bind().connection.driver_connection)
