"""atom_sets.risk_model: the risk predictor the build fits on the calibration half (issue 16).

A logistic regression stored as data, not code: {"target", "features", "mean", "scale", "coef",
"intercept", ...} (hartonomous/risk.py RiskModel). SQL `next_token_signals` evaluates it per
step (sql/050_signals.sql, ht_risk) and Python evaluates the same formula. A column, not a key
of `stats`, because inference reads it like `bandwidth` and `history_weight`: it is a parameter
of the atom set's predictions, while `stats` records what the build measured. NULL: no
predictor (sets built before this revision, token sets, builds without a calibration half).

Revision ID: 0006
Revises: 0007 (the id 0006 was assigned to this branch; 0007 reached main first)
"""
from alembic import op

revision = "0006"
down_revision = "0007"   # after main's 0007 (atom tiles), merged before this branch
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        ALTER TABLE atom_sets ADD COLUMN risk_model jsonb
            CONSTRAINT atom_sets_risk_model_check CHECK (risk_model IS NULL OR jsonb_typeof(risk_model) = 'object')""")


def downgrade() -> None:
    op.execute("ALTER TABLE atom_sets DROP COLUMN risk_model")
