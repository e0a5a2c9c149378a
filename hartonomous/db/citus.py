"""How the schema lives on a Citus cluster: which tables are distributed, and how.

One home for the decisions (docs/scale-out.md explains them):

- `atoms` is hash-distributed on `atom_id`, so every atom set is spread evenly over all workers
  and each shard keeps its own GiST nd index; a KNN (`ORDER BY position <<->> c LIMIT k`) runs on
  every shard of the set and the coordinator merges the k nearest of each, which is exact.
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

DISTRIBUTION_COLUMN = "atom_id"
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


def undistribute_schema(conn: psycopg.Connection) -> None:
    """The reverse of `distribute_schema`: every table back to a local one on the coordinator."""
    if not has_citus(conn):
        return
    for table in (TILES_TABLE, DISTRIBUTED_TABLE, *reversed(REFERENCE_TABLES)):
        if table_kind(conn, table) != "local":
            conn.execute("SELECT undistribute_table(%s, cascade_via_foreign_keys => true)", (table,))


GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
CUSTOM_PLANS = "SET plan_cache_mode = force_custom_plan"


def function_source(text: str, citus: bool) -> str:
    """A `sql/` file as it is installed: on a coordinator, the functions plan each call's
    statements with their parameter values (custom plans). Citus plans a multi-shard query with a
    LIMIT inside a CTE only for known values; a generic plan fails with "could not create
    distributed plan" (the KNN's pruning and pushdown need the atom set id and the centroid)."""
    return text.replace(GENERIC_PLANS, CUSTOM_PLANS) if citus else text


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
    if not has_citus(conn) or table_kind(conn, DISTRIBUTED_TABLE) != "distributed":
        return False
    conn.execute("SELECT create_distributed_table(%s, %s, colocate_with => %s)",
          (table, DISTRIBUTION_COLUMN, DISTRIBUTED_TABLE))
    return True
