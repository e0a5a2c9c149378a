"""Alembic upgrades/downgrades, and the SQL function sources in `sql/` with a drift check.

`sql/*.sql` is the single source of the database functions. The files create functions with
unqualified names (they land in the first schema of the search_path) so the drift check can
install them into a scratch schema and compare. Migrations install them with
`install_sql_functions`; `function_drift` compares what is installed with the files so an
edited file can never silently diverge from the database.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from hartonomous.db.citus import HAS_CITUS, function_source
from hartonomous.db.connection import owner_url, sqlalchemy_url
from hartonomous.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = REPO_ROOT / "migrations"
SQL_DIR = REPO_ROOT / "sql"
SCRATCH_SCHEMA = "hartonomous_drift_check"


def alembic_config(url: str | None = None) -> Config:
    if not MIGRATIONS_DIR.is_dir():
        raise UserError(f"migrations folder not found at {MIGRATIONS_DIR}; install the project with `pip install -e .`")
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = url or owner_url()
    return cfg


def upgrade(url: str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)
    if revision == "head":
        ensure_native_kernel(url)


NATIVE_KERNEL = "hartonomous_kernel"
KERNEL_DIR = REPO_ROOT / "ext" / NATIVE_KERNEL
# Whether the server has the extension, the version installed here (NULL: none), the newest the server
# has, the functions the installed extension holds, whether an update script leads from the installed
# version to the newest, and the objects outside it that depend on its functions.
_KERNEL_STATE = """
    SELECT a.name IS NOT NULL, e.extversion, a.default_version,
           ARRAY(SELECT p.proname::text FROM pg_depend d JOIN pg_proc p ON p.oid = d.objid
                  WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = e.oid
                    AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e'),
           EXISTS (SELECT 1 FROM pg_extension_update_paths(%(name)s) u
                    WHERE e.extversion IS NOT NULL AND u.source = e.extversion
                      AND u.target = a.default_version AND u.path IS NOT NULL),
           ARRAY(SELECT DISTINCT pg_describe_object(d.classid, d.objid, d.objsubid)
                   FROM pg_depend d JOIN pg_depend m ON m.classid = 'pg_proc'::regclass AND m.objid = d.refobjid
                  WHERE d.refclassid = 'pg_proc'::regclass AND d.deptype = 'n'
                    AND m.refclassid = 'pg_extension'::regclass AND m.refobjid = e.oid AND m.deptype = 'e')
      FROM (SELECT 1) one
      LEFT JOIN pg_available_extensions a ON a.name = %(name)s
      LEFT JOIN pg_extension e ON e.extname = %(name)s"""


def kernel_functions(version: str) -> set[str]:
    """The functions version `version` of the native kernel declares (its install script in this
    checkout's ext/hartonomous_kernel; empty where the checkout lacks it)."""
    script = KERNEL_DIR / f"{NATIVE_KERNEL}--{version}.sql"
    return set(re.findall(r"^CREATE FUNCTION (\w+)\(", script.read_text(), re.M)) if script.is_file() else set()


def ensure_native_kernel_on(execute) -> bool:
    """Bring the native kernel of this database to the newest version the server has (`make install`
    builds it): CREATE EXTENSION where it is missing; ALTER EXTENSION ... UPDATE where a script leads
    from the installed version to the newest and the installed one holds every function the newest
    declares; otherwise (a version before the cut, or one amended in place that lacks a function:
    the version string alone is not trusted) DROP and CREATE, as the extension holds no data. Refuses,
    saying what to do, where objects outside it depend on its functions. True when it is installed
    afterwards. `execute` is a psycopg connection's or cursor's."""
    available, installed, newest, members, has_path, dependents = execute(
        _KERNEL_STATE, {"name": NATIVE_KERNEL}).fetchone()
    if not available:
        return False
    if installed is None:
        execute(f"CREATE EXTENSION IF NOT EXISTS {NATIVE_KERNEL}")
        return True
    complete = kernel_functions(newest) <= set(members)
    if installed == newest and complete:
        return True
    if has_path and complete:
        execute(f"ALTER EXTENSION {NATIVE_KERNEL} UPDATE")
        return True
    if dependents:
        raise UserError(
            f"{NATIVE_KERNEL} {installed} cannot be brought to {newest} in place, and it must be installed afresh, "
            f"but {', '.join(dependents)} depend on its functions: drop them, then run `hartonomous migrate` again")
    execute(f"DROP EXTENSION {NATIVE_KERNEL}")
    execute(f"CREATE EXTENSION {NATIVE_KERNEL}")
    return True


def drop_native_kernel(execute) -> None:
    execute(f"DROP EXTENSION IF EXISTS {NATIVE_KERNEL}")


def ensure_native_kernel(url: str | None = None) -> bool:
    """ensure_native_kernel_on for a database already migrated (the server may have gained the
    extension, or a newer version of it, since)."""
    with psycopg.connect(url or owner_url(), autocommit=True) as conn:
        return ensure_native_kernel_on(conn.execute)


def active_kernel(url: str | None = None) -> dict:
    """Which next_token implementation runs (SQL ht_kernel()), and whether the server has the
    native one available: for `hartonomous db status`."""
    with psycopg.connect(url or owner_url(), autocommit=True) as conn:
        available, installed, *_ = conn.execute(_KERNEL_STATE, {"name": NATIVE_KERNEL}).fetchone()
        active = conn.execute("SELECT ht_kernel()").fetchone()[0] if conn.execute(
            "SELECT to_regproc('ht_kernel') IS NOT NULL").fetchone()[0] else "plpgsql"
    return {"kernel": active, "kernel_available": bool(available), "kernel_installed": installed is not None}


def downgrade(url: str | None = None, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str | None = None) -> str | None:
    engine = create_engine(sqlalchemy_url(url or owner_url()), poolclass=pool.NullPool)
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()


def sql_sources() -> list[Path]:
    """The function sources, in install order (file name order)."""
    return sorted(SQL_DIR.glob("*.sql"))


def sql_source_texts(execute) -> list[str]:
    """The `sql/*.sql` texts as this server installs them (a Citus coordinator plans them per
    call: hartonomous/db/citus.py); `execute` is a psycopg connection's or cursor's."""
    citus = bool(execute(HAS_CITUS).fetchone()[0])
    return [function_source(path.read_text(), citus) for path in sql_sources()]


def install_sql_functions(execute) -> None:
    """Run every `sql/*.sql` file through `execute(text)` (a psycopg connection's or cursor's)."""
    for text in sql_source_texts(execute):
        execute(text)


# What the functions of sql/ read that not every revision has: a table, or a table's column. sql/ is
# written for the schema at head; a migration below head installs it too, and a downgrade keeps the
# functions installed at head, so after every migration (migrations/env.py) a function is kept only
# where everything it reads exists: a downgrade that removes what it reads removes it, and a later
# migration that installs sql/ brings it back.
# Every function but those that read no table (SQL_SCHEMA_FREE: argument checks, arithmetic, the
# kernel's name, the routing counters) needs SQL_CORE_SCHEMA; the memory's, the draft sources' and the
# gates' need their own tables too, and two functions of sql/070_memory.sql the memory's policy.
# tests/test_migration_cycle.py calls every function left at every revision, so a function reading
# more than is listed here fails it.
SQL_CORE_SCHEMA = ("atom_sets.history_weight", "atom_sets.risk_model", "atom_sets.layout", "token_blocks",
                   "atom_tiles", "atoms.route", "atom_sets.route_spread")
SQL_SCHEMA_FREE = frozenset({
    "ht_atom_source", "ht_backoff_radius", "ht_check_between", "ht_check_context", "ht_check_finite_array",
    "ht_check_memory", "ht_check_sampler_args", "ht_check_seed_step", "ht_count_knn", "ht_kernel", "ht_linear",
    "ht_pick", "ht_risk", "ht_route_cell", "ht_routes", "ht_store_step", "ht_uniform", "knn_routing",
    "seeded_uniform"})
SQL_FILE_SCHEMA = {
    "070_memory.sql": ("memory_atoms", "memory_atoms.route", "memory_atoms.temperature", "memory_bounds"),
    "080_draft_sources.sql": ("atoms.source",),
    "095_gates.sql": ("augment_gates",),
    "100_sources.sql": ("memory_atoms", "atom_set_files", "atom_set_file_grams"),
}
SQL_FUNCTION_SCHEMA = {"set_memory_policy": ("memory_policies",), "memory_policy": ("memory_policies",)}
_DEFINED = re.compile(r"^CREATE (?:OR REPLACE )?FUNCTION (\w+)\(", re.M | re.I)


def sql_function_needs() -> dict[str, tuple[str, ...]]:
    """Each function sql/ defines: the tables and columns (`table.column`) it needs."""
    needs = {}
    for path in sql_sources():
        for name in _DEFINED.findall(path.read_text()):
            core = () if name in SQL_SCHEMA_FREE else SQL_CORE_SCHEMA
            needs[name] = core + SQL_FILE_SCHEMA.get(path.name, ()) + SQL_FUNCTION_SCHEMA.get(name, ())
    return needs


def _schema_has(execute, item: str) -> bool:
    table, _, column = item.partition(".")
    if not column:
        return execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
    return execute("SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = %s "
                   "AND NOT attisdropped)", (table, column)).fetchone()[0]


def drop_functions_without_their_schema(execute) -> list[str]:
    """Drop every overload of each function of sql/ whose tables or columns (sql_function_needs) this
    database lacks, so that no function is left to fail on a missing relation (42P01) or column
    (42703): migrations/env.py runs this after the migrations of every upgrade or downgrade, in
    their transaction. Returns the signatures dropped."""
    present: dict[str, bool] = {}

    def has(item: str) -> bool:
        if item not in present:
            present[item] = _schema_has(execute, item)
        return present[item]

    dropped = []
    for name, needs in sql_function_needs().items():
        if all(has(item) for item in needs):
            continue
        for (signature,) in execute("SELECT p.oid::regprocedure::text FROM pg_proc p JOIN pg_namespace n "
                                    "ON n.oid = p.pronamespace WHERE n.nspname = current_schema() "
                                    "AND p.proname = %s", (name,)).fetchall():
            execute(f"DROP FUNCTION {signature}")
            dropped.append(signature)
    return dropped


_FUNCTIONS = """
    SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' AS signature,
           md5(p.prosrc || coalesce(array_to_string(p.proconfig, ','), '')
               || pg_get_function_result(p.oid) || p.provolatile::text || p.prosecdef::text) AS digest
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = %s AND p.prokind IN ('f', 'p')
"""


def _in_scratch_schema(conn: psycopg.Connection, query: str) -> list[tuple]:
    """Install `sql/` into a scratch schema, run `query` (its one parameter: the scratch schema's
    name) and roll everything back; inside an open transaction this is a savepoint."""
    with conn.transaction(force_rollback=True):
        conn.execute(f"CREATE SCHEMA {SCRATCH_SCHEMA}")
        conn.execute(f"SET LOCAL search_path = {SCRATCH_SCHEMA}, public")
        for text in sql_source_texts(conn.execute):
            conn.execute(text)
        return conn.execute(query, (SCRATCH_SCHEMA,)).fetchall()


def sql_function_names(conn: psycopg.Connection) -> list[str]:
    """The name of every function `sql/` defines, as pg_proc lists them after a scratch install
    (no list kept by hand: a function added to sql/ is found here)."""
    rows = _in_scratch_schema(conn, "SELECT DISTINCT p.proname FROM pg_proc p JOIN pg_namespace n "
                                    "ON n.oid = p.pronamespace WHERE n.nspname = %s ORDER BY 1")
    return [name for (name,) in rows]


def function_drift(url: str | None = None) -> list[str]:
    """Functions whose installed definition differs from `sql/`, or that are missing."""
    url = url or owner_url()
    with psycopg.connect(url) as conn:
        installed = dict(conn.execute(_FUNCTIONS, ("public",)).fetchall())
        expected = dict(_in_scratch_schema(conn, _FUNCTIONS))
    problems = []
    for signature, digest in sorted(expected.items()):
        if signature not in installed:
            problems.append(f"{signature} is missing")
        elif installed[signature] != digest:
            problems.append(f"{signature} differs from sql/")
    return problems


def reinstall_sql_functions(url: str | None = None) -> None:
    with psycopg.connect(url or owner_url()) as conn:
        with conn.transaction():
            install_sql_functions(conn.execute)
