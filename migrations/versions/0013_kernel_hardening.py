"""The native kernel hardened: token_blocks' block numbers checked.

A token_blocks row's block is a token id / 256, so it lies in 0 .. 8388607 (token ids are
integers >= 0); the native kernel refuses other rows too, but the table no longer accepts them.
This revision also took the extension to 1.2; since the kernel's cut (0019) its one version is
installed there, and below it none (docs/sql.md "The native kernel").

Revision ID: 0013
Revises: 0012
"""
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE token_blocks ADD CONSTRAINT token_blocks_block_check "
               "CHECK (block >= 0 AND block <= 8388607)")


def downgrade() -> None:
    op.execute("ALTER TABLE token_blocks DROP CONSTRAINT IF EXISTS token_blocks_block_check")
