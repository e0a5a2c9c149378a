"""The native kernel's one version (placeholder, filled in by the kernel cut).

Revision ID: 0019
Revises: 0018
"""

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
