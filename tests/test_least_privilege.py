"""The reader role runs inference and nothing else; functions are SECURITY INVOKER with a pinned search_path."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set

INFERENCE_FUNCTIONS = ("next_token", "context_centroid", "sample_next_token", "generate_tokens",
                       "next_token_batch", "seeded_uniform")


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
    rows = conn.execute(
        "SELECT p.proname, p.prosecdef, p.proconfig FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = 'public' AND p.proname = ANY(%s)", (list(INFERENCE_FUNCTIONS),)).fetchall()
    assert {r[0] for r in rows} == set(INFERENCE_FUNCTIONS)
    for name, security_definer, config in rows:
        assert security_definer is False, name
        assert any(c.startswith("search_path=") for c in (config or [])), name
