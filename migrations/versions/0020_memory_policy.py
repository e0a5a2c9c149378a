"""The owner's sampler policy for a set's memory (placeholder, filled in with the policy).

Revision ID: 0020
Revises: 0019
"""

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
