"""The native kernel serves the backoff kernel everywhere: hartonomous_kernel 1.3.

Version 1.3 takes the kernel by name (gaussian, exponential or backoff) in htk_distribution,
htk_logits, htk_next_token and htk_step_logits, so next_token with memory, ht_step_logits, the loops
and the batch run the backoff kernel in C too (docs/sql.md "The native kernel"). sql/ calls the 1.3
signatures, so the functions are installed again here with the update; ht_kernel() is 'native' only
at 1.3. The downgrade takes the extension back to 1.2, where these functions run the PL/pgSQL path
until sql/ of that revision is installed again.

Revision ID: 0015
Revises: 0014
"""
from alembic import op

from hartonomous.db.migrate import ensure_native_kernel_on, install_sql_functions

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    execute = op.get_bind().connection.driver_connection.execute
    ensure_native_kernel_on(execute)
    install_sql_functions(execute)


def downgrade() -> None:
    op.execute("""DO $$ BEGIN
        IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'hartonomous_kernel' AND extversion = '1.3') THEN
            ALTER EXTENSION hartonomous_kernel UPDATE TO '1.2';
        END IF;
    END $$""")
