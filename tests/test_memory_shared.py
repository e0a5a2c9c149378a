"""The memory across processes: a server that reads the shared memory without writing it (`serve --memory`).

The memory lives in PostgreSQL and every draft reads it in SQL, so what one server remembers is
there for any other server on the same database as soon as it is committed. Here two servers run
in two processes on one database: the first remembers (`--remember`: the owner's writer), the
second only reads (`--memory`: the reader role alone). The second server is started before
anything is remembered and is never restarted; after the first remembers a greedy generation, the
second's speculative drafts of the same prompt come from that memory and are accepted, and its
output stays the exact model's. The second writes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from generation_helpers import SMOLLM2_ON_TWO_CORES, drop_atom_set, write_tiny_atom_set
from hartonomous.memory import MemoryPolicy
from hartonomous.server import Runtime, ServerConfig
from server_helpers import WAIT_S, live_app, tiny_exact_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py

TESTS = Path(__file__).resolve().parent
PROMPT = "The capital of France is"
GREEDY = dict(prompt=PROMPT, max_new_tokens=40, temperature=0.0, ignore_eos=True, draft_tokens=4)

# The reading server: its own process, the reader role, the tiny model; prints its URL, serves until stdin closes.
READING_SERVER = textwrap.dedent("""
    import sys
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, {tests!r})
    from generation_helpers import SMOLLM2_ON_TWO_CORES
    from server_helpers import live_app, tiny_exact_model
    exact = tiny_exact_model()
    exact._hartonomous_forward_costs = SMOLLM2_ON_TWO_CORES   # as measured there: not this run's timings
    server, runtime = live_app(sys.argv[1], sys.argv[2], exact, pool_size=2, memory=True)
    with server as url:
        print(url, flush=True)
        sys.stdin.read()
""")


@pytest.fixture(scope="module")
def atom_set(server_url) -> Iterator[str]:
    """Random atoms over the tiny vocabulary: a drafter that is never right without the memory."""
    name = write_tiny_atom_set(server_url, model="tiny", window=3, decay=0.5)
    yield name
    drop_atom_set(server_url, name)


@pytest.fixture(scope="module")
def reading_server(reader_url, atom_set) -> Iterator[str]:
    """A second server process that reads the memory and cannot write it (the reader role, no writer)."""
    process = subprocess.Popen([sys.executable, "-c", READING_SERVER.format(tests=str(TESTS)), reader_url, atom_set],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=TESTS,
                               env={**os.environ, "PYTHONPATH": str(TESTS)})
    try:
        url = ""
        for line in process.stdout:      # the URL, after whatever the model's loading prints
            if line.startswith("http://"):
                url = line.strip()
                break
        assert url.startswith("http://127.0.0.1:"), "the reading server did not start; see its log above"
        yield url
    finally:
        process.stdin.close()
        try:
            process.wait(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def remembering_server(reader_url, server_url, atom_set) -> Iterator[str]:
    """The first server: it remembers what the exact model says (greedy past EOS admitted)."""
    exact = tiny_exact_model()
    exact._hartonomous_forward_costs = SMOLLM2_ON_TWO_CORES
    server, _runtime = live_app(reader_url, atom_set, exact, pool_size=2, remember=True, writer_url=server_url,
                                memory_weight=1e6, memory_policy=MemoryPolicy(allow_ignore_eos=True))
    with server as url:
        yield url


def memory_held(server_url: str, atom_set: str) -> tuple[int, int]:
    """(atoms, generations) in the set's memory, read as the owner."""
    with psycopg.connect(server_url) as conn:
        return tuple(conn.execute("SELECT atoms, generations FROM memory_status(%s)", (atom_set,)).fetchone())


def generate(url: str, **body) -> dict:
    response = httpx.post(f"{url}/api/generate", json=body, timeout=WAIT_S * 4)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_second_server_drafts_from_what_the_first_remembered_without_a_restart(
        server_url, atom_set, reading_server, remembering_server):
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("SELECT forget(%s)", (atom_set,))
    before = generate(reading_server, path="speculative", **GREEDY)
    assert before["stats"]["tokens_per_forward"] < 2            # nothing remembered: random drafts miss
    assert before["memory"] is None                              # this server does not remember
    assert httpx.get(f"{reading_server}/healthz", timeout=WAIT_S).json()["memory"] == {"remember": False, "read": True}
    assert memory_held(server_url, atom_set) == (0, 0)           # ... and wrote nothing

    exact = generate(remembering_server, path="exact", **GREEDY)
    assert exact["memory"]["remembered"] is True
    assert memory_held(server_url, atom_set) == (40, 1)

    after = generate(reading_server, path="speculative", **GREEDY)   # the same process, not restarted
    assert after["token_ids"] == exact["token_ids"]                   # still the exact model's words
    assert after["stats"]["acceptance_rate"] > 0.9 and after["stats"]["tokens_per_forward"] > 3
    assert memory_held(server_url, atom_set) == (40, 1)               # the reader wrote nothing

    with psycopg.connect(server_url, autocommit=True) as conn:      # forgotten there: gone here at once
        conn.execute("SELECT forget(%s)", (atom_set,))
    forgotten = generate(reading_server, path="speculative", **GREEDY)
    assert forgotten["token_ids"] == exact["token_ids"]
    assert forgotten["stats"]["tokens_per_forward"] < 2


def test_a_server_reads_the_memory_only_when_told_to_or_when_it_writes_it() -> None:
    assert not Runtime(ServerConfig()).reads_memory
    assert Runtime(ServerConfig(memory=True)).reads_memory
