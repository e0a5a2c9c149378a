"""The reader role runs inference and nothing else; functions are SECURITY INVOKER with a pinned search_path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import psycopg
import pytest

from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
from hartonomous.db.migrate import MIGRATIONS_DIR, sql_function_names


def reader_statement_timeout() -> str:
    """The value migration 0004 gives the reader role (READER_STATEMENT_TIMEOUT)."""
    path = next(Path(MIGRATIONS_DIR, "versions").glob("0004_*.py"))
    spec = importlib.util.spec_from_file_location("migration_0004", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.READER_STATEMENT_TIMEOUT


@pytest.fixture(scope="module")
def small_set(server_url: str) -> str:
    rng = np.random.default_rng(7)
    with psycopg.connect(server_url) as conn:
        write_atom_set(
            conn,
            AtomSetSpec(name="privilege-test", model="synthetic", vocab_size=20, embedding_dim=0,
                        projection="synthetic", kind="context"),
            TokenRows(np.arange(20), [f"t{i}" for i in range(20)], rng.random((20, 3))),
            AtomRows(rng.integers(0, 20, 500), rng.random((500, 3))),
            replace=True,
        )
    return "privilege-test"


def test_reader_can_run_inference(reader_url: str, small_set: str) -> None:
    with psycopg.connect(reader_url) as conn:
        rows = conn.execute("SELECT * FROM next_token(ARRAY[1, 2, 3], atom_set => %s)", (small_set,)).fetchall()
        assert rows and abs(rows[-1][2] - 1.0) < 1e-9
        generated = conn.execute("SELECT generate_tokens(ARRAY[1, 2], 5, atom_set => %s, seed => 1)",
                                 (small_set,)).fetchone()[0]
        assert len(generated) >= 1


@pytest.mark.parametrize("statement", [
    "INSERT INTO atom_sets (name, model, vocab_size, embedding_dim, projection, kind) "
    "VALUES ('x', 'x', 1, 1, 'x', 'token')",
    "UPDATE atom_sets SET bandwidth = 2",
    "DELETE FROM tokens",
    "DROP TABLE atoms",
    "TRUNCATE landmarks",
    "CREATE TABLE evil (id int)",
    "CREATE OR REPLACE FUNCTION next_token_evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "ALTER TABLE atom_sets ADD COLUMN evil int",
])
def test_reader_cannot_write_or_drop(reader_url: str, small_set: str, statement: str) -> None:
    with psycopg.connect(reader_url) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(statement)


def test_reader_is_not_privileged(reader_url: str) -> None:
    with psycopg.connect(reader_url) as conn:
        row = conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles "
                           "WHERE rolname = current_user").fetchone()
    assert row == (False, False, False, False)


def test_functions_are_invoker_with_pinned_search_path(conn: psycopg.Connection) -> None:
    """Every function sql/ defines (names from pg_proc after a scratch install, not a list kept here)."""
    names = sql_function_names(conn)
    assert {"next_token", "generate_tokens"} <= set(names)
    rows = conn.execute(
        "SELECT p.proname, p.prosecdef, p.proconfig FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'public' AND p.proname = ANY(%s)", (names,)).fetchall()
    assert {r[0] for r in rows} == set(names)
    for name, security_definer, config in rows:
        assert security_definer is False, name
        assert any(c.startswith("search_path=") for c in (config or [])), name


# --- statement_timeout: a reader cannot hold a backend indefinitely ---------------------------

def test_reader_sessions_start_with_the_migrations_statement_timeout(server_url: str, reader_url: str) -> None:
    """Migration 0004 sets READER_STATEMENT_TIMEOUT as the role's default (pg_settings source 'user');
    the owner, which builds and migrates, keeps the server's default (no limit)."""
    with psycopg.connect(server_url) as owner:
        expected = owner.execute("SELECT set_config('statement_timeout', %s, true)",
                                 (reader_statement_timeout(),)).fetchone()[0]  # PostgreSQL's spelling
        owner.rollback()
        assert owner.execute("SHOW statement_timeout").fetchone()[0] == "0"
    assert reader_statement_timeout() == "60s"
    with psycopg.connect(reader_url) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == expected == "1min"
        assert conn.execute("SELECT source FROM pg_settings WHERE name = 'statement_timeout'").fetchone()[0] == "user"


def test_a_reader_statement_over_the_limit_is_cancelled(reader_url: str, small_set: str) -> None:
    """The limit cancels the statement (SQLSTATE 57014) and the session stays usable; shown with the
    limit lowered for one transaction so the test takes a fraction of a second, not a minute."""
    with psycopg.connect(reader_url) as conn:
        conn.execute("SET LOCAL statement_timeout = '100ms'")
        with pytest.raises(psycopg.errors.QueryCanceled) as caught:
            conn.execute("SELECT pg_sleep(5)")
        assert caught.value.sqlstate == "57014" and "statement timeout" in str(caught.value)
        conn.rollback()
        assert conn.execute("SHOW statement_timeout").fetchone()[0] == "1min"  # the role default again
        rows = conn.execute("SELECT * FROM next_token(ARRAY[1, 2], atom_set => %s)", (small_set,)).fetchall()
        assert rows
