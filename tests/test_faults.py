"""Faults on a throwaway embedded cluster of its own: restarts and crashes in the middle of a generation.

- a clean restart (pg_ctl stop -m fast, then `up`) between two steps and during an in-database
  generation: the client reconnects with backoff and the generation resumes, with exactly the
  tokens of an undisturbed run of the same seed;
- the postmaster SIGKILLed while a backend runs a query, then `hartonomous db up`: the cluster
  recovers (its orphaned backend is stopped first), nothing committed is lost, the generation
  resumes;
- the database stays down: the generation fails with one clear error within a bounded time;
- the HTTP server during an outage: 503 (never 500), then 200 again once the database is back.
(The killed build is tests/test_build.py::test_a_killed_build_leaves_nothing_and_the_next_build_succeeds.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from generation_helpers import write_tiny_atom_set
from hartonomous.client import Client
from hartonomous.db import migrate
from hartonomous.db.cluster import EmbeddedCluster, free_port
from hartonomous.db.retry import ReconnectingConnection, RetryPolicy
from hartonomous.engine import State
from hartonomous.errors import DatabaseUnavailable
from hartonomous.generation_config import MAX_NEW_TOKENS
from server_helpers import live_app
from tiny_model import tiny_tokenizer

REPO = Path(__file__).resolve().parents[1]
PROMPT = "The capital of France is"
BOUND_S = 120            # generous bound on any recovery; a hang would exceed it


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    """A cluster only these tests restart and kill, on a fixed port so its URLs survive restarts."""
    root = Path(tempfile.mkdtemp(prefix="hartonomous-faults-"))
    root.chmod(0o755)
    c = EmbeddedCluster(root / "pg", port=free_port())
    c.up()
    migrate.upgrade(c.url())
    try:
        yield c
    finally:
        c.down()
        _kill_leftovers(c.data_dir)
        shutil.rmtree(root, ignore_errors=True)
        if c.data_dir != c.requested_dir:
            shutil.rmtree(c.data_dir, ignore_errors=True)


def _kill_leftovers(data_dir: Path) -> None:
    """Orphaned backends of a killed postmaster keep running a long query; never leave them behind."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if cwd.removesuffix(" (deleted)") == str(data_dir):
            try:
                os.kill(int(proc.name), 9)
            except OSError:
                pass


@pytest.fixture(scope="module")
def atom_set(cluster: EmbeddedCluster) -> str:
    return write_tiny_atom_set(cluster.url(), model="tiny", seed=21)


@pytest.fixture
def up(cluster: EmbeddedCluster) -> EmbeddedCluster:
    """The cluster, running (a test may have left it down)."""
    cluster.up()
    return cluster


def _client(cluster: EmbeddedCluster, atom_set: str, policy: RetryPolicy | None = None) -> Client:
    conn = ReconnectingConnection(cluster.url("reader"), policy or RetryPolicy(deadline_s=BOUND_S))
    return Client(connection=conn, atom_set=atom_set, spatial_tokenizer=tiny_tokenizer())


def _close(client: Client) -> None:
    conn = client.resources.connection()
    client.close()
    conn.close()            # passed in, so not closed by the client


def _undisturbed(cluster, atom_set, **options) -> list[int]:
    client = _client(cluster, atom_set)
    try:
        return client.generate(PROMPT, **options).token_ids
    finally:
        _close(client)


def _after(delay_s: float, action) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay_s), action()), daemon=True)
    thread.start()
    return thread


def _wait_for_query(cluster: EmbeddedCluster, text: str) -> None:
    """Until a reader backend runs a statement containing `text`."""
    deadline = time.monotonic() + BOUND_S
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        while not conn.execute("SELECT 1 FROM pg_stat_activity WHERE state = 'active' AND usename = "
                               "'hartonomous_reader' AND query LIKE %s", (f"%{text}%",)).fetchone():
            assert time.monotonic() < deadline, "the generation never started"
            time.sleep(0.05)


def test_a_restart_between_steps_resumes_the_generation(up, atom_set) -> None:
    options = dict(seed=7, max_new_tokens=30, stop_at_eos=False)
    expected = _undisturbed(up, atom_set, **options)
    client = _client(up, atom_set)
    session = client.stream(PROMPT, **options)
    events = session.events()
    first = [next(events).token_id for _ in range(10)]
    assert up.down() == "stopped"                       # the server is gone between step 9 and step 10
    restarter = _after(1.5, up.up)
    started = time.monotonic()
    rest = [e.token_id for e in events]
    restarter.join()
    assert time.monotonic() - started < BOUND_S
    assert first + rest == expected and session.state is State.COMPLETE
    assert client.resources.connection().reconnects == 1
    _close(client)


def test_a_restart_during_an_in_database_generation_reruns_it(up, atom_set) -> None:
    # The longest generation allowed: the restart must land while generate_tokens runs, and a short
    # one can finish before the stop does on a loaded machine (the test then sees no reconnect).
    options = dict(seed=8, max_new_tokens=4096, stop_at_eos=False, in_database=True)
    expected = _undisturbed(up, atom_set, **options)
    client = _client(up, atom_set)
    restarter = _after(0, lambda: (_wait_for_query(up, "generate_tokens"), up.down(), time.sleep(1), up.up()))
    started = time.monotonic()
    result = client.generate(PROMPT, **options)
    restarter.join()
    assert time.monotonic() - started < BOUND_S
    assert result.token_ids == expected and result.state is State.COMPLETE
    assert client.resources.connection().reconnects == 1
    _close(client)


def test_sigkill_then_hartonomous_db_up_recovers_and_nothing_is_lost(up, atom_set) -> None:
    """SIGKILL the postmaster mid-generation while another backend runs a long query; `hartonomous db up`
    must stop that orphan and start the cluster; the generation resumes with the undisturbed tokens."""
    with psycopg.connect(up.url()) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS fault_marker (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO fault_marker VALUES (1, 'committed before the crash') ON CONFLICT DO NOTHING")
        atoms_before = conn.execute("SELECT count(*) FROM atoms").fetchone()[0]
    options = dict(seed=9, max_new_tokens=40, stop_at_eos=False)
    expected = _undisturbed(up, atom_set, **options)
    busy: dict = {}

    def long_query() -> None:        # long work; the crash leaves its backend running, orphaned
        try:                             # (generate_tokens is bounded to 4096 tokens; the sleep keeps it busy)
            with psycopg.connect(up.url("reader"), autocommit=True) as conn:
                conn.execute("SELECT pg_sleep(50) FROM generate_tokens(ARRAY[1, 2, 3], 4096, atom_set => %s)",
                             (atom_set,))
        except psycopg.OperationalError as exc:
            busy["error"] = exc

    busy_thread = _after(0, long_query)
    _wait_for_query(up, "generate_tokens")
    client = _client(up, atom_set)
    session = client.stream(PROMPT, **options)
    events = session.events()
    first = [next(events).token_id for _ in range(10)]
    os.kill(up.running_pid(), 9)
    env = {**os.environ, "HARTONOMOUS_DATA_DIR": str(up.requested_dir), "HARTONOMOUS_DB_PORT": str(up.requested_port)}
    env.pop("HARTONOMOUS_DATABASE_URL", None)
    started = time.monotonic()
    cli = subprocess.run([sys.executable, "-m", "hartonomous.cli", "db", "up"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=BOUND_S)
    assert cli.returncode == 0, cli.stderr
    assert "embedded database started" in cli.stdout
    rest = [e.token_id for e in events]
    assert time.monotonic() - started < 2 * BOUND_S
    busy_thread.join(timeout=BOUND_S)
    assert isinstance(busy.get("error"), psycopg.OperationalError)      # the orphan was stopped, not waited for
    assert first + rest == expected and client.resources.connection().reconnects == 1
    _close(client)
    with psycopg.connect(up.url()) as conn:
        assert conn.execute("SELECT note FROM fault_marker WHERE id = 1").fetchone() == ("committed before the crash",)
        assert conn.execute("SELECT count(*) FROM atoms").fetchone()[0] == atoms_before


def test_a_database_that_stays_down_fails_the_generation_clearly_in_bounded_time(up, atom_set) -> None:
    client = _client(up, atom_set, RetryPolicy(attempts=4, first_delay_s=0.2, deadline_s=3.0))
    session = client.stream(PROMPT, seed=10, max_new_tokens=20, stop_at_eos=False)
    events = session.events()
    next(events)
    up.down()
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as err:
        list(events)
    elapsed = time.monotonic() - started
    assert elapsed < 30, f"gave up only after {elapsed:.1f} s"          # deadline 3 s + connect attempts
    message = str(err.value)
    assert message.startswith("lost the database connection") and "hartonomous db status" in message
    assert session.state is State.FAILED and session.result.finish_reason == "error"
    _close(client)


def test_the_server_answers_503_during_an_outage_and_200_after(up, atom_set) -> None:
    server, _ = live_app(up.url("reader"), atom_set, pool_size=2, pool_timeout_s=5)
    body = {"prompt": PROMPT, "max_new_tokens": 4, "seed": 1, "ignore_eos": True}
    with server as url, httpx.Client(base_url=url, timeout=BOUND_S) as http:
        assert http.post("/api/generate", json=body).status_code == 200
        up.down()
        started = time.monotonic()
        down = [http.post("/api/generate", json=body), http.post("/api/next_token", json={"prompt": PROMPT}),
                http.get("/healthz")]
        assert time.monotonic() - started < BOUND_S
        assert [r.status_code for r in down] == [503, 503, 503], [r.text for r in down]
        assert all("Traceback" not in r.text for r in down)
        up.up()
        # Each pool reconnects on its own schedule (psycopg_pool backs off between attempts), so the
        # lookups behind /healthz may be back before the generations' pool: wait for both.
        deadline = time.monotonic() + BOUND_S
        while (again := http.post("/api/generate", json=body)).status_code != 200:
            assert again.status_code == 503, again.text
            assert time.monotonic() < deadline, "the server never saw the database come back"
            time.sleep(0.5)
        assert len(again.json()["token_ids"]) == 4
        assert http.get("/healthz").status_code == 200


def test_a_cancelled_query_is_not_mistaken_for_a_lost_connection(up, atom_set) -> None:
    client = _client(up, atom_set)
    cancel = threading.Event()
    _after(0, lambda: (_wait_for_query(up, "generate_tokens"), cancel.set()))
    result = client.generate(PROMPT, seed=3, max_new_tokens=MAX_NEW_TOKENS, in_database=True, cancel=cancel)
    assert result.state is State.CANCELLED and client.resources.connection().reconnects == 0
    assert client.generate(PROMPT, seed=3, max_new_tokens=3, stop_at_eos=False).token_ids    # still usable
    _close(client)


# -- least privilege by default (this module owns an embedded cluster, so the defaults can be used) --

def test_inference_connects_as_the_reader_and_builds_as_the_owner_by_default(up, atom_set, monkeypatch) -> None:
    from hartonomous.config import reload_settings
    from hartonomous.db.connection import owner_url, redact
    from hartonomous.server import Runtime, ServerConfig

    for name in ("HARTONOMOUS_DATABASE_URL", "HARTONOMOUS_READER_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HARTONOMOUS_DATA_DIR", str(up.requested_dir))
    monkeypatch.setenv("HARTONOMOUS_DB_PORT", str(up.requested_port))
    reload_settings()
    try:
        with Client(atom_set=atom_set, spatial_tokenizer=tiny_tokenizer()) as client:      # CLI generate/next-token
            assert client.next_token(PROMPT, top_k=5)
            assert client.resources.connection().execute("SELECT current_user").fetchone() == ("hartonomous_reader",)
        runtime = Runtime(ServerConfig(), spatial_tokenizer=tiny_tokenizer())               # hartonomous serve
        runtime.open()
        try:
            with runtime.connection() as conn:
                assert conn.execute("SELECT current_user").fetchone() == ("hartonomous_reader",)
        finally:
            runtime.close()
        with psycopg.connect(owner_url()) as conn:                                          # hartonomous build
            assert conn.execute("SELECT current_user").fetchone() == ("hartonomous",)
        assert "***" in redact(up.url("reader")) and up.state().reader_password not in redact(up.url("reader"))
    finally:
        monkeypatch.undo()
        reload_settings()


def test_redact_hides_passwords_in_urls_and_conninfo_strings() -> None:
    from hartonomous.db.connection import redact

    for text in ("postgresql://u:s3cret@h:5432/db", "user=u password=s3cret host=h",
                 "user=u password='s3 cret' host=h", "postgresql://h/db?password=s3cret&sslmode=disable"):
        assert "s3" not in redact(text) and "***" in redact(text), redact(text)
