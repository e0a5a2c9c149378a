"""Citations: the occurrence index behind store_sources (sql/100_sources.sql).

The keys of each train file's 2-, 4- and 8-grams (ht_file_grams(token_ids)) under a GIN expression
index on atom_set_files (WHERE split = 'train'), so the files holding a context's last tokens are
found without reading every file; the keys are computed as a file is written and stored nowhere
but the index. `atom_set_file_grams`: one row per train file, its tokens as 4-byte words
(ht_token_bytes), which position() searches for a context's suffix. Those rows are derived from
atom_set_files alone: a trigger writes them when a file is inserted or its tokens or split change,
and they go with the file (ON DELETE CASCADE), so the file table's writer needs no change. Existing
files are indexed here. The reader role may read the table, not write it.

The downgrade drops the trigger, the index and the table (their functions go with migrations/env.py's
check).

Revision ID: 0022
Revises: 0021
"""
from alembic import op

from hartonomous.db.citus import has_citus
from hartonomous.db.migrate import install_sql_functions

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
        CREATE TABLE IF NOT EXISTS atom_set_file_grams (
            atom_set_id integer NOT NULL,
            file_id     integer NOT NULL,
            tokens      bytea NOT NULL,
            PRIMARY KEY (atom_set_id, file_id),
            CONSTRAINT atom_set_file_grams_file_fkey FOREIGN KEY (atom_set_id, file_id)
                REFERENCES atom_set_files (atom_set_id, file_id) ON DELETE CASCADE
        )""")
    conn = op.get_bind().connection.driver_connection
    # Searched whole on every citation: kept out of line but uncompressed (no decompression a call).
    # On a Citus coordinator the table is Citus-managed (its key reaches atom_sets, a reference
    # table), where ALTER COLUMN ... SET STORAGE is not supported: it keeps the default there.
    if not has_citus(conn):
        op.execute("ALTER TABLE atom_set_file_grams ALTER COLUMN tokens SET STORAGE EXTERNAL")
    install_sql_functions(conn.execute)
    # The keys are not stored: an expression index over the file table's own tokens (train files only).
    op.execute("CREATE INDEX IF NOT EXISTS atom_set_files_grams_gin ON atom_set_files "
               "USING gin (ht_file_grams(token_ids)) WHERE split = 'train'")
    op.execute("GRANT SELECT ON atom_set_file_grams TO hartonomous_reader")
    op.execute("DROP TRIGGER IF EXISTS atom_set_files_grams ON atom_set_files")
    op.execute("CREATE TRIGGER atom_set_files_grams AFTER INSERT OR UPDATE OF token_ids, split ON atom_set_files "
               "FOR EACH ROW EXECUTE FUNCTION ht_file_grams_sync()")
    op.execute("INSERT INTO atom_set_file_grams (atom_set_id, file_id, tokens) "
               "SELECT atom_set_id, file_id, ht_token_bytes(token_ids) "
               "FROM atom_set_files WHERE split = 'train' "
               "ON CONFLICT DO NOTHING")


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS atom_set_files_grams ON atom_set_files")
    op.execute("DROP INDEX IF EXISTS atom_set_files_grams_gin")
    op.execute("DROP TABLE IF EXISTS atom_set_file_grams")
