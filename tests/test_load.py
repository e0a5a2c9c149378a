"""LOAD TEST (~90 s): 16 clients against `hartonomous serve`, 5 s warm-up + 60 s, mixed next_token and generate.

The server is the real command in its own process (tiny model, a hand-made 320-token atom set,
the reader role, the default pools of 4 + 8 + 2 connections), on loopback, remembering generations
(`--remember`, a bound of MEMORY_MAX_ATOMS atoms, so eviction runs under load too). Asserts zero
errors, that the server never holds more connections than its pools and writer, that every connection is
gone once it stops, and that the memory was written, never failed and stayed within its bound. Prints the figures (run with -s) and writes them, with the machine's load average before and after,
to test-artifacts/load.json; the run docs/reliability.md quotes is that file committed as
docs/results/<date>-load.json (tests/test_docs_results.py checks the docs against it).
HARTONOMOUS_LOAD_SECONDS shortens or lengthens the run (default 60).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from generation_helpers import drop_atom_set, save_tiny_model, write_tiny_atom_set
from hartonomous.reliability.load import ConnectionSampler, connection_counts, run_load

CLIENTS = 16
SECONDS = float(os.environ.get("HARTONOMOUS_LOAD_SECONDS", "60"))
POOL_SIZE = 4                 # ServerConfig's default: database-only requests, each on a connection
MODEL_POOL_SIZE = 8           # ServerConfig.max_concurrent's default: requests on the model, one each
LOOKUP_POOL_SIZE = 2          # ServerConfig.lookup_pool_size's default: model ids, atom sets, /healthz
SERVER_CONNECTIONS = POOL_SIZE + MODEL_POOL_SIZE + LOOKUP_POOL_SIZE + 1     # the three pools and the memory's writer
MEMORY_MAX_ATOMS = 300        # small: a minute of load evicts many generations
ARTIFACT = Path(__file__).resolve().parent.parent / "test-artifacts" / "load.json"

pytestmark = pytest.mark.load


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("hartonomous serve did not become healthy")


def _wait_for(condition, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


def test_sixteen_clients_for_a_minute_without_errors_or_leaks(server_url, reader_url, tmp_path) -> None:
    model_dir = save_tiny_model(tmp_path / "tiny")
    atom_set = write_tiny_atom_set(server_url, model=str(model_dir), seed=11)
    port, tag = _free_port(), f"load-test-{os.getpid()}"
    env = {**os.environ, "HARTONOMOUS_DATABASE_URL": server_url, "HARTONOMOUS_HOME": str(tmp_path),
           "HARTONOMOUS_READER_DATABASE_URL": make_conninfo(reader_url, application_name=tag)}
    exe = os.path.join(os.path.dirname(sys.executable), "hartonomous")
    before = connection_counts(server_url, tag)
    log = (tmp_path / "serve.log").open("w")       # a file, not a pipe: a full pipe would stall the server
    proc = subprocess.Popen([exe, "serve", "--port", str(port), "--atom-set", atom_set, "--model", str(model_dir),
                             "--no-preload", "--log-level", "warning", "--remember",
                             "--memory-max-atoms", str(MEMORY_MAX_ATOMS),
                             "--memory-policy", "allow_ignore_eos=true"], env=env, stdout=log,   # its requests ignore EOS
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, tmp_path / "serve.log")
        sampler = ConnectionSampler(server_url, tag, interval_s=0.5)
        sampler.start()
        report = run_load(url, clients=CLIENTS, seconds=SECONDS, max_new_tokens=8)
        peak = sampler.stop()
        during = connection_counts(server_url, tag)
        memory = httpx.get(f"{url}/healthz", timeout=10).json()["memory"]
        with psycopg.connect(server_url) as conn:
            held = conn.execute("SELECT atoms, generations FROM memory_status(%s)", (atom_set,)).fetchone()
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        log.close()
        drop_atom_set(server_url, atom_set)
    output = (tmp_path / "serve.log").read_text()
    assert _wait_for(lambda: connection_counts(server_url, tag)["server"] == 0), "the server left connections"
    after = connection_counts(server_url, tag)
    report.memory = {**memory, "atoms_after_run": held[0], "generations_after_run": held[1]}
    report.connections = {"all_before": before["all"], "server_peak": peak, "server_after_run": during["server"],
                          "server_after_stop": after["server"], "all_after_stop": after["all"]}
    ARTIFACT.parent.mkdir(exist_ok=True)
    ARTIFACT.write_text(json.dumps(report.as_dict(), indent=2))
    print("\n" + "\n".join(report.lines()))

    assert report.errors == 0, report.error_samples
    assert memory["remember"] and memory["failed"] == 0 and memory["refused"] == 0, memory
    assert memory["remembered"] > MEMORY_MAX_ATOMS // 8, memory        # enough generations to evict several times
    assert 0 < held[0] <= MEMORY_MAX_ATOMS, held
    assert all(s["requests"] > 0 for s in report.by_kind.values()), report.by_kind
    assert report.seconds >= SECONDS
    assert 1 <= peak <= SERVER_CONNECTIONS, f"the server held {peak} connections; its pools and writer have {SERVER_CONNECTIONS}"
    assert during["server"] <= SERVER_CONNECTIONS and during.get("server_idle_in_transaction", 0) == 0
    assert during.get("server_active", 0) == 0          # nothing left running after the last answer
    assert after["all"] <= before["all"], "connections leaked past the server's shutdown"
    assert proc.returncode == 0, output
