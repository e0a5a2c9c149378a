"""atom_sets.history_window at most 4096, the bound next_token's history_window argument has.

`next_token(..., history_window => NULL)` takes the atom set's value, so the column gets the same
bound as the argument (sql/020_next_token.sql): per-call work stays bounded whichever way the
value arrives. The new function signatures themselves need no revision here: `sql/*.sql` drops
the ones a database installed before history atoms and creates the new ones, both on a fresh
migrate (0002) and when `hartonomous migrate` reinstalls drifted functions.

Revision ID: 0005
Revises: 0004
"""
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

HISTORY_WINDOW_MAX = 4096


def upgrade() -> None:
    op.execute(f"""
        ALTER TABLE atom_sets ADD CONSTRAINT atom_sets_history_window_max_check
            CHECK (history_window <= {HISTORY_WINDOW_MAX})""")


def downgrade() -> None:
    op.execute("ALTER TABLE atom_sets DROP CONSTRAINT atom_sets_history_window_max_check")
