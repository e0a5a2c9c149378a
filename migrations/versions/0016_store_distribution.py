"""The store's own distribution with its features: store_distribution.

store_distribution(context, ...) (sql/090_store.sql) returns, per prefix, the kernel's distribution
before any sampler (next_token at temperature 1 without top-k, top-p or penalty) and the features a
gate mixing it with another model needs. Version 1.4 of the native kernel, which this revision
first installed, added htk_store, its C form, and the backoff kernel's tolerance (a nearest distance
within bandwidth * 1e-12 counts as 0 and the radius is never below it), which sql/ applies in
ht_backoff_radius too. Since the kernel's cut (0019) its one version is installed there and none
below it (docs/sql.md "The native kernel"). The reader role may run store_distribution. The
downgrade drops the new functions.

Revision ID: 0016
Revises: 0015
"""
from alembic import op

from hartonomous.db.migrate import install_sql_functions

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

SIGNATURE = "store_distribution(integer[], text, integer, double precision, integer, boolean, integer)"


def upgrade() -> None:
    execute = op.get_bind().connection.driver_connection.execute
    install_sql_functions(execute)
    execute(f"GRANT EXECUTE ON FUNCTION {SIGNATURE} TO hartonomous_reader")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION IF EXISTS {SIGNATURE}")
    op.execute("DROP FUNCTION IF EXISTS ht_store_step(integer[], geometry, geometry[], integer[], double precision[], "
               "double precision[], boolean[], text, double precision, double precision, double precision)")
    op.execute("DROP FUNCTION IF EXISTS ht_store_knn(integer, geometry, integer, boolean)")
