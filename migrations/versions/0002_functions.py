"""Database functions: context_centroid, next_token (+ batch), seeded_uniform, sampling, generation.

The sources live in `sql/` (the single source; `hartonomous db` checks installed functions
against it). They run on the raw psycopg connection so that neither SQLAlchemy's `:name` bind
parsing nor psycopg's `%` placeholders touch the PL/pgSQL text.

Revision ID: 0002
Revises: 0001
"""
from alembic import op

from hartonomous.db.migrate import install_sql_functions, sql_function_names

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A query without parameters goes to the server as is (simple protocol, many statements).
    install_sql_functions(op.get_bind().connection.driver_connection.execute)


def downgrade() -> None:
    """Drop every overload of every function that `sql/` defines, the names read from pg_proc."""
    conn = op.get_bind().connection.driver_connection
    signatures = conn.execute(
        "SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = current_schema() AND p.proname = ANY(%s)", (sql_function_names(conn),)).fetchall()
    for (signature,) in signatures:
        conn.execute(f"DROP FUNCTION {signature}")
