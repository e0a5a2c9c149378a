"""Where each stored atom came from: `atoms.source` (0 the corpus, 1 self-distilled text).

Issue 25's playground colours a kept drafted token by the source of the atom that voted for it
most; a set's atoms mix the corpus's contexts (corpus- or teacher-labelled) with the exact
model's own continuations (`build --self-distill N`). The codes are hartonomous.atomset.write's
ATOM_SOURCES (SQL names them with ht_atom_source, sql/080_draft_sources.sql). Existing atoms
are the corpus's: sets built before self-distillation recorded a source were either corpus-only
or mixed without a record, and read as 'corpus'. A constant default: no table rewrite.

Revision ID: 0012
Revises: 0011
"""
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE atoms ADD COLUMN source smallint NOT NULL DEFAULT 0 "
               "CONSTRAINT atoms_source_check CHECK (source IN (0, 1))")


def downgrade() -> None:
    op.execute("ALTER TABLE atoms DROP COLUMN IF EXISTS source")
