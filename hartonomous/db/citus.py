"""How the schema lives on a Citus cluster: which tables are distributed, and how.

One home for the decisions (docs/scale-out.md explains them):

- `atoms` is hash-distributed on `route` (migration 0018; before it, on `atom_id`). On a set that
  routes (a lattice set, `atom_sets.route_spread`) `route` is the lattice cell of the atom's
  position, so all atoms whose key ends in one token lie on one shard and a KNN filtered on that
  cell is a router query: one worker, no merge (sql/015_knn.sql decides when that answer is
  provably the whole one, and falls back to the fan-out otherwise). On other sets `route` is the
  atom's id: the set is spread evenly over all workers and a KNN runs on every shard of the set,
  the coordinator merging the k nearest of each, which is exact.
- `memory_atoms` (generation memory) is distributed on `route` too, colocated with `atoms`.
- The per-atom-set LIST partitioning stays: each set is a partition of `atoms`, itself a
  distributed table colocated with it, so a KNN for one set touches only that set's shards and
  indexes, and dropping a set drops its shards (no DELETE of millions of rows).
- `atom_sets`, `tokens`, `token_blocks` and `landmarks` are small and read by every call:
  reference tables, a copy on every node including the coordinator, where the functions of `sql/`
  read them locally.
- `atom_tiles` (the tiles layout, issue 18) is hash-distributed on `tile_id` so the schema
  distributes as a whole, but the tiles layout itself is single-node: its exact KNN visits tiles
  one by one from PL/pgSQL, which Citus cannot push down, so a build on a coordinator refuses
  `--layout tiles` (hartonomous/atomset/write.py) and the cluster uses rows.

Everything here is a no-op on a server without the citus extension.
"""

from __future__ import annotations

import psycopg

DISTRIBUTION_COLUMN = "atom_id"   # migration 0008's; 0018 redistributes by ROUTE_COLUMN
ROUTE_COLUMN = "route"
MEMORY_TABLE = "memory_atoms"
REFERENCE_TABLES = ("atom_sets", "tokens", "token_blocks", "landmarks")  # in foreign-key order
DISTRIBUTED_TABLE = "atoms"
TILES_TABLE, TILES_COLUMN = "atom_tiles", "tile_id"
HAS_CITUS = "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')"
# What Citus made of a table: 'h' hash-distributed, 'n' + 't' reference, 'n' + 's' a Citus local
# table (a table that references a reference table becomes one: it is still to be distributed).
TABLE_KIND = """SELECT CASE WHEN partmethod = 'h' THEN 'distributed'
                            WHEN partmethod = 'n' AND repmodel = 't' THEN 'reference'
                            ELSE 'local' END
                 FROM pg_dist_partition WHERE logicalrelid = to_regclass(%s)"""


def has_citus(conn: psycopg.Connection) -> bool:
    """Whether the server we are connected to has the citus extension (a coordinator)."""
    return bool(conn.execute(HAS_CITUS).fetchone()[0])


def table_kind(conn: psycopg.Connection, table: str) -> str:
    """'distributed', 'reference', or 'local' (a plain table, or a Citus local table)."""
    row = conn.execute(TABLE_KIND, (table,)).fetchone()
    return row[0] if row else "local"


def distribute_schema(conn: psycopg.Connection) -> list[str]:
    """Make the reference tables and distribute `atoms` (with the partitions it has); idempotent.
    Returns what was done."""
    if not has_citus(conn):
        return []
    done = []
    for table in REFERENCE_TABLES:
        if table_kind(conn, table) != "reference":
            conn.execute("SELECT create_reference_table(%s)", (table,))
            done.append(f"reference table {table}")
    if table_kind(conn, DISTRIBUTED_TABLE) != "distributed":
        conn.execute("SELECT create_distributed_table(%s, %s)", (DISTRIBUTED_TABLE, DISTRIBUTION_COLUMN))
        done.append(f"{DISTRIBUTED_TABLE} hash-distributed on {DISTRIBUTION_COLUMN}")
    if table_kind(conn, TILES_TABLE) != "distributed":
        conn.execute("SELECT create_distributed_table(%s, %s)", (TILES_TABLE, TILES_COLUMN))
        done.append(f"{TILES_TABLE} hash-distributed on {TILES_COLUMN}")
    return done


def distribution_column(conn: psycopg.Connection, table: str) -> str | None:
    """The column a distributed table is hash-distributed on (None: not distributed)."""
    row = conn.execute("SELECT column_to_column_name(logicalrelid, partkey) FROM pg_dist_partition "
                       "WHERE logicalrelid = to_regclass(%s) AND partmethod = 'h'", (table,)).fetchone()
    return row[0] if row else None


def _drop_primary_key(conn: psycopg.Connection, table: str) -> None:
    (name,) = conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p'",
                           (table,)).fetchone()
    conn.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")


def distribute_routing(conn: psycopg.Connection) -> list[str]:
    """Migration 0018 on a coordinator: `atoms` and `memory_atoms` distributed on `route`,
    colocated, with `route` in their primary keys; nothing on a single node. Needs an empty
    `atoms` (existing sets are rebuilt, not back-filled); raises with what to do otherwise."""
    if not has_citus(conn) or distribution_column(conn, DISTRIBUTED_TABLE) == ROUTE_COLUMN:
        return []
    (atoms,) = conn.execute("SELECT count(*) FROM atom_sets").fetchone()
    if atoms:
        raise RuntimeError(
            f"migration 0018 redistributes atoms by their routing key, but this Citus coordinator holds "
            f"{atoms} atom set(s) built before it, which have none. Drop them (`hartonomous atom-sets drop "
            f"NAME`), run `hartonomous migrate` again, and rebuild them")
    # A primary key must hold the distribution column: drop it, redistribute, add the new one.
    _drop_primary_key(conn, DISTRIBUTED_TABLE)
    conn.execute(f"ALTER TABLE {DISTRIBUTED_TABLE} ALTER COLUMN route SET NOT NULL")
    if table_kind(conn, DISTRIBUTED_TABLE) == "distributed":
        conn.execute("SELECT alter_distributed_table(%s, distribution_column => %s, cascade_to_colocated => false)",
                     (DISTRIBUTED_TABLE, ROUTE_COLUMN))
    else:
        conn.execute("SELECT create_distributed_table(%s, %s)", (DISTRIBUTED_TABLE, ROUTE_COLUMN))
    conn.execute(f"ALTER TABLE {DISTRIBUTED_TABLE} ADD PRIMARY KEY (atom_set_id, route, atom_id)")
    if distribution_column(conn, MEMORY_TABLE) == ROUTE_COLUMN:  # kept by a downgrade: colocate it again
        conn.execute("SELECT alter_distributed_table(%s, colocate_with => %s)", (MEMORY_TABLE, DISTRIBUTED_TABLE))
    else:
        _drop_primary_key(conn, MEMORY_TABLE)
        conn.execute(f"ALTER TABLE {MEMORY_TABLE} ALTER COLUMN route SET NOT NULL")
        conn.execute(f"ALTER TABLE {MEMORY_TABLE} ADD PRIMARY KEY (atom_set_id, route, generation, step)")
        conn.execute("SELECT create_distributed_table(%s, %s, colocate_with => %s)",
                     (MEMORY_TABLE, ROUTE_COLUMN, DISTRIBUTED_TABLE))
    return [f"{DISTRIBUTED_TABLE} and {MEMORY_TABLE} hash-distributed on {ROUTE_COLUMN}, colocated"]


def undistribute_routing(conn: psycopg.Connection) -> None:
    """The reverse of `distribute_routing` for `atoms` (before 0018's downgrade): back on `atom_id`
    with its old primary key, the calls no longer routed. `memory_atoms` stays distributed on
    `route`: Citus makes a distributed table local again only by undistributing it together with the
    reference table it references (atom_sets), or, with the foreign key dropped and added back, by
    converting it, which fails for a partitioned table with partitions ("child table is missing
    constraint"). The functions installed at 0018, which the downgrade keeps, write its `route`."""
    if not has_citus(conn) or distribution_column(conn, DISTRIBUTED_TABLE) != ROUTE_COLUMN:
        return
    _drop_primary_key(conn, DISTRIBUTED_TABLE)
    conn.execute("SELECT alter_distributed_table(%s, distribution_column => %s, cascade_to_colocated => false)",
                 (DISTRIBUTED_TABLE, DISTRIBUTION_COLUMN))
    conn.execute(f"ALTER TABLE {DISTRIBUTED_TABLE} ALTER COLUMN route DROP NOT NULL")
    conn.execute(f"ALTER TABLE {DISTRIBUTED_TABLE} ADD PRIMARY KEY (atom_set_id, atom_id)")
    conn.execute("CREATE OR REPLACE FUNCTION ht_routes() RETURNS boolean LANGUAGE sql IMMUTABLE "
                 "PARALLEL SAFE SET search_path = public, pg_temp AS 'SELECT false'")


def undistribute_schema(conn: psycopg.Connection) -> None:
    """The reverse of `distribute_schema`: every table back to a local one on the coordinator."""
    if not has_citus(conn):
        return
    for table in (TILES_TABLE, DISTRIBUTED_TABLE, *reversed(REFERENCE_TABLES)):
        if table_kind(conn, table) != "local":
            conn.execute("SELECT undistribute_table(%s, cascade_via_foreign_keys => true)", (table,))


GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
CUSTOM_PLANS = "SET plan_cache_mode = force_custom_plan"
SINGLE_NODE = "AS 'SELECT false' -- ht_routes: true where installed on a Citus coordinator"
COORDINATOR = "AS 'SELECT true' -- ht_routes: true where installed on a Citus coordinator"


def function_source(text: str, citus: bool) -> str:
    """A `sql/` file as it is installed: on a coordinator, the functions plan each call's
    statements with their parameter values (custom plans). Citus plans a multi-shard query with a
    LIMIT inside a CTE only for known values; a generic plan fails with "could not create
    distributed plan" (the KNN's pruning and pushdown need the atom set id and the centroid). And
    `ht_routes()` says true there: the KNN of a set that routes tries its cell first (sql/015)."""
    if not citus:
        return text
    # The routed KNN counts its decisions in session settings, which cannot change in a parallel
    # worker: on a coordinator no function of sql/ runs in one.
    return (text.replace(GENERIC_PLANS, CUSTOM_PLANS).replace(SINGLE_NODE, COORDINATOR)
            .replace("PARALLEL SAFE", "PARALLEL RESTRICTED"))


def begin_build(conn: psycopg.Connection) -> bool:
    """At the start of a build's transaction on a coordinator: run the distributed commands one
    connection per node. The coordinator holds a copy of the reference tables, so the build's
    first statements run there locally, and Citus refuses a later parallel command (the ANALYZE
    of a reference table, a DDL on the shards) in a transaction that already ran locally. True on a coordinator."""
    if not has_citus(conn):
        return False
    conn.execute("SET LOCAL citus.enable_local_execution TO off")
    return True


def distribute_partition(conn: psycopg.Connection, table: str) -> bool:
    """Distribute a new, still empty atoms partition like `atoms` before it is filled (so COPY
    through the coordinator routes rows to the shards and CREATE INDEX builds one GiST per
    shard); False on a single node, where nothing changes."""
    column = distribution_column(conn, DISTRIBUTED_TABLE) if has_citus(conn) else None
    if column is None:
        return False
    conn.execute("SELECT create_distributed_table(%s, %s, colocate_with => %s)", (table, column, DISTRIBUTED_TABLE))
    return True
