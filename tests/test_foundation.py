"""Foundation: the embedded cluster, migrations up/down/up, schema, partition-local KNN, drift."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from hartonomous.db import migrate
from hartonomous.db.cluster import EmbeddedCluster, free_port

REPO = Path(__file__).resolve().parents[1]


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hartonomous.cli", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, cwd=REPO, timeout=300)


def test_extensions_are_installed(conn: psycopg.Connection) -> None:
    postgis, vector = conn.execute(
        "SELECT postgis_version(), (SELECT extversion FROM pg_extension WHERE extname = 'vector')"
    ).fetchone()
    assert postgis.startswith("3.")
    assert vector is not None


def test_migrate_up_down_up(scratch_database: str) -> None:
    migrate.upgrade(scratch_database)
    assert migrate.current_revision(scratch_database) == migrate.head_revision()
    migrate.downgrade(scratch_database, "base")
    with psycopg.connect(scratch_database) as conn:
        tables = {r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()}
    assert not tables & {"atom_sets", "tokens", "atoms", "landmarks"}
    assert migrate.current_revision(scratch_database) is None
    migrate.upgrade(scratch_database)
    assert migrate.current_revision(scratch_database) == migrate.head_revision()


def _add_atom_set(conn: psycopg.Connection, name: str) -> int:
    (set_id,) = conn.execute(
        "INSERT INTO atom_sets (name, model, vocab_size, embedding_dim, projection, kind) "
        "VALUES (%s, 'test', 4, 2, 'pca', 'token') RETURNING id", (name,)).fetchone()
    conn.execute(f"CREATE TABLE atoms_{set_id} PARTITION OF atoms FOR VALUES IN ({set_id})")
    conn.execute(
        "INSERT INTO atoms (atom_set_id, atom_id, token_id, position) "
        "SELECT %s, g, g %% 4, ST_MakePoint(random(), random(), random()) FROM generate_series(1, 200) g",
        (set_id,))
    return set_id


def test_knn_for_one_atom_set_reads_only_its_own_index(conn: psycopg.Connection) -> None:
    first = _add_atom_set(conn, "first")
    second = _add_atom_set(conn, "second")
    conn.execute("ANALYZE atoms")
    conn.execute("SET LOCAL enable_seqscan = off")
    plan = "\n".join(r[0] for r in conn.execute(
        f"EXPLAIN SELECT token_id FROM atoms WHERE atom_set_id = {second} "
        "ORDER BY position <<->> 'POINT Z (0.5 0.5 0.5)'::geometry LIMIT 10").fetchall())
    assert f"atoms_{second}_position_idx" in plan
    assert f"atoms_{first}_" not in plan
    assert "Index Scan" in plan and "Sort" not in plan


def test_geometry_must_be_3d_and_not_null(conn: psycopg.Connection) -> None:
    set_id = _add_atom_set(conn, "checks")
    with pytest.raises(psycopg.errors.NotNullViolation):
        with conn.transaction():
            conn.execute("INSERT INTO atoms (atom_set_id, atom_id, token_id, position) "
                         "VALUES (%s, 999, 1, NULL)", (set_id,))
    with pytest.raises(psycopg.Error):
        with conn.transaction():
            conn.execute("INSERT INTO atoms (atom_set_id, atom_id, token_id, position) "
                         "VALUES (%s, 998, 1, ST_MakePoint(0, 0))", (set_id,))


def test_only_one_default_atom_set(conn: psycopg.Connection) -> None:
    _add_atom_set(conn, "d1")
    _add_atom_set(conn, "d2")
    conn.execute("UPDATE atom_sets SET is_default = false")
    conn.execute("UPDATE atom_sets SET is_default = true WHERE name = 'd1'")
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute("UPDATE atom_sets SET is_default = true WHERE name = 'd2'")


def test_installed_functions_match_sql_sources(server_url: str) -> None:
    assert migrate.function_drift(server_url) == []


def test_drift_is_detected_and_repaired(scratch_database: str) -> None:
    migrate.upgrade(scratch_database)
    sources = migrate.sql_sources()
    if not sources:
        pytest.fail("sql/ holds no function sources")
    with psycopg.connect(scratch_database) as conn:
        (name, args) = conn.execute(
            "SELECT p.proname, pg_get_function_identity_arguments(p.oid) FROM pg_proc p "
            "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'public' "
            "AND p.proname = 'context_centroid' LIMIT 1").fetchone()
        conn.execute(f"ALTER FUNCTION {name}({args}) SET work_mem = '1MB'")
        conn.commit()
    drift = migrate.function_drift(scratch_database)
    assert drift and "context_centroid" in drift[0]
    migrate.reinstall_sql_functions(scratch_database)
    assert migrate.function_drift(scratch_database) == []


def test_embedded_cluster_lifecycle(tmp_path_factory: pytest.TempPathFactory) -> None:
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="hartonomous-lifecycle-"))
    root.chmod(0o755)
    cluster = EmbeddedCluster(root / "pg")
    try:
        assert cluster.up() == "created and started"
        assert cluster.up() == "already running"
        pid = cluster.running_pid()
        with psycopg.connect(cluster.url()) as conn:
            assert conn.execute("SELECT extname FROM pg_extension WHERE extname = 'vector'").fetchone()
        # An unclean shutdown (SIGKILL) leaves a stale postmaster.pid; `up` recovers.
        os.kill(pid, 9)
        import time
        for _ in range(50):
            if cluster.running_pid() is None:
                break
            time.sleep(0.1)
        assert cluster.up() == "started"
        with psycopg.connect(cluster.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert cluster.down() == "stopped"
        assert cluster.status()["running"] is False
        assert cluster.down() == "not running"
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def test_taken_port_is_one_clear_line(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        root = Path(tempfile_dir())
        try:
            result = _cli("db", "up", env={"HARTONOMOUS_DATA_DIR": str(root / "pg"),
                                          "HARTONOMOUS_DB_PORT": str(port)})
        finally:
            import shutil

            EmbeddedCluster(root / "pg").down()
            shutil.rmtree(root, ignore_errors=True)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert f"port {port} is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_database_url_is_one_clear_line() -> None:
    port = free_port()
    result = _cli("migrate", env={"HARTONOMOUS_DATABASE_URL": f"postgresql://u:p@127.0.0.1:{port}/x"})
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "HARTONOMOUS_DATABASE_URL" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_postgres_binaries_is_one_clear_line(tmp_path: Path) -> None:
    result = _cli("db", "up", env={"HARTONOMOUS_DATA_DIR": str(tmp_path / "pg"),
                                  "HARTONOMOUS_PG_BIN": str(tmp_path / "nowhere"),
                                  "PATH": "/nonexistent"})
    assert result.returncode == 1
    assert "HARTONOMOUS_PG_BIN" in result.stderr and "initdb" in result.stderr
    assert result.stderr.strip().count("\n") == 0


def tempfile_dir() -> str:
    import tempfile

    d = tempfile.mkdtemp(prefix="hartonomous-port-")
    os.chmod(d, 0o755)
    return d
