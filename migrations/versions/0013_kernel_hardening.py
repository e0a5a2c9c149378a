"""The native kernel hardened: token_blocks' block numbers checked, the extension at 1.2.

A token_blocks row's block is a token id / 256, so it lies in 0 .. 8388607 (token ids are
integers >= 0); the native kernel refuses other rows too, but the table no longer accepts them.
Version 1.2 of hartonomous_kernel reports its per-backend memory in htk_stats()
(docs/sql.md "The native kernel"); where the server has it, the extension is updated.

Revision ID: 0013
Revises: 0012
"""
from alembic import op

from hartonomous.db.migrate import ensure_native_kernel_on

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE token_blocks ADD CONSTRAINT token_blocks_block_check "
               "CHECK (block >= 0 AND block <= 8388607)")
    ensure_native_kernel_on(op.get_bind().connection.driver_connection.execute)


def downgrade() -> None:
    op.execute("""DO $$ BEGIN
        IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'hartonomous_kernel' AND extversion = '1.2') THEN
            ALTER EXTENSION hartonomous_kernel UPDATE TO '1.1';
        END IF;
    END $$""")
    op.execute("ALTER TABLE token_blocks DROP CONSTRAINT IF EXISTS token_blocks_block_check")
