"""The native kernel's one version: hartonomous_kernel 1.5, the cut.

Every database is brought to 1.5 (hartonomous/db/migrate.py ensure_native_kernel_on): 1.4 updates
in place; a 1.4 that reached that version before it gained htk_store_step (1.4 was amended in
place), or any version before it, is installed afresh (the extension holds no data); where objects
outside the extension depend on its functions the upgrade refuses and says what to do. sql/ calls
1.5 alone: ht_kernel() is 'native' only there. Below this revision no native kernel is installed:
the downgrade drops the extension and the PL/pgSQL reference (sql/) serves (docs/sql.md "The native
kernel").

Revision ID: 0019
Revises: 0018
"""
from alembic import op

from hartonomous.db.migrate import drop_native_kernel, ensure_native_kernel_on, install_sql_functions

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute = op.get_bind().connection.driver_connection.execute
    ensure_native_kernel_on(execute)
    install_sql_functions(execute)


def downgrade() -> None:
    drop_native_kernel(op.get_bind().connection.driver_connection.execute)
