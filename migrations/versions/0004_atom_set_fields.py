"""Atom-set fields for history atoms and the model key; a statement timeout for the reader role.

- `history_weight`, `history_window`: the weight and reach of the context's own history atoms in
  `next_token` (0 = off; sets built before this revision keep them off, so their results do not
  change).
- `model_key`: what `hartonomous build --model` was given ('smollm2' or a local model folder), so
  readers load the right tokenizer without guessing from the model's name. Rows built before this
  revision are backfilled here, once: 'smollm2' when the recorded model name says so.
- `hartonomous_reader` gets a role default `statement_timeout` (READER_STATEMENT_TIMEOUT): a
  statement of a reader session that does not change the setting (the HTTP server and the
  client never do) is cancelled after that long. It is a default, not a hard cap: a reader may
  `SET statement_timeout` itself; the hard bounds are in the functions (max_new_tokens <= 4096).

Revision ID: 0004
Revises: 0003
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

READER_STATEMENT_TIMEOUT = "60s"


def upgrade() -> None:
    op.execute("""
        ALTER TABLE atom_sets
            ADD COLUMN history_weight double precision NOT NULL DEFAULT 0
                CONSTRAINT atom_sets_history_weight_check CHECK (history_weight >= 0 AND history_weight < 'Infinity'),
            ADD COLUMN history_window integer NOT NULL DEFAULT 512
                CONSTRAINT atom_sets_history_window_check CHECK (history_window >= 0),
            ADD COLUMN model_key text""")
    op.execute("UPDATE atom_sets SET model_key = 'smollm2' WHERE model_key IS NULL AND model ILIKE '%smollm2%'")
    op.execute(f"ALTER ROLE hartonomous_reader SET statement_timeout = '{READER_STATEMENT_TIMEOUT}'")


def downgrade() -> None:
    op.execute("ALTER ROLE hartonomous_reader RESET statement_timeout")
    op.execute("ALTER TABLE atom_sets DROP COLUMN model_key, DROP COLUMN history_window, DROP COLUMN history_weight")
