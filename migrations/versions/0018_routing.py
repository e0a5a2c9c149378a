"""Routing keys: atoms and memory atoms carry the lattice cell of their key's last token.

`atoms.route` and `memory_atoms.route` (bigint): on a set that routes (`atom_sets.route_spread` is
set: a lattice set, whose every key lies within route_spread of its cell's centre on each axis),
the cell code of the atom's position (`ht_route_cell`, sql/015_knn.sql); on other sets the atom's
id (spread evenly, as before). On a single node nothing else changes: the KNN reads the set as
before and the column is not used. On a Citus coordinator `atoms` and `memory_atoms` are
distributed by `route`, colocated, with `route` in their primary keys, so a KNN filtered on one
cell is a router query to one worker (hartonomous/db/citus.py, docs/scale-out.md).

The downgrade redistributes `atoms` by atom_id on Citus (`memory_atoms` stays distributed by
route: hartonomous/db/citus.py undistribute_routing says why) and keeps the columns: the functions
of sql/ installed at 0018 (remember() among them) read them, and a later upgrade adds them only
where missing.

Existing atom sets are not back-filled: their `route` stays NULL and their `route_spread` NULL,
so they answer as before. To route a set on Citus, rebuild it. A Citus coordinator that already
holds atoms cannot be redistributed in place: the migration stops and says so (drop the sets,
migrate, rebuild them).

Revision ID: 0018
Revises: 0017
"""
import sys

from alembic import op

from hartonomous.db.citus import distribute_routing, undistribute_routing
from hartonomous.db.migrate import install_sql_functions

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    op.execute("ALTER TABLE atom_sets ADD COLUMN IF NOT EXISTS route_spread double precision "
               "CONSTRAINT atom_sets_route_spread_check CHECK (route_spread > 0 AND route_spread < 0.5)")
    op.execute("ALTER TABLE atoms ADD COLUMN IF NOT EXISTS route bigint")
    op.execute("ALTER TABLE memory_atoms ADD COLUMN IF NOT EXISTS route bigint")
    (sets,) = conn.execute("SELECT count(*) FROM atom_sets").fetchone()
    if sets:
        print(f"migration 0018: {sets} atom set(s) built before routing keys keep answering as before "
              "(they are not back-filled); rebuild a set to route its calls on Citus", file=sys.stderr)
    distribute_routing(conn)
    install_sql_functions(conn.execute)


def downgrade() -> None:
    conn = op.get_bind().connection.driver_connection
    undistribute_routing(conn)
    # The columns stay (unused by a revision before 0018): the functions of sql/ installed at 0018
    # read them until 0002's downgrade drops the functions, and remember() writes route.
