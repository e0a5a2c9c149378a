"""Scale-out benchmark: next_token on one node vs a Citus coordinator + workers (docs/scale-out.md).

The same synthetic atom sets (benchmarks/synthetic.py: uniform atoms, queries spread
over the cube) are built on both databases, and for each size we take

- in-database latency p50/p95 (the server-side timer loop of benchmarks/latency.py);
- client round trip p50 and throughput with 1 and 4 concurrent clients;
- the CPU time of the caller's backend per call (on the cluster: the coordinator's);
- on the cluster, the KNN statement alone under EXPLAIN ANALYZE with every task shown: the
  slowest shard's execution time per call (the per-shard cost), the sum over the shards (the
  workers' work), and the rest (the coordinator's fan-out, waits and merge), which is what the
  capacity plan extrapolates from;
- bytes per atom: the set's heap + GiST + primary key, summed over its shards on the cluster.

On one machine the workers share the cores with the coordinator, so the point is correctness
and overhead, not speed-up.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import psycopg

from benchmarks.concurrency import run_clients
from benchmarks.latency import in_database, roundtrip
from benchmarks.synthetic import SYNTHETIC_VOCAB, ensure_synthetic_atom_set, random_contexts, synthetic_name
from hartonomous.atomset import load_atom_set
from hartonomous.measure import percentile

K = 100
FAN_OUT_MAX_ATOMS = 1_000_000


def _set_id(conn: psycopg.Connection, name: str) -> int:
    return load_atom_set(conn, name).id


def bytes_per_atom(conn: psycopg.Connection, name: str, atoms: int, distributed: bool) -> float:
    """Heap + indexes of the set's partition (over all its shards on a cluster), per atom."""
    table = f"atoms_{_set_id(conn, name)}"
    if distributed:
        (size,) = conn.execute("SELECT citus_total_relation_size(%s::regclass)", (table,)).fetchone()
    else:
        (size,) = conn.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
    return float(size) / atoms


def knn_tasks(conn: psycopg.Connection, name: str, contexts: list[list[int]]) -> dict:
    """Per call: the KNN statement's total time and its slowest shard's time (EXPLAIN ANALYZE,
    every task shown), at each context's last-token position (the synthetic sets' centroid)."""
    set_id = _set_id(conn, name)
    conn.execute("SET citus.explain_all_tasks = on")
    totals, slowest, summed, tasks = [], [], [], 0
    for ctx in contexts:
        (x, y, z) = conn.execute("SELECT ST_X(position), ST_Y(position), ST_Z(position) FROM tokens "
                                 "WHERE atom_set_id = %s AND token_id = %s", (set_id, ctx[-1])).fetchone()
        plan = "\n".join(r for (r,) in conn.execute(
            "EXPLAIN (ANALYZE, COSTS OFF) SELECT token_id, weight, position <<->> ST_MakePoint(%s, %s, %s) "
            "FROM atoms WHERE atom_set_id = %s ORDER BY position <<->> ST_MakePoint(%s, %s, %s) LIMIT %s",
            (x, y, z, set_id, x, y, z, K)).fetchall())
        shard_ms = [float(v) for v in re.findall(r"Execution Time: ([\d.]+) ms", plan)]
        # The last "Execution Time" is the coordinator's whole statement; the others are tasks.
        totals.append(shard_ms[-1])
        slowest.append(max(shard_ms[:-1]))
        summed.append(sum(shard_ms[:-1]))
        tasks = len(shard_ms) - 1
    return {"tasks": tasks, "statement_p50_ms": percentile(totals, 50),
            "slowest_shard_p50_ms": percentile(slowest, 50), "all_shards_p50_ms": percentile(summed, 50),
            "coordinator_overhead_p50_ms": percentile([t - s for t, s in zip(totals, slowest)], 50)}


def knn_fan_out(conn: psycopg.Connection, name: str, shard_counts: tuple[int, ...] = (2, 4, 8, 16, 32),
                calls: int = 100) -> dict:
    """The bare KNN statement on copies of a set's atoms distributed over 2..32 shards: wall time and
    the coordinator backend's CPU per call, i.e. what each extra shard (task) costs the coordinator.
    The copies are dropped afterwards."""
    import numpy as np

    from benchmarks.latency import backend_cpu_ns

    source = f"atoms_{_set_id(conn, name)}"
    points = np.random.default_rng(5).random((calls + 20, 3)).tolist()
    out = {}
    for shards in shard_counts:
        table = f"bench_knn_{shards}_shards"
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (atom_id bigint, token_id int, weight float8, position geometry(PointZ, 0))")
        conn.execute("SELECT create_distributed_table(%s, 'atom_id', shard_count => %s, colocate_with => 'none')",
                     (table, shards))
        conn.execute(f"INSERT INTO {table} SELECT atom_id, token_id, weight, position FROM {source}")
        conn.execute(f"CREATE INDEX ON {table} USING gist (position gist_geometry_ops_nd)")
        conn.execute(f"ANALYZE {table}")
        query = (f"SELECT token_id, weight, position <<->> ST_MakePoint(%s, %s, %s) FROM {table} "
                 f"ORDER BY position <<->> ST_MakePoint(%s, %s, %s) LIMIT {K}")
        for p in points[:20]:
            conn.execute(query, (*p, *p)).fetchall()
        walls = []
        cpu0 = backend_cpu_ns(conn)
        for p in points[20:]:
            t0 = time.perf_counter()
            conn.execute(query, (*p, *p)).fetchall()
            walls.append((time.perf_counter() - t0) * 1000)
        cpu1 = backend_cpu_ns(conn)
        out[shards] = {"wall_p50_ms": percentile(walls, 50),
                       "coordinator_cpu_ms": (cpu1 - cpu0) / 1e6 / calls if cpu0 is not None else None}
        conn.execute(f"DROP TABLE {table}")
    return out


def measure(url: str, sizes: tuple[int, ...], calls: int, distributed: bool,
            say=print) -> list[dict]:
    rows = []
    contexts = random_contexts(calls, SYNTHETIC_VOCAB, seed=3)
    for n in sizes:
        name = synthetic_name(n)
        with psycopg.connect(url) as conn:
            t0 = time.perf_counter()
            report = ensure_synthetic_atom_set(conn, n)
            built_s = time.perf_counter() - t0 if report is not None else None
        say(f"{'cluster' if distributed else 'single'} {n}: built in {built_s}")
        with psycopg.connect(url, autocommit=True) as conn:
            in_database(conn, name, contexts[:30], K)  # warm-up
            times, cpu = in_database(conn, name, contexts, K)
            roundtrip(conn, name, contexts[:10], K)
            rt = roundtrip(conn, name, contexts, K)
            row = {"atoms": n, "distributed": distributed, "build_seconds": built_s,
                   "in_db_p50_ms": percentile(times, 50), "in_db_p95_ms": percentile(times, 95),
                   "backend_cpu_ms": cpu,
                   "roundtrip_p50_ms": percentile(rt, 50),
                   "bytes_per_atom": bytes_per_atom(conn, name, n, distributed)}
            if distributed:
                row.update(knn_tasks(conn, name, contexts[:60]))
        for clients in (1, 4):
            res = run_clients(url, name, contexts, clients, seconds=10.0, k=K)
            row[f"calls_per_second_{clients}"] = res["calls_per_second"]
            row[f"errors_{clients}"] = res["errors"]
        row["load_1m"] = round(os.getloadavg()[0], 2)
        say(json.dumps(row))
        rows.append(row)
    return rows


def run(single_url: str, cluster_url: str, sizes: tuple[int, ...], calls: int, out: Path) -> dict:
    """Both sides, one size at a time (single node first), written to `out` as JSON."""
    results: dict = {"sizes": list(sizes), "calls": calls, "max_neighbors": K, "rows": []}
    for n in sizes:
        results["rows"] += measure(single_url, (n,), calls, distributed=False)
        results["rows"] += measure(cluster_url, (n,), calls, distributed=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2))
    if min(sizes) <= FAN_OUT_MAX_ATOMS:  # it copies the set five times
        with psycopg.connect(cluster_url, autocommit=True) as conn:
            results["knn_fan_out"] = knn_fan_out(conn, synthetic_name(min(sizes)))
    results["load_1m_end"] = round(os.getloadavg()[0], 2)
    out.write_text(json.dumps(results, indent=2))
    return results


def markdown(results: dict) -> str:
    lines = ["| atoms | nodes | in-db p50 ms | in-db p95 ms | backend CPU ms/call | round trip p50 ms | "
             "calls/s (1 client) | calls/s (4 clients) | bytes/atom | KNN tasks | slowest shard p50 ms | "
             "all shards p50 ms | coordinator rest p50 ms |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["rows"]:
        nodes = "coordinator + 2 workers" if r["distributed"] else "1 node"
        extra = (f"{r['tasks']} | {r['slowest_shard_p50_ms']:.2f} | {r['all_shards_p50_ms']:.2f} | "
                 f"{r['coordinator_overhead_p50_ms']:.2f}" if r["distributed"] else "— | — | — | —")
        cpu = f"{r['backend_cpu_ms']:.2f}" if r.get("backend_cpu_ms") is not None else "—"
        lines.append(f"| {r['atoms']:,} | {nodes} | {r['in_db_p50_ms']:.2f} | {r['in_db_p95_ms']:.2f} | "
                     f"{cpu} | {r['roundtrip_p50_ms']:.2f} | {r['calls_per_second_1']:.1f} | {r['calls_per_second_4']:.1f} | "
                     f"{r['bytes_per_atom']:.0f} | {extra} |")
    return "\n".join(lines)
