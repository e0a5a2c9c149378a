"""The backoff kernel: atom_sets.kernel may be 'backoff' (hartonomous/kernel.py), for a set whose
centroid decay is below 1 (the kernel's radii are the bandwidth times whole powers of the decay).

Revision ID: 0010
Revises: 0009
"""
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE atom_sets DROP CONSTRAINT atom_sets_kernel_check")
    op.execute("ALTER TABLE atom_sets ADD CONSTRAINT atom_sets_kernel_check "
               "CHECK (kernel IN ('gaussian', 'exponential', 'backoff'))")
    op.execute("ALTER TABLE atom_sets ADD CONSTRAINT atom_sets_backoff_decay_check "
               "CHECK (kernel <> 'backoff' OR centroid_decay < 1)")


def downgrade() -> None:
    op.execute("""DO $$ BEGIN
        IF EXISTS (SELECT 1 FROM atom_sets WHERE kernel = 'backoff') THEN
            RAISE EXCEPTION 'atom sets with the backoff kernel exist; drop them first (hartonomous atom-sets drop NAME)';
        END IF;
    END $$""")
    op.execute("ALTER TABLE atom_sets DROP CONSTRAINT atom_sets_backoff_decay_check")
    op.execute("ALTER TABLE atom_sets DROP CONSTRAINT atom_sets_kernel_check")
    op.execute("ALTER TABLE atom_sets ADD CONSTRAINT atom_sets_kernel_check "
               "CHECK (kernel IN ('gaussian', 'exponential'))")
