"""Database functions: context_centroid, next_token (+ batch), seeded_uniform, sampling, generation.

The sources live in `sql/` (the single source; `hartonomous db` checks installed functions
against it). They run on the raw psycopg connection so that neither SQLAlchemy's `:name` bind
parsing nor psycopg's `%` placeholders touch the PL/pgSQL text.

Revision ID: 0002
Revises: 0001
"""
from alembic import op

from hartonomous.db.migrate import install_sql_functions

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

FUNCTIONS = (
    "draft_tokens", "generate_tokens", "sample_next_token", "ht_sample", "seeded_uniform",
    "next_token_batch", "next_token", "ht_next_token", "ht_check_sampler_args",
    "context_centroid", "ht_context_centroid", "ht_check_context", "ht_atom_set",
)


def upgrade() -> None:
    # A query without parameters goes to the server as is (simple protocol, many statements).
    install_sql_functions(op.get_bind().connection.driver_connection.execute)


def downgrade() -> None:
    names = ", ".join(f"'{name}'" for name in FUNCTIONS)
    op.get_bind().connection.driver_connection.execute(f"""
        DO $$
        DECLARE f regprocedure;
        BEGIN
            FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
                       JOIN pg_namespace n ON n.oid = p.pronamespace
                      WHERE n.nspname = current_schema() AND p.proname IN ({names})
            LOOP
                EXECUTE 'DROP FUNCTION ' || f;
            END LOOP;
        END $$""")
