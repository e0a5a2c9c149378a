"""A real local Citus cluster (a coordinator and 2 workers, `hartonomous cluster up`): the same atom
sets built on one node and on the cluster give the same next_token, next_token_batch and
generate_tokens rows; the KNN runs on the workers' shards; the reader role works; a stopped
worker gives a clear error, and the coordinator answers again once the worker is back.

Needs Citus 12.1 for PostgreSQL 15 (scripts/install-citus.sh). Under CI=true a missing Citus is a
failure; elsewhere these tests skip and say why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest

from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
from hartonomous.errors import UserError
from hartonomous.db import migrate
from citus_helpers import WORKERS, migrated_cluster
from hartonomous.db.citus_cluster import CitusCluster

TOL = 1e-9
NEXT_TOKEN = "SELECT * FROM next_token(%s, %s, %s, %s, %s, %s, %s, %s)"
KNN = ("SELECT token_id, weight, position <<->> ST_MakePoint(0.4, 0.5, 0.6) AS d FROM atoms "
       "WHERE atom_set_id = {set_id} ORDER BY position <<->> ST_MakePoint(0.4, 0.5, 0.6) LIMIT 100")


@pytest.fixture(scope="module")
def citus() -> Iterator[CitusCluster]:
    """A fresh coordinator + 2 workers under a temporary folder, migrated; deleted afterwards."""
    with migrated_cluster("hartonomous-citus-test-", WORKERS) as cluster:
        yield cluster


# --- the same small deterministic atom sets on both ---------------------------------------------

SETS = {
    # name: (seed, atom_sets fields)
    "citustest_gauss": (11, dict(kernel="gaussian", bandwidth=0.15)),
    "citustest_expo": (12, dict(kernel="exponential", bandwidth=0.1, centroid_window=3, centroid_decay=0.6,
                                history_weight=1.5, history_window=8)),
}
VOCAB, ATOMS = 60, 4000


# Lattice sets (deep keys, projection/lattice.py) route on the cluster: tokens on the integer cells
# of a 5^3 lattice, keys the decayed means of the last 4 tokens of a Markov chain whose transitions
# are sparse (so suffixes repeat and the backoff kernel has deep matches). Tokens UNSEEN never occur
# in the chain: a context ending in one has an empty cell, which the routed KNN must fall back from.
LATTICE_SETS = {
    "citustest_lattice_backoff": dict(kernel="backoff", history_weight=1.0, history_window=8),
    "citustest_lattice_gauss": dict(kernel="gaussian", bandwidth=0.3),
}
LATTICE_SIDE, LATTICE_DECAY, LATTICE_WINDOW, CHAIN = 5, 1 / 16, 4, 20_000
UNSEEN = (57, 58, 59)


def lattice_chain(seed: int, length: int) -> np.ndarray:
    rng = np.random.default_rng(100)  # one chain: the same transitions for the corpus and held-out text
    seen = VOCAB - len(UNSEEN)
    transitions = rng.dirichlet(np.full(seen, 0.05), size=seen)
    walk = np.random.default_rng(seed)
    chain = [0]
    for _ in range(length - 1):
        chain.append(int(walk.choice(seen, p=transitions[chain[-1]])))
    return np.array(chain)


def lattice_cells() -> np.ndarray:
    axis = np.arange(LATTICE_SIDE)
    cells = np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), axis=-1).reshape(-1, 3)[:VOCAB]
    return (cells - (LATTICE_SIDE - 1) / 2).astype(np.float64)


def build_lattice_sets(conn: psycopg.Connection) -> dict[str, int]:
    from hartonomous.centroid import prefix_centroids
    from projection.lattice import Lattice

    cells, chain = lattice_cells(), lattice_chain(5, CHAIN)
    keys = prefix_centroids(cells[chain[:-1]], LATTICE_WINDOW, LATTICE_DECAY)
    ladder = Lattice(cells, LATTICE_SIDE, LATTICE_DECAY).ladder_top
    ids = {}
    for name, fields in LATTICE_SETS.items():
        fields = {"bandwidth": ladder, **fields}
        spec = AtomSetSpec(name=name, model="test", vocab_size=VOCAB, embedding_dim=3, projection="lattice",
                           kind="context", centroid_window=LATTICE_WINDOW, centroid_decay=LATTICE_DECAY, **fields)
        tokens = TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], cells)
        ids[name] = write_atom_set(conn, spec, tokens, AtomRows(chain[1:], keys, np.ones(len(keys)))).atom_set_id
    return ids


def build_sets(conn: psycopg.Connection) -> dict[str, int]:
    """Write SETS and LATTICE_SETS through `conn` (binary COPY; on the cluster through the coordinator)."""
    ids = {}
    for name, (seed, fields) in SETS.items():
        rng = np.random.default_rng(seed)
        spec = AtomSetSpec(name=name, model="test", vocab_size=VOCAB, embedding_dim=3, projection="random",
                           kind="context", **fields)
        tokens = TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], rng.random((VOCAB, 3)))
        atoms = AtomRows(rng.integers(0, VOCAB, ATOMS), rng.random((ATOMS, 3)), rng.uniform(0.2, 2.0, ATOMS))
        ids[name] = write_atom_set(conn, spec, tokens, atoms).atom_set_id
    return ids | build_lattice_sets(conn)


@pytest.fixture(scope="module")
def single(server_url: str) -> Iterator[psycopg.Connection]:
    """The single-node side: the sets inside one transaction that is rolled back at the end."""
    with psycopg.connect(server_url) as conn:
        conn.execute("SELECT 1")
        build_sets(conn)
        yield conn
        conn.rollback()


@pytest.fixture(scope="module")
def cluster_ids(citus: CitusCluster) -> dict[str, int]:
    with psycopg.connect(citus.url()) as conn:
        return build_sets(conn)


@pytest.fixture
def coord(citus: CitusCluster, cluster_ids) -> Iterator[psycopg.Connection]:
    with psycopg.connect(citus.url(), autocommit=True) as conn:
        yield conn


def assert_same_rows(got: list[tuple], want: list[tuple], may_be_empty: bool = False) -> None:
    assert len(got) == len(want) and (may_be_empty or len(want) > 0)
    for g, w in zip(got, want):
        assert g[:-2] == w[:-2]  # the ids (context_index, token_id)
        assert g[-2:] == pytest.approx(w[-2:], abs=TOL)


# --- the layout -------------------------------------------------------------------------------

def test_a_tiles_build_on_the_cluster_is_refused_and_leaves_nothing(citus, coord, cluster_ids) -> None:
    rng = np.random.default_rng(0)
    spec = AtomSetSpec(name="citustest_tiles", model="test", vocab_size=VOCAB, embedding_dim=3,
                       projection="random", kind="context", layout="tiles")
    tokens = TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], rng.random((VOCAB, 3)))
    atoms = AtomRows(rng.integers(0, VOCAB, 100), rng.random((100, 3)), np.ones(100))
    with psycopg.connect(citus.url()) as conn, pytest.raises(UserError, match="--layout rows"):
        write_atom_set(conn, spec, tokens, atoms)
    assert coord.execute("SELECT count(*) FROM atom_sets WHERE name = 'citustest_tiles'").fetchone() == (0,)


def test_the_workers_are_registered_and_atoms_is_hash_distributed(citus, coord, cluster_ids) -> None:
    ports = sorted(w.running_port() for w in citus.workers())
    active = coord.execute("SELECT node_port FROM citus_get_active_worker_nodes() ORDER BY 1").fetchall()
    assert [p for (p,) in active] == ports
    kinds = dict(coord.execute("SELECT logicalrelid::text, partmethod FROM pg_dist_partition").fetchall())
    assert kinds["atoms"] == "h"
    assert {kinds[t] for t in ("atom_sets", "tokens", "token_blocks", "landmarks")} == {"n"}  # reference tables
    assert kinds["atom_tiles"] == "h"
    partition = f"atoms_{cluster_ids['citustest_gauss']}"
    assert kinds[partition] == "h"
    (colocated,) = coord.execute(
        "SELECT count(DISTINCT colocationid) FROM pg_dist_partition WHERE logicalrelid IN ('atoms'::regclass, %s::regclass)",
        (partition,)).fetchone()
    assert colocated == 1
    per_worker = coord.execute(
        "SELECT nodeport, count(*), sum(shard_size) FROM citus_shards WHERE table_name = %s::regclass "
        "GROUP BY 1 ORDER BY 1", (partition,)).fetchall()
    assert [p for p, _, _ in per_worker] == ports  # every worker holds shards of the set
    (rows,) = coord.execute(f"SELECT count(*) FROM {partition}").fetchone()
    assert rows == ATOMS


def test_the_knn_runs_on_every_shard_with_its_own_gist_index(citus, coord, cluster_ids) -> None:
    coord.execute("SET citus.explain_all_tasks = on")
    plan = "\n".join(r for (r,) in coord.execute(
        "EXPLAIN (COSTS OFF) " + KNN.format(set_id=cluster_ids["citustest_gauss"])).fetchall())
    (shards,) = coord.execute("SELECT count(*) FROM citus_shards WHERE table_name = %s::regclass",
                              (f"atoms_{cluster_ids['citustest_gauss']}",)).fetchone()
    assert "Custom Scan (Citus Adaptive)" in plan
    assert f"Task Count: {shards}" in plan
    tasks = plan.split("->  Task")[1:]
    assert len(tasks) == shards
    for task in tasks:  # each shard: LIMIT over an ordered scan of its own GiST index
        assert re.search(r"Limit\s*\n\s*->\s+Index Scan using atoms_\d+_position_idx_\d+", task), task
        assert re.search(r'Order By: \("?position"? <<->>', task), task
    nodes = {int(p) for p in re.findall(r"Node: host=127\.0\.0\.1 port=(\d+)", plan)}
    assert nodes == {w.running_port() for w in citus.workers()}


# --- the same rows ----------------------------------------------------------------------------

CALLS = [  # (context, temperature, top_k, top_p, search_radius, max_neighbors, repetition_penalty)
    ([3, 7, 11], 1.0, 40, 0.9, None, 100, 1.0),
    ([5], 0.7, 0, 1.0, None, 300, 1.0),
    ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 1.3, 20, 0.95, None, 50, 1.3),
    ([42, 42, 8], 0.0, 40, 0.9, None, 100, 1.0),
    ([17, 23], 1.0, 0, 1.0, 0.2, 1000, 1.0),
]


@pytest.mark.parametrize("name", sorted(SETS))
@pytest.mark.parametrize("call", CALLS, ids=[f"call{i}" for i in range(len(CALLS))])
def test_next_token_gives_the_same_rows_on_the_cluster(single, coord, name, call) -> None:
    context, t, k, p, radius, neighbors, penalty = call
    args = (context, t, k, p, radius, neighbors, name, penalty)
    assert_same_rows(coord.execute(NEXT_TOKEN, args).fetchall(), single.execute(NEXT_TOKEN, args).fetchall())


@pytest.mark.parametrize("name", sorted(SETS))
def test_next_token_batch_gives_the_same_rows_on_the_cluster(single, coord, name) -> None:
    contexts = json.dumps([c for c, *_ in CALLS])
    call = "SELECT * FROM next_token_batch(%s::jsonb, 1.1, 30, 0.92, NULL, 120, %s)"
    assert_same_rows(coord.execute(call, (contexts, name)).fetchall(),
                     single.execute(call, (contexts, name)).fetchall())


@pytest.mark.parametrize("name", sorted(SETS))
def test_generate_tokens_gives_the_same_tokens_on_the_cluster(single, coord, name) -> None:
    call = "SELECT generate_tokens(ARRAY[4, 9, 16], 25, 1.2, 20, 0.95, NULL, 80, %s, 1.2, 2024)"
    (got,) = coord.execute(call, (name,)).fetchone()
    (want,) = single.execute(call, (name,)).fetchone()
    assert len(got) == 25 and got == want


def test_the_reader_role_runs_next_token_on_the_coordinator(citus, coord, single) -> None:
    args = ([3, 7, 11], 1.0, 40, 0.9, None, 100, "citustest_gauss", 1.0)
    with psycopg.connect(citus.url("reader")) as reader:
        assert_same_rows(reader.execute(NEXT_TOKEN, args).fetchall(), single.execute(NEXT_TOKEN, args).fetchall())
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("DELETE FROM atoms")


# --- routing (migration 0018) -------------------------------------------------------------------

def held_out_contexts(count: int, seed: int = 9) -> list[list[int]]:
    """Contexts of 1-10 tokens from a walk of the chain the lattice sets were not built from, and
    two that end in a token whose cell holds no atom."""
    chain, rng = lattice_chain(seed, 4000), np.random.default_rng(seed)
    ends = rng.integers(12, len(chain), count)
    contexts = [[int(t) for t in chain[e - rng.integers(1, 11):e]] for e in ends]
    return contexts + [[3, 7, UNSEEN[0]], [UNSEEN[1]]]


def same_values(got, want) -> bool:
    """Rows equal, floats within TOL (lists and tuples item by item; NULLs equal)."""
    if isinstance(want, (list, tuple)):
        return isinstance(got, (list, tuple)) and len(got) == len(want) and all(map(same_values, got, want))
    if isinstance(want, float) and isinstance(got, float):
        return got == pytest.approx(want, abs=TOL, nan_ok=True)
    return got == want


def reset_routing(conn: psycopg.Connection) -> None:
    conn.execute("SET hartonomous.knn_routed = 0")
    conn.execute("SET hartonomous.knn_fanned_out = 0")


def routing(conn: psycopg.Connection) -> tuple[int, int]:
    return conn.execute("SELECT routed, fanned_out FROM knn_routing()").fetchone()


@pytest.fixture(params=["native", "plpgsql"])
def kernel_path(request, coord) -> Iterator[str]:
    """Both implementations of the routed KNN: the C kernel's prepared one and the PL/pgSQL one."""
    coord.execute("SELECT set_config('hartonomous.kernel', %s, false)", ("plpgsql" if request.param == "plpgsql" else "",))
    assert coord.execute("SELECT ht_kernel()").fetchone() == (request.param,)
    reset_routing(coord)
    yield request.param
    coord.execute("RESET hartonomous.kernel")


def test_lattice_sets_route_by_cell_and_other_sets_spread_by_atom_id(coord, cluster_ids) -> None:
    from hartonomous.atomset.routing import route_cells

    spreads = dict(coord.execute("SELECT name, route_spread FROM atom_sets").fetchall())
    for name in LATTICE_SETS:
        assert spreads[name] == pytest.approx((LATTICE_SIDE - 1) * LATTICE_DECAY)
    assert all(spreads[name] is None for name in SETS)  # random positions: no cell holds their keys
    for name, set_id in cluster_ids.items():
        rows = coord.execute(
            "SELECT route, atom_id, ST_X(position), ST_Y(position), ST_Z(position), "
            "ht_route_cell(ST_X(position), ST_Y(position), ST_Z(position)) FROM atoms WHERE atom_set_id = %s",
            (set_id,)).fetchall()
        routes = np.array([r[0] for r in rows])
        if name in LATTICE_SETS:
            assert np.array_equal(routes, [r[5] for r in rows])  # SQL's cell code is the build's
            assert np.array_equal(routes, route_cells(np.array([r[2:5] for r in rows])))
        else:
            assert np.array_equal(routes, [r[1] for r in rows])


def test_atoms_and_memory_are_distributed_by_route_colocated_with_route_in_the_key(coord, cluster_ids) -> None:
    rows = dict((t, (col, colo)) for t, col, colo in coord.execute(
        "SELECT logicalrelid::text, column_to_column_name(logicalrelid, partkey), colocationid "
        "FROM pg_dist_partition WHERE logicalrelid IN ('atoms'::regclass, 'memory_atoms'::regclass, %s::regclass)",
        (f"atoms_{cluster_ids['citustest_lattice_backoff']}",)).fetchall())
    assert {col for col, _ in rows.values()} == {"route"} and len({colo for _, colo in rows.values()}) == 1
    for table in ("atoms", "memory_atoms"):
        (key,) = coord.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint "
                               "WHERE conrelid = %s::regclass AND contype = 'p'", (table,)).fetchone()
        assert "route" in key
    # every cell of a routed set lies on one shard: read each shard's own rows on its worker
    partition = f"atoms_{cluster_ids['citustest_lattice_backoff']}"
    shards = coord.execute(
        "SELECT shardid, result FROM run_command_on_shards(%s, $$SELECT coalesce(string_agg(DISTINCT "
        "ht_route_cell(ST_X(position), ST_Y(position), ST_Z(position))::text, ','), '') FROM %%s$$)",
        (partition,)).fetchall()
    cells = [c for _, result in shards for c in result.split(",") if c]
    assert len(shards) > 1 and len(cells) == len(set(cells)) > len(shards)


def test_the_native_kernel_is_installed_on_every_node(citus, coord) -> None:
    rows = coord.execute("SELECT nodeport, success, result FROM run_command_on_workers("
                         "$$SELECT extversion FROM pg_extension WHERE extname = 'hartonomous_kernel'$$)").fetchall()
    assert sorted(p for p, _, _ in rows) == sorted(w.running_port() for w in citus.workers())
    assert all(ok and version == "1.5" for _, ok, version in rows)
    assert coord.execute("SELECT ht_kernel(), ht_routes()").fetchone() == ("native", True)


def test_a_cell_knn_is_a_router_query_on_one_worker(citus, coord, cluster_ids) -> None:
    set_id = cluster_ids["citustest_lattice_backoff"]
    plan = "\n".join(r for (r,) in coord.execute(
        "EXPLAIN (COSTS OFF) SELECT token_id, weight, position <<->> ST_MakePoint(1.1, -0.2, 0.05) FROM atoms "
        "WHERE atom_set_id = %s AND route = ht_route_cell(1.1, -0.2, 0.05) "
        "AND position &&& ST_MakeLine(ST_MakePoint(0.5, -0.5, -0.5), ST_MakePoint(1.5, 0.5, 0.5)) "
        "ORDER BY position <<->> ST_MakePoint(1.1, -0.2, 0.05) LIMIT 100", (set_id,)).fetchall())
    assert "Task Count: 1" in plan and plan.count("->  Task") == 1, plan  # one shard, one worker, no merge
    (port,) = re.findall(r"Node: host=127\.0\.0\.1 port=(\d+)", plan)
    assert int(port) in {w.running_port() for w in citus.workers()}


@pytest.mark.parametrize("name", sorted(LATTICE_SETS))
def test_next_token_on_a_lattice_set_routes_and_gives_the_same_rows(single, coord, kernel_path, name) -> None:
    contexts = held_out_contexts(60)
    for context in contexts:
        for call in ((context, 1.0, 0, 1.0, None, 100), (context, 0.8, 20, 0.9, None, 30),
                     (context, 1.0, 0, 1.0, 0.3, 100)):
            args = (*call, name, 1.0)
            assert_same_rows(coord.execute(NEXT_TOKEN, args).fetchall(), single.execute(NEXT_TOKEN, args).fetchall(),
                             may_be_empty=call[4] is not None)  # nothing within the radius: no rows on either
    routed, fanned = routing(coord)
    assert routed + fanned >= 3 * len(contexts)  # every call's KNN decided (a call may run more than one)
    assert fanned >= 1  # the contexts whose cell is empty (and, with the Gaussian kernel, thin cells)
    # the backoff kernel's cut proves most routed answers whole; the Gaussian kernel needs k atoms in the cell
    assert routed / (routed + fanned) > (0.9 if "backoff" in name else 0.5)


def test_empty_cells_fall_back_to_the_fan_out_and_are_counted(single, coord, kernel_path) -> None:
    for context in ([3, 7, UNSEEN[0]], [UNSEEN[1]], [UNSEEN[2]]):
        args = (context, 1.0, 0, 1.0, None, 100, "citustest_lattice_backoff", 1.0)
        assert_same_rows(coord.execute(NEXT_TOKEN, args).fetchall(), single.execute(NEXT_TOKEN, args).fetchall())
    assert routing(coord) == (0, 3)


@pytest.mark.parametrize("name", sorted(LATTICE_SETS))
def test_every_routed_call_gives_the_single_nodes_rows(single, coord, kernel_path, name) -> None:
    """sample_next_token, next_token_batch, draft_tokens, draft_tree, generate_tokens,
    store_distribution and next_token_signals on the routed path."""
    contexts = [c for c in held_out_contexts(10, seed=21) if len(c) >= 2]  # store_distribution: 2 prefixes
    calls = [
        ("SELECT sample_next_token(%s, 1.1, 30, 0.95, NULL, 100, %s, 1.1, 77, 3)", True),
        ("SELECT * FROM draft_tokens(%s, 6, 0.0, 40, 0.9, NULL, 100, %s)", False),
        ("SELECT * FROM draft_tree(%s, 3, 2, NULL, 100, %s)", False),
        ("SELECT generate_tokens(%s, 20, 1.2, 20, 0.95, NULL, 80, %s, 1.2, 2024)", True),
        ("SELECT prefix_length, token_ids, probabilities FROM store_distribution(%s, %s, 100, NULL, NULL, false, 2)", False),
        ("SELECT h, top_probability, distinct_tokens FROM next_token_signals(%s, NULL, 100, %s)", False),
    ]
    for context in contexts:
        for sql, exact in calls:
            got = coord.execute(sql, (context, name)).fetchall()
            want = single.execute(sql, (context, name)).fetchall()
            assert len(got) == len(want) > 0
            for g, w in zip(got, want):
                assert g == w if exact else same_values(g, w), (sql, context, g, w)
    batch = "SELECT * FROM next_token_batch(%s::jsonb, 1.0, 0, 1.0, NULL, 100, %s)"
    assert_same_rows(coord.execute(batch, (json.dumps(contexts), name)).fetchall(),
                     single.execute(batch, (json.dumps(contexts), name)).fetchall())
    routed, fanned = routing(coord)
    assert routed > fanned


def test_memory_atoms_route_with_their_set_and_memory_calls_give_the_same_rows(single, coord, kernel_path) -> None:
    name = "citustest_lattice_backoff"
    generated = [int(t) for t in lattice_chain(33, 40)]
    remember = "SELECT remembered FROM remember(%s, %s, %s, 'exact', temperature => 0)"
    if coord.execute("SELECT count(*) FROM memory_atoms m JOIN atom_sets s ON s.id = m.atom_set_id "
                     "WHERE s.name = %s", (name,)).fetchone() == (0,):
        assert coord.execute(remember, (name, [1, 2], generated)).fetchone() == (40,)
    if single.execute("SELECT count(*) FROM memory_atoms m JOIN atom_sets s ON s.id = m.atom_set_id "
                      "WHERE s.name = %s", (name,)).fetchone() == (0,):
        single.execute(remember, (name, [1, 2], generated))
    (misplaced,) = coord.execute(
        "SELECT count(*) FROM memory_atoms m JOIN atom_sets s ON s.id = m.atom_set_id "
        "WHERE s.name = %s AND m.route <> ht_route_cell(ST_X(m.position), ST_Y(m.position), ST_Z(m.position))",
        (name,)).fetchone()
    assert misplaced == 0
    reset_routing(coord)
    call = "SELECT * FROM next_token(%s, 1.0, 0, 1.0, NULL, 100, %s, 1.0, NULL, NULL, true)"
    for context in held_out_contexts(20, seed=5) + [[1, 2] + generated[:10]]:
        assert_same_rows(coord.execute(call, (context, name)).fetchall(), single.execute(call, (context, name)).fetchall())
    routed, _ = routing(coord)
    assert routed > 0


def test_a_build_killed_during_its_copy_leaves_no_set_partition_or_shard_behind(citus, coord) -> None:
    """The build runs in a child process; it is killed (SIGKILL) once its COPY has started. The
    coordinator rolls the whole distributed transaction back: no atom_sets row, no atoms partition,
    no shard of it on any worker."""
    def relations() -> tuple[int, list]:
        (local,) = coord.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'atoms\\_%'").fetchone()
        remote = coord.execute("SELECT nodeport, result FROM run_command_on_workers("
                               "$$SELECT count(*) FROM pg_class WHERE relname LIKE 'atoms\\_%'$$) ORDER BY 1").fetchall()
        return local, remote

    before = relations()
    script = f"""
import numpy as np, psycopg, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
rng = np.random.default_rng(0)
n = 3_000_000
spec = AtomSetSpec(name="citustest_killed", model="test", vocab_size={VOCAB}, embedding_dim=3, projection="random",
                   kind="context")
tokens = TokenRows(np.arange({VOCAB}), [f"t{{i}}" for i in range({VOCAB})], rng.random(({VOCAB}, 3)))
atoms = AtomRows(rng.integers(0, {VOCAB}, n), rng.random((n, 3)))
with psycopg.connect({citus.url()!r}) as conn:
    write_atom_set(conn, spec, tokens, atoms, progress=lambda m: print(m, flush=True))
"""
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        for line in child.stdout:
            if line.startswith("COPY"):
                break
        else:
            pytest.fail(f"the build ended before its COPY (exit {child.wait()})")
        time.sleep(1.0)
        child.kill()
    finally:
        child.wait()
    deadline = time.monotonic() + 30
    while coord.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'COPY atoms%%' "
                        "AND pid <> pg_backend_pid()").fetchone()[0] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert coord.execute("SELECT count(*) FROM atom_sets WHERE name = 'citustest_killed'").fetchone() == (0,)
    assert relations() == before


# --- the commands ------------------------------------------------------------------------------

def test_the_cluster_commands_are_idempotent_and_the_other_commands_use_the_coordinator(citus) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARTONOMOUS_")}
    env["HARTONOMOUS_HOME"] = str(citus.root.parent)

    def hartonomous(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "hartonomous.cli", *args], capture_output=True, text=True,
                              env=env, cwd=Path(__file__).resolve().parents[1], timeout=300)

    again = hartonomous("cluster", "up")
    assert again.returncode == 0 and "already running" in again.stdout
    assert hartonomous("cluster", "url").stdout.strip() == citus.url()
    assert hartonomous("db", "url").stdout.strip() == citus.url()  # while it runs, commands use it
    status = json.loads(hartonomous("cluster", "status", "--json").stdout)
    assert len(status["active_workers"]) == WORKERS
    shrink = hartonomous("cluster", "up", "--workers", "1")
    assert shrink.returncode == 1
    assert shrink.stderr.startswith("error: the cluster has 2 workers") and shrink.stderr.count("\n") == 1


# --- faults ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["citustest_gauss", "citustest_lattice_backoff"])
def test_a_worker_stopped_during_a_call_gives_a_clear_error_and_the_cluster_recovers(citus, coord, name) -> None:
    """generate_tokens of 4096 tokens runs for many seconds; worker 2 stops (fast shutdown) while it
    runs. The caller gets an error naming the worker within seconds, new calls fail fast while it
    is down, and after `cluster up` the same call answers again. On the lattice set the steps are
    routed: each reads one worker, and the first step whose cell lies on the stopped one fails."""
    worker = citus.worker(2)
    long_call = f"SELECT generate_tokens(ARRAY[4, 9, 16], 4096, 1.0, 40, 0.9, NULL, 100, '{name}', 1.0, 7)"
    outcome: dict = {}

    def run() -> None:
        start = time.monotonic()
        try:
            with psycopg.connect(citus.url()) as conn:
                outcome["result"] = conn.execute(long_call).fetchone()
        except psycopg.Error as exc:
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(2.0)
    assert thread.is_alive(), "the long call finished before the worker could be stopped"
    stopped_at = time.monotonic()
    assert worker.down() == "stopped"
    try:
        thread.join(timeout=60)
        assert not thread.is_alive(), "next_token hung after its worker stopped"
        assert "error" in outcome, "the call succeeded although a worker it needs was stopped"
        assert time.monotonic() - stopped_at < 30
        message = str(outcome["error"])
        assert re.search(r"127\.0\.0\.1:\d+|remote node|connection", message), message
        start = time.monotonic()
        with pytest.raises(psycopg.Error) as down:
            coord.execute(NEXT_TOKEN, ([3, 7, 11], 1.0, 40, 0.9, None, 100, "citustest_gauss", 1.0))
        assert time.monotonic() - start < 20, "a call with a worker down must fail within the connection timeout"
        assert f"127.0.0.1:{worker.state().port}" in str(down.value)
    finally:
        citus.up()
    again = coord.execute(NEXT_TOKEN, ([3, 7, 11], 1.0, 40, 0.9, None, 100, "citustest_gauss", 1.0)).fetchall()
    assert len(again) > 0 and abs(again[-1][2] - 1.0) < TOL


# --- migration 0018 on a coordinator (last: it leaves the cluster at 0017) -----------------------

def test_the_downgrade_spreads_atoms_by_id_again_and_an_upgrade_over_old_sets_says_what_to_do(
        citus, coord, single, cluster_ids) -> None:
    from hartonomous.db.citus import distribution_column

    migrate.downgrade(citus.url(), "0017")
    with psycopg.connect(citus.url(), autocommit=True) as conn:
        assert distribution_column(conn, "atoms") == "atom_id"
        assert distribution_column(conn, "memory_atoms") == "route"  # kept (hartonomous/db/citus.py says why)
        assert conn.execute("SELECT ht_routes()").fetchone() == (False,)
        args = ([3, 7, 11], 1.0, 0, 1.0, None, 100, "citustest_lattice_backoff", 1.0)
        assert_same_rows(conn.execute(NEXT_TOKEN, args).fetchall(), single.execute(NEXT_TOKEN, args).fetchall())
        assert conn.execute("SELECT * FROM knn_routing()").fetchone() == (0, 0)
    with pytest.raises(RuntimeError, match="rebuild them"):
        migrate.upgrade(citus.url())
    with psycopg.connect(citus.url()) as conn:
        assert distribution_column(conn, "atoms") == "atom_id"  # nothing half-done
