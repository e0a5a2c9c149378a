"""The SQLAlchemy models (hartonomous/db/models.py) describe exactly the schema the migrations create.

Alembic's autogenerate compares `Base.metadata` with a database migrated from empty to head, in
the geoalchemy2 style (its `include_object`; spatial_ref_sys, alembic_version and the schemas of
the extensions, such as tiger and topology, are not ours). Columns, types, nullability, server
defaults, keys, foreign keys and indexes are compared. What autogenerate cannot see is left out:
`atoms` being PARTITION BY LIST (and the `atoms_<id>` partitions builds add), the expressions of
CHECK constraints (only their names are compared, below), the functions in sql/
(`migrate.function_drift` checks those), grants and role settings (tests/test_least_privilege.py).
"""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from geoalchemy2 import alembic_helpers
from sqlalchemy import CheckConstraint, create_engine, pool

from hartonomous.db import migrate
from hartonomous.db.connection import sqlalchemy_url
from hartonomous.db.models import Base

NOT_OURS = {"spatial_ref_sys", "alembic_version"}
PARTITION = re.compile(r"^(atoms|atom_tiles|memory_atoms)_\d+$")


def include_object(obj, name, type_, reflected, compare_to) -> bool:
    if type_ == "table" and (name in NOT_OURS or PARTITION.match(name or "")):
        return False
    return alembic_helpers.include_object(obj, name, type_, reflected, compare_to)


def include_name(name, type_, parent_names) -> bool:
    """Only the public schema: extensions' schemas (tiger, topology) are not ours."""
    return type_ != "schema" or name in (None, "public")


@pytest.fixture(scope="module")
def migrated_url(server_url: str):
    """A new database migrated from empty to head, so other tests' atom sets are not in it."""
    name = f"models_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = server_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        migrate.upgrade(url)
        yield url
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def differences(url: str) -> list:
    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={
                "compare_type": True, "compare_server_default": True,
                "include_object": include_object, "include_name": include_name,
            })
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


def test_models_match_the_migrated_database(migrated_url: str) -> None:
    diff = differences(migrated_url)
    assert diff == [], "models.py and the migrations differ:\n" + "\n".join(map(repr, diff))


def test_check_constraints_have_the_same_names(migrated_url: str) -> None:
    """autogenerate ignores CHECK constraints; their names at least must agree."""
    in_models = {(table.name, c.name) for table in Base.metadata.tables.values()
                 for c in table.constraints if isinstance(c, CheckConstraint)}
    with psycopg.connect(migrated_url) as conn:
        in_database = set(conn.execute(
            "SELECT t.relname, c.conname FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid "
            "WHERE c.contype = 'c' AND t.relnamespace = 'public'::regnamespace AND NOT t.relispartition "
            "AND t.relname = ANY(%s)", (list(Base.metadata.tables),)).fetchall())
    assert ("atom_sets", "atom_sets_history_weight_check") in in_database
    assert in_models == in_database
