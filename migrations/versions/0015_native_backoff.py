"""The native kernel serves the backoff kernel everywhere: sql/ installed again.

Version 1.3 of hartonomous_kernel, which this revision first installed, takes the kernel by name
(gaussian, exponential or backoff), so next_token with memory, ht_step_logits, the loops and the
batch run the backoff kernel in C too. Since the kernel's cut (0019) its one version is installed
there and none below it (docs/sql.md "The native kernel"), so this revision installs the functions
of sql/ alone, and its downgrade has nothing to undo.

Revision ID: 0015
Revises: 0014
"""
from alembic import op

from hartonomous.db.migrate import install_sql_functions

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    install_sql_functions(op.get_bind().connection.driver_connection.execute)


def downgrade() -> None:
    pass
