"""The store's own distribution with its features: store_distribution, and hartonomous_kernel 1.4.

store_distribution(context, ...) (sql/090_store.sql) returns, per prefix, the kernel's distribution
before any sampler (next_token at temperature 1 without top-k, top-p or penalty) and the features a
gate mixing it with another model needs. Version 1.4 of the native kernel adds htk_store, its C
form, and the backoff kernel's tolerance (a nearest distance within bandwidth * 1e-12 counts as 0
and the radius is never below it), which sql/ of this revision applies in ht_backoff_radius too;
ht_kernel() is 'native' only at 1.4. The reader role may run store_distribution. The downgrade
drops the new functions and takes the extension back to 1.3, where the functions run the PL/pgSQL
path until sql/ of that revision is installed again.

Revision ID: 0016
Revises: 0015
"""
from alembic import op

from hartonomous.db.migrate import ensure_native_kernel_on, install_sql_functions

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

SIGNATURE = "store_distribution(integer[], text, integer, double precision, integer, boolean, integer)"


def upgrade() -> None:
    execute = op.get_bind().connection.driver_connection.execute
    ensure_native_kernel_on(execute)
    install_sql_functions(execute)
    execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO hartonomous_reader")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    op.execute("DROP FUNCTION IF EXISTS ht_store_step(integer[], geometry, geometry[], integer[], double precision[], "
               "double precision[], boolean[], text, double precision, double precision, double precision)")
    op.execute("DROP FUNCTION IF EXISTS ht_store_knn(integer, geometry, integer, boolean)")
    op.execute("""DO $$ BEGIN
        IF EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'hartonomous_kernel' AND extversion = '1.4') THEN
            ALTER EXTENSION hartonomous_kernel UPDATE TO '1.3';
        END IF;
    END $$""")
