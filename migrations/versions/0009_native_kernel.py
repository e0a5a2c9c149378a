"""The native kernel, first created here; since the kernel's cut (0019) it is created there.

next_token's hot loop in C (ext/hartonomous_kernel, installed by `make install`); sql/060_kernel.sql
routes next_token and the generation loops through it when it is installed in the database, and
the PL/pgSQL functions run otherwise (an external server, Docker, Citus workers without it). The
kernel has one version, created by 0019 (and by `hartonomous migrate` on a database already at head
once the server has it: hartonomous/db/migrate.py ensure_native_kernel); below 0019 the PL/pgSQL
reference serves, so this upgrade creates nothing and the downgrade drops what a database created
before the cut holds.

Revision ID: 0009
Revises: 0008
"""
from alembic import op

from hartonomous.db.migrate import drop_native_kernel

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    drop_native_kernel(op.get_bind().connection.driver_connection.execute)
