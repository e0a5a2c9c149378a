"""The native kernel: CREATE EXTENSION hartonomous_kernel where the server has it.

next_token's hot loop in C (ext/hartonomous_kernel, installed by `make install`); sql/060_kernel.sql
routes next_token and the generation loops through it when it is installed in the database, and
the PL/pgSQL functions run otherwise (an external server, Docker, Citus workers without it).
`hartonomous migrate` also creates it on a database already at head once the server has it
(hartonomous/db/migrate.py: ensure_native_kernel).

Revision ID: 0009
Revises: 0008
"""
from alembic import op

from hartonomous.db.migrate import drop_native_kernel, ensure_native_kernel_on

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    ensure_native_kernel_on(op.get_bind().connection.driver_connection.execute)


def downgrade() -> None:
    drop_native_kernel(op.get_bind().connection.driver_connection.execute)
