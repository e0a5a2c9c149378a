"""The memory's writers on a real local Citus cluster (a coordinator and 2 workers, `hartonomous
cluster up`): remember(), set_memory_bound(), set_memory_policy() and forget() work on a
coordinator as on one node, first write and later ones alike. A coordinator refuses a non-IMMUTABLE
function (now()) in the DO UPDATE SET of an INSERT into a distributed or Citus local table; no
write of the memory has that shape (sql/070_memory.sql rule 7).

Needs Citus 12.1 for PostgreSQL 15 (scripts/install-citus.sh). Under CI=true a missing Citus is a
failure; elsewhere these tests skip and say why.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import psycopg
import pytest

from citus_helpers import WORKERS, migrated_cluster
from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set

SET, VOCAB = "citus-memory", 40
GREEDY = "temperature => 0"
HOT = "temperature => 100, top_k => 40, top_p => 0.9"


@pytest.fixture(scope="module")
def coord() -> Iterator[psycopg.Connection]:
    """An autocommit connection to a fresh, migrated coordinator + 2 workers holding one atom set."""
    with migrated_cluster("hartonomous-citus-memory-", WORKERS) as cluster:
        rng = np.random.default_rng(4)
        with psycopg.connect(cluster.url()) as conn:
            write_atom_set(conn, AtomSetSpec(name=SET, model="synthetic", vocab_size=VOCAB, embedding_dim=0,
                                             projection="synthetic", kind="context", centroid_window=3,
                                             centroid_decay=0.5),
                           TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], rng.random((VOCAB, 3))),
                           AtomRows(rng.integers(0, VOCAB, 400), rng.random((400, 3)), np.ones(400)))
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            yield conn


def remember(conn, generated: list[int], settings: str = GREEDY) -> tuple:
    return conn.execute(f"SELECT * FROM remember(%s, ARRAY[1, 2, 3], %s, 'exact', {settings})",
                        (SET, generated)).fetchone()


def status(conn) -> tuple:
    return conn.execute("SELECT atoms, generations, max_atoms FROM memory_status(%s)", (SET,)).fetchone()


def test_the_memorys_tables_live_on_the_cluster(coord):
    """memory_atoms is distributed with the atoms; the bounds and policies, which reference the
    atom_sets reference table, are Citus tables too: the shape whose upserts a coordinator checks."""
    kinds = dict(coord.execute("SELECT logicalrelid::text, partmethod FROM pg_dist_partition WHERE logicalrelid IN "
                               "('memory_atoms'::regclass, 'memory_bounds'::regclass, 'memory_policies'::regclass)"))
    assert kinds == {"memory_atoms": "h", "memory_bounds": "n", "memory_policies": "n"}


def test_a_coordinator_refuses_an_upsert_that_sets_now(coord):
    """What the memory's writers must not do (the shape of the bound's write before 2026-12-02)."""
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="must be marked IMMUTABLE"):
        coord.execute("INSERT INTO memory_bounds AS b (atom_set_id, max_atoms) "
                      "SELECT id, 7 FROM atom_sets WHERE name = %s "
                      "ON CONFLICT (atom_set_id) DO UPDATE SET max_atoms = excluded.max_atoms, set_at = now()",
                      (SET,))


def test_remember_bound_policy_and_forget_work_on_a_coordinator(coord):
    coord.execute("SELECT forget(%s)", (SET,))
    first = remember(coord, [4, 5, 6])
    second = remember(coord, [7, 8, 9, 10])
    assert first[1:] == (3, 0, 3) and second[1:] == (4, 0, 7) and second[0] > first[0]
    assert coord.execute("SELECT set_memory_bound(%s, 6)", (SET,)).fetchone() == (3,)      # a new bound: inserted
    assert coord.execute("SELECT set_memory_bound(%s, 5)", (SET,)).fetchone() == (0,)      # a changed one: updated
    assert status(coord) == (4, 1, 5)
    assert remember(coord, [11])[1:] == (1, 0, 5)

    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="not remembered: temperature 100 is outside"):
        remember(coord, [12], HOT)
    assert coord.execute("SELECT set_memory_policy(%s, max_temperature => 1000)", (SET,)).fetchone() == (0,)
    hot = remember(coord, [12, 13], HOT)
    assert hot[1:] == (2, 4, 3) and status(coord) == (3, 2, 5)             # the oldest generation evicted
    assert coord.execute("SELECT set_memory_policy(%s, max_temperature => 1000)", (SET,)).fetchone() == (0,)
    assert coord.execute("SELECT set_memory_policy(%s)", (SET,)).fetchone() == (2,)         # updated: forgets the hot one
    assert coord.execute("SELECT max_temperature, set_at IS NOT NULL FROM memory_policy(%s)",
                         (SET,)).fetchone() == (1.0, True)
    assert status(coord) == (1, 1, 5)
    assert coord.execute("SELECT forget(%s)", (SET,)).fetchone() == (1,)
    assert status(coord) == (0, 0, 5)
