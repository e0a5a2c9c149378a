"""Least privilege: the hartonomous_reader role may only run inference.

It can EXECUTE the inference functions and SELECT what they read; nothing else. The embedded
cluster gives it a login password; on another server, give it one yourself and set
HARTONOMOUS_READER_DATABASE_URL.

Revision ID: 0003
Revises: 0002
"""
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

READ_TABLES = ("atom_sets", "tokens", "atoms", "landmarks")


def upgrade() -> None:
    op.execute("""DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'hartonomous_reader') THEN
            CREATE ROLE hartonomous_reader NOLOGIN;
        END IF; END $$""")
    op.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    op.execute("GRANT USAGE ON SCHEMA public TO hartonomous_reader")
    op.execute(f"GRANT SELECT ON {', '.join(READ_TABLES)} TO hartonomous_reader")
    op.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA public TO hartonomous_reader")
    # Partitions created by later builds are read through the parent, which needs no grant;
    # future functions get EXECUTE too.
    op.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public GRANT EXECUTE ON FUNCTIONS TO hartonomous_reader")


def downgrade() -> None:
    op.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA public REVOKE EXECUTE ON FUNCTIONS FROM hartonomous_reader")
    op.execute("REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA public FROM hartonomous_reader")
    op.execute(f"REVOKE SELECT ON {', '.join(READ_TABLES)} FROM hartonomous_reader")
    op.execute("REVOKE USAGE ON SCHEMA public FROM hartonomous_reader")
