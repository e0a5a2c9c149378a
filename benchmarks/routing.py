"""Routed scale-out: one real lattice atom set on the single node and on a Citus cluster (docs/scale-out.md).

`hartonomous cluster bench --atom-set NAME`. The set lives on the single-node `db`; it is copied to
the running cluster with write_atom_set (same atom_sets fields, tokens and atoms; the build there
sets `route_spread` and distributes the atoms by their lattice cell), then, on both sides:

- next_token round trips (prepared statements, K = 100, the set's defaults; one untimed pass over
  the same calls first, so both sides are timed warm) on 8- and 512-token contexts of held-out
  code (this repository's own hartonomous/**/*.py, not in the stored corpus, tokenized with
  SmolLM2's tokenizer), ending at seeded random positions; the 8-token context is the tail of the
  512-token one at the same position. The answers of the two sides are compared;
- generate_tokens tokens/s from the same prompts (seeded sampling, the same seeds on both sides),
  with the time per token, the coordinator backend's CPU, each node's CPU (its processes in
  /proc) and the whole machine's CPU (/proc/stat) per token, so the per-token time can be set
  against a next_token round trip;
- the routed KNN statement alone under EXPLAIN ANALYZE through the coordinator: its task count,
  the worker's time, and whether the worker walked the GiST in distance order or read and sorted
  the centre's whole cell;
- requests/s with 4 and 16 concurrent clients (benchmarks/concurrency.run_clients);
- on the cluster, the routed fraction of every measured block (knn_routing(), reset before it), and
  the skew: each shard's and worker's share of the set's atoms, the largest single cell's, and the
  largest shard's share if the same cells were hashed into 64 shards (Citus's ranges, checked here
  against the cluster's own shards).

The machine (CPU, cores, the load average before and after each block), the workers, the shard
count, Citus's version and ht_kernel() of both sides are recorded with the results. All nodes share
one machine: the point is what routing costs and saves per call, not a speed-up.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import numpy as np
import psycopg

from benchmarks.concurrency import run_clients
from benchmarks.latency import backend_cpu_ns, next_token_call
from hartonomous import sqlcalls
from hartonomous.errors import UserError
from hartonomous.measure import checkout, database, host, percentile
from hartonomous.sqlcalls import SpatialArgs

K = 100
CONTEXT_LENGTHS = (8, 512)
PROMPTS, NEW_TOKENS = 8, 64
CLIENTS = (4, 16)
CAPACITY_SHARDS = 64
MIN_CALLS = 20
PLAN_CALLS = 50
SEED = 0
TOLERANCE = 1e-9
INT32_MIN, HASH_TOKEN_COUNT = -(2**31), 2**32   # Citus: create_shards.c, metadata_utility.h

COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_COPY_TYPES = {"int2": ">i2", "int4": ">i4", "int8": ">i8", "float8": ">f8"}
ATOM_COLUMNS = (("token_id", "int4", "a.token_id"), ("x", "float8", "ST_X(a.position)"),
                ("y", "float8", "ST_Y(a.position)"), ("z", "float8", "ST_Z(a.position)"),
                ("weight", "float8", "coalesce(a.weight, 1.0)"), ("source", "int2", "coalesce(a.source, 0)"))


# --- reading a set fast ---------------------------------------------------------------------------

def parse_binary_copy(payload: bytes | bytearray | memoryview, columns: tuple[tuple[str, str], ...]) -> np.ndarray:
    """The rows of a binary COPY whose columns are all fixed-width and non-null, as one structured
    array (name -> big-endian values): no Python per row. Raises ValueError on anything else."""
    view = memoryview(payload)
    if bytes(view[:11]) != COPY_SIGNATURE:
        raise ValueError("not a PostgreSQL binary COPY (bad signature)")
    (extension,) = struct.unpack(">i", view[15:19])
    start = 19 + extension
    if len(view) < start + 2 or struct.unpack(">h", view[-2:])[0] != -1:
        raise ValueError("binary COPY without its trailer")
    descr: list = [("nfields", ">i2")]
    for name, kind in columns:
        descr += [(f"{name}_len", ">i4"), (name, _COPY_TYPES[kind])]
    dtype = np.dtype(descr)
    body = view[start:len(view) - 2]
    if len(body) % dtype.itemsize:
        raise ValueError("binary COPY rows are not all fixed-width (a NULL or a variable-width column?)")
    rows = np.frombuffer(body, dtype=dtype)
    if len(rows) and not (rows["nfields"] == len(columns)).all():
        raise ValueError(f"binary COPY rows do not all have {len(columns)} fields")
    for name, kind in columns:
        if len(rows) and not (rows[f"{name}_len"] == np.dtype(_COPY_TYPES[kind]).itemsize).all():
            raise ValueError(f"column {name}: a NULL or a value of another width")
    return rows


def copy_out(conn: psycopg.Connection, select: str, params: tuple = ()) -> bytearray:
    """`COPY (select) TO STDOUT (FORMAT BINARY)`, all of it."""
    buf = bytearray()
    with conn.cursor() as cur, cur.copy(f"COPY ({select}) TO STDOUT (FORMAT BINARY)", params or None) as copy:
        for chunk in copy:
            buf += chunk
    return buf


def read_atom_set(conn: psycopg.Connection, name: str):
    """The set's atom_sets row, tokens (text, position) and atoms (token id, position, weight,
    source) as write_atom_set takes them; the atoms by binary COPY parsed with NumPy."""
    from hartonomous.atomset.record import BuildStats
    from hartonomous.atomset.write import AtomRows, AtomSetSpec, TokenRows

    row = conn.execute(
        "SELECT id, model, vocab_size, embedding_dim, projection, projection_params, kind, centroid_window, "
        "centroid_decay, kernel, bandwidth, stats, model_key, history_weight, history_window, risk_model "
        "FROM atom_sets WHERE name = %s", (name,)).fetchone()
    if row is None:
        raise UserError(f"the single-node db has no atom set '{name}'; list them with `hartonomous atom-sets list` "
                        "(after `hartonomous cluster down`)")
    (set_id, model, vocab, dim, projection, params, kind, window, decay, kernel, bandwidth, stats, model_key,
     history_weight, history_window, risk_model) = row
    spec = AtomSetSpec(name=name, model=model, vocab_size=vocab, embedding_dim=dim, projection=projection,
                       kind=kind, projection_params=params or {}, centroid_window=window, centroid_decay=decay,
                       kernel=kernel, bandwidth=bandwidth, stats=BuildStats.from_json(stats), model_key=model_key,
                       history_weight=history_weight, history_window=history_window, layout="rows",
                       risk_model=risk_model)
    tokens = conn.execute("SELECT token_id, text, ST_X(position), ST_Y(position), ST_Z(position) FROM tokens "
                          "WHERE atom_set_id = %s ORDER BY token_id", (set_id,)).fetchall()
    token_rows = TokenRows(token_ids=np.array([t[0] for t in tokens], dtype=np.int64), texts=[t[1] for t in tokens],
                           positions=np.array([t[2:] for t in tokens], dtype=np.float64))
    select = (f"SELECT {', '.join(f'{expr}::{kind}' for _, kind, expr in ATOM_COLUMNS)} "
              f"FROM atoms a WHERE a.atom_set_id = {int(set_id)}")
    rows = parse_binary_copy(copy_out(conn, select), tuple((n, k) for n, k, _ in ATOM_COLUMNS))
    atoms = AtomRows(token_ids=rows["token_id"].astype(np.int32),
                     positions=np.stack([rows["x"], rows["y"], rows["z"]], axis=1).astype(np.float64),
                     weights=rows["weight"].astype(np.float64), sources=rows["source"].astype(np.int16))
    return spec, token_rows, atoms


def _set_atoms(conn: psycopg.Connection, name: str) -> tuple[int, int] | None:
    row = conn.execute("SELECT id FROM atom_sets WHERE name = %s", (name,)).fetchone()
    if row is None:
        return None
    (count,) = conn.execute("SELECT count(*) FROM atoms WHERE atom_set_id = %s", row).fetchone()
    return int(row[0]), int(count)


def clone(single_url: str, cluster_url: str, name: str, say: Callable[[str], None] = print) -> dict:
    """The single node's set on the cluster (skipped when a set of that name with as many atoms is
    there), which must route: its `route_spread` is set."""
    from hartonomous.atomset.write import write_atom_set

    with psycopg.connect(single_url) as conn:
        source = _set_atoms(conn, name)
    if source is None:
        raise UserError(f"the single-node db has no atom set '{name}'")
    out: dict = {"atoms": source[1]}
    with psycopg.connect(cluster_url) as conn:
        there = _set_atoms(conn, name)
    if there is not None and there[1] == source[1]:
        out["copied"] = False
        say(f"clone: the cluster already has '{name}' with {source[1]:,} atoms; not copied again")
    else:
        t0 = time.perf_counter()
        with psycopg.connect(single_url) as conn:
            spec, tokens, atoms = read_atom_set(conn, name)
        out["read_seconds"] = round(time.perf_counter() - t0, 2)
        say(f"clone: read {len(atoms.token_ids):,} atoms in {out['read_seconds']} s; writing them to the cluster")
        with psycopg.connect(cluster_url) as conn:
            report = write_atom_set(conn, spec, tokens, atoms, replace=there is not None, progress=say)
        out.update(copied=True, write_seconds=round(report.total_seconds, 2))
    with psycopg.connect(cluster_url) as conn:
        spread, stats = conn.execute("SELECT route_spread, stats FROM atom_sets WHERE name = %s", (name,)).fetchone()
    if spread is None:
        raise UserError(f"the cluster's copy of '{name}' has no route_spread, so its KNN never routes: it is not a "
                        "lattice set with decayed-mean keys (hartonomous/atomset/routing.py); pick a lattice set")
    ingest = (stats or {}).get("ingest", {})
    out.update(route_spread=spread, ingest={k: ingest.get(k) for k in ("copy_seconds", "index_seconds",
                                                                          "total_seconds", "disk_bytes")})
    return out


# --- contexts -------------------------------------------------------------------------------------

def held_out_contexts(calls: int, lengths: tuple[int, ...] = CONTEXT_LENGTHS, seed: int = SEED) -> dict:
    """{length: contexts}: `calls` contexts of each length ending at the same seeded random positions
    of this repository's own source (benchmarks.match_depth.held_out_ids), and the token count."""
    from benchmarks.match_depth import held_out_ids

    ids = held_out_ids()
    longest = max(lengths)
    if len(ids) <= longest:
        raise UserError(f"the held-out source has {len(ids)} tokens, fewer than a {longest}-token context")
    ends = np.random.default_rng(seed).integers(longest, len(ids) + 1, calls)
    return {"tokens": len(ids), **{n: [ids[e - n:e] for e in ends.tolist()] for n in lengths}}


# --- measures -------------------------------------------------------------------------------------

def reset_routing(conn: psycopg.Connection) -> None:
    conn.execute("SET hartonomous.knn_routed = 0")
    conn.execute("SET hartonomous.knn_fanned_out = 0")


def routing(conn: psycopg.Connection) -> dict:
    """This session's routing counters as {routed, fanned_out, routed_fraction}."""
    routed, fanned = conn.execute("SELECT routed, fanned_out FROM knn_routing()").fetchone()
    total = routed + fanned
    return {"routed": int(routed), "fanned_out": int(fanned), "routed_fraction": routed / total if total else None}


def machine_cpu_ms() -> float:
    """Busy CPU time of the whole machine so far (all cores, /proc/stat), in ms."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    busy = sum(fields[:3]) + sum(fields[5:8])   # user nice system, irq softirq steal
    return busy * 1000 / os.sysconf("SC_CLK_TCK")


def node_cpu_ms(data_dir: Path) -> float | None:
    """CPU time (user + system, ms) of one PostgreSQL node so far: its postmaster and the processes it
    started that are alive now (backends that exited in between are not counted; the benchmark's
    connections, and the coordinator's cached connections to the workers, stay open)."""
    try:
        postmaster = int((Path(data_dir) / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    ticks = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(pid) == postmaster or int(fields[1]) == postmaster:
            ticks += int(fields[11]) + int(fields[12])
    return ticks * 1000 / os.sysconf("SC_CLK_TCK")


def nodes_cpu_ms(nodes: dict[str, Path]) -> dict[str, float | None]:
    return {name: node_cpu_ms(path) for name, path in nodes.items()}


def loads() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def next_token_round_trips(url: str, name: str, contexts: list[list[int]]) -> tuple[dict, list]:
    """Round trip p50/p95 of prepared next_token calls (after one untimed pass over the same
    contexts, so both sides are timed with their pages cached), the routing counters of the timed
    calls, and every answer."""
    before = loads()
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        for ctx in contexts:
            cur.execute(*next_token_call(ctx, K, name), prepare=True)
            cur.fetchall()
        reset_routing(conn)
        times, answers = [], []
        for ctx in contexts:
            t0 = time.perf_counter()
            cur.execute(*next_token_call(ctx, K, name), prepare=True)
            answers.append(cur.fetchall())
            times.append((time.perf_counter() - t0) * 1000)
        counts = routing(conn)
    return ({"calls": len(times), "p50_ms": percentile(times, 50), "p95_ms": percentile(times, 95), **counts,
             "load_before": before, "load_after": loads()}, answers)


def generation(url: str, name: str, prompts: list[list[int]], new_tokens: int = NEW_TOKENS,
               nodes: dict[str, Path] | None = None) -> tuple[dict, list]:
    """generate_tokens from each prompt (seed i for prompt i): tokens/s, ms per token, the caller's
    backend CPU, each node's CPU (`nodes`: name -> data directory) and the whole machine's CPU per
    token, the routing counters; and the outputs. The same generations run once untimed first, so
    both sides are timed with the pages they touch cached."""
    before = loads()
    spatial = SpatialArgs(max_neighbors=K)
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        for timed in (False, True):
            reset_routing(conn)
            node0, cpu0, machine0, t0 = nodes_cpu_ms(nodes or {}), backend_cpu_ns(conn), machine_cpu_ms(), \
                time.perf_counter()
            outputs = []
            for i, prompt in enumerate(prompts):
                query = sqlcalls.generate_tokens_query(prompt, new_tokens, spatial=spatial, atom_set=name, seed=i)
                cur.execute(query.sql, query.params, prepare=True)
                outputs.append(list(cur.fetchone()[0] or []))
            seconds, machine1, cpu1 = time.perf_counter() - t0, machine_cpu_ms(), backend_cpu_ns(conn)
            node1 = nodes_cpu_ms(nodes or {})
        counts = routing(conn)
    tokens = sum(len(o) for o in outputs)
    per_token = (lambda v: v / tokens if tokens else None)
    return ({"prompts": len(prompts), "new_tokens": new_tokens, "tokens": tokens, "seconds": round(seconds, 3),
             "tokens_per_second": tokens / seconds if seconds > 0 else None,
             "ms_per_token": per_token(seconds * 1000),
             "backend_cpu_ms_per_token": per_token((cpu1 - cpu0) / 1e6) if cpu0 is not None and cpu1 is not None
             else None,
             "machine_cpu_ms_per_token": per_token(machine1 - machine0),
             "node_cpu_ms_per_token": {n: per_token(node1[n] - node0[n]) if node0[n] is not None and node1[n] is not None
                                       else None for n in node0}, **counts,
             "load_before": before, "load_after": loads()}, outputs)


def same_answers(a: list, b: list) -> dict:
    """How many of the paired next_token answers differ (token ids and order, or a probability by
    more than TOLERANCE), with the first difference."""
    wrong, first = 0, None
    for i, (x, y) in enumerate(zip(a, b)):
        ok = [r[0] for r in x] == [r[0] for r in y] and all(abs(p - q) <= TOLERANCE for (_, p, _), (_, q, _) in zip(x, y))
        if not ok:
            wrong += 1
            first = first or {"call": i, "single": x[:3], "cluster": y[:3]}
    return {"compared": min(len(a), len(b)), "differ": wrong, "first_difference": first}


ROUTED_KNN = """EXPLAIN (ANALYZE, COSTS OFF)
SELECT a.token_id, a.weight, a.position <<->> c.p FROM atoms a,
       (SELECT ST_MakePoint(%(x)s, %(y)s, %(z)s) AS p) c
 WHERE a.atom_set_id = %(set_id)s AND a.route = ht_route_cell(%(x)s, %(y)s, %(z)s)
   AND a.position &&& ST_MakeLine(ST_MakePoint(round(%(x)s) - 0.5, round(%(y)s) - 0.5, round(%(z)s) - 0.5),
                                  ST_MakePoint(round(%(x)s) + 0.5, round(%(y)s) + 0.5, round(%(z)s) + 0.5))
 ORDER BY a.position <<->> ST_MakePoint(%(x)s, %(y)s, %(z)s) LIMIT %(k)s"""


def routed_knn_plans(conn: psycopg.Connection, name: str, contexts: list[list[int]]) -> dict:
    """The routed KNN statement (sql/015_knn.sql's cell query) at each context's centroid under
    EXPLAIN ANALYZE through the coordinator: the tasks, the worker's execution time, and whether
    the worker walked the GiST in distance order or read the whole cell and sorted it."""
    set_id, _ = _set_atoms(conn, name)
    conn.execute("SET citus.explain_all_tasks = on")
    tasks, worker_ms, total_ms, sorted_cells, cell_rows = [], [], [], 0, []
    for ctx in contexts:
        query = sqlcalls.context_centroid_query(ctx, name)
        x, y, z = conn.execute(query.sql, query.params).fetchone()
        plan = "\n".join(r for (r,) in conn.execute(ROUTED_KNN, {"x": x, "y": y, "z": z, "set_id": set_id, "k": K}))
        times = [float(v) for v in re.findall(r"Execution Time: ([\d.]+) ms", plan)]
        tasks.append(int(re.search(r"Task Count: (\d+)", plan).group(1)))
        worker_ms.append(max(times[:-1]))
        total_ms.append(times[-1])
        if "Sort Method" in plan:
            sorted_cells += 1
            scanned = re.search(r"Bitmap Heap Scan on \S+ a \(actual time=[\d.]+\.\.[\d.]+ rows=(\d+)", plan)
            if scanned:
                cell_rows.append(int(scanned.group(1)))
    return {"calls": len(contexts), "max_tasks": max(tasks), "worker_p50_ms": percentile(worker_ms, 50),
            "worker_p95_ms": percentile(worker_ms, 95), "statement_p50_ms": percentile(total_ms, 50),
            "sorted_whole_cell": sorted_cells, "sorted_cell_rows_p50": percentile(cell_rows, 50),
            "sorted_cell_rows_max": max(cell_rows, default=None)}


# --- skew -----------------------------------------------------------------------------------------

def hash_shards(hashes: np.ndarray, shards: int) -> np.ndarray:
    """The shard index of each int32 hash when Citus splits the int32 range into `shards` equal
    ranges (create_shards.c: shard i holds [INT32_MIN + i * 2^32/shards, + 2^32/shards - 1], the
    last one up to INT32_MAX)."""
    increment = HASH_TOKEN_COUNT // shards
    return np.minimum((np.asarray(hashes, dtype=np.int64) - INT32_MIN) // increment, shards - 1)


def skew(conn: psycopg.Connection, name: str, capacity_shards: int = CAPACITY_SHARDS) -> dict:
    """Each shard's and worker's share of the set's atoms on the cluster, the largest cell's, and the
    largest shard's share with the same cells hashed into `capacity_shards` shards. The hash ranges
    are checked against the cluster's own: the counts they predict per shard must be the real ones."""
    set_id, atoms = _set_atoms(conn, name)
    table = f"atoms_{set_id}"
    cells = conn.execute(f"SELECT route, count(*) FROM {table} GROUP BY route").fetchall()
    routes = np.array([c[0] for c in cells], dtype=np.int64)
    counts = np.array([c[1] for c in cells], dtype=np.int64)
    hashes = np.array([h for (h,) in conn.execute("SELECT hashint8(r) FROM unnest(%s::bigint[]) WITH ORDINALITY u(r, i) "
                                                   "ORDER BY i", (routes.tolist(),))], dtype=np.int64)
    shards = conn.execute(
        "SELECT s.shardid, s.shardminvalue::bigint, s.shardmaxvalue::bigint, p.nodename || ':' || p.nodeport, "
        "       r.result::bigint "
        "FROM pg_dist_shard s JOIN pg_dist_shard_placement p USING (shardid) "
        "JOIN run_command_on_shards(%s::regclass, 'SELECT count(*) FROM %%s') r USING (shardid) "
        "WHERE s.logicalrelid = %s::regclass ORDER BY s.shardminvalue::bigint", (table, table)).fetchall()
    predicted = [int(counts[(hashes >= lo) & (hashes <= hi)].sum()) for _, lo, hi, _, _ in shards]
    per_shard = [int(s[4]) for s in shards]
    per_worker: dict[str, int] = {}
    for _, _, _, node, n in shards:
        per_worker[node] = per_worker.get(node, 0) + int(n)
    hashed = np.bincount(hash_shards(hashes, capacity_shards), weights=counts, minlength=capacity_shards)
    return {"atoms": atoms, "cells": len(cells), "shards": len(shards),
            "atoms_per_shard": per_shard, "largest_shard_share": max(per_shard) / atoms,
            "atoms_per_worker": per_worker, "largest_worker_share": max(per_worker.values()) / atoms,
            "hash_ranges_match_cluster": predicted == per_shard,
            f"largest_shard_share_{capacity_shards}_shards": float(hashed.max()) / atoms,
            "capacity_shards": capacity_shards,
            "largest_cell_share": int(counts.max()) / atoms,
            "even_share_capacity": 1 / capacity_shards}


# --- the run --------------------------------------------------------------------------------------

def cluster_facts(conn: psycopg.Connection, name: str) -> dict:
    (set_id, _) = _set_atoms(conn, name)
    workers = [f"{h}:{p}" for h, p in conn.execute("SELECT * FROM citus_get_active_worker_nodes() ORDER BY 2")]
    (shards,) = conn.execute("SELECT count(*) FROM pg_dist_shard WHERE logicalrelid = %s::regclass",
                             (f"atoms_{set_id}",)).fetchone()
    (citus,) = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'citus'").fetchone()
    (kernel, routes) = conn.execute("SELECT ht_kernel(), ht_routes()").fetchone()
    return {"workers": workers, "shards": int(shards), "citus": citus, "ht_kernel": kernel, "ht_routes": routes,
            "route_spread": conn.execute("SELECT route_spread FROM atom_sets WHERE name = %s", (name,)).fetchone()[0]}


def run(single_url: str, cluster_url: str, name: str, calls: int, seconds: float, out: Path,
        say: Callable[[str], None] = print, command: str = "",
        nodes: dict[str, dict[str, Path]] | None = None) -> dict:
    """Every block on both sides (single node first), written to `out` as JSON after each. `nodes`:
    per side, each node's data directory (its CPU is read from /proc during generation)."""
    sides = {"single": single_url, "cluster": cluster_url}
    results: dict = {"mode": "scale-out-routed", "command": command, "atom_set": name,
                     "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "max_neighbors": K, "calls": calls, "machine": {**host(), **checkout()}, "rows": []}
    with psycopg.connect(single_url) as conn:
        results["machine"]["postgresql"] = database(conn)["postgresql"]
        results["single"] = {"ht_kernel": conn.execute("SELECT ht_kernel()").fetchone()[0]}

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2, default=str) + "\n")

    load0 = loads()
    results["clone"] = {**clone(single_url, cluster_url, name, say), "load_before": load0, "load_after": loads()}
    with psycopg.connect(cluster_url) as conn:
        results["cluster"] = cluster_facts(conn, name)
    contexts = held_out_contexts(calls)
    results["contexts"] = {"source": "hartonomous/**/*.py of this checkout (not in the stored corpus)",
                           "tokenizer": "SmolLM2 (hartonomous.model.load_tokenizer)", "tokens": contexts["tokens"],
                           "seed": SEED, "lengths": list(CONTEXT_LENGTHS),
                           "note": "each 8-token context is the tail of the 512-token one at the same position"}
    save()
    answers: dict = {}
    for length in CONTEXT_LENGTHS:
        for side, url in sides.items():
            row, answers[side, length] = next_token_round_trips(url, name, contexts[length])
            results["rows"].append({"measure": "next_token", "side": side, "context_tokens": length, **row})
            say(json.dumps(results["rows"][-1]))
        results.setdefault("agreement", {})[f"next_token_{length}"] = same_answers(answers["single", length],
                                                                                    answers["cluster", length])
        save()
    for length in CONTEXT_LENGTHS:
        outputs = {}
        for side, url in sides.items():
            row, outputs[side] = generation(url, name, contexts[length][:PROMPTS], nodes=(nodes or {}).get(side))
            results["rows"].append({"measure": "generate_tokens", "side": side, "context_tokens": length, **row})
            say(json.dumps(results["rows"][-1]))
        results["agreement"][f"generate_tokens_{length}"] = {
            "prompts": PROMPTS, "differ": sum(a != b for a, b in zip(outputs["single"], outputs["cluster"]))}
        save()
    before = loads()
    with psycopg.connect(cluster_url, autocommit=True) as conn:
        results["routed_knn_plans"] = {**routed_knn_plans(conn, name, contexts[CONTEXT_LENGTHS[0]][:PLAN_CALLS]),
                                       "load_before": before, "load_after": loads()}
    say(json.dumps(results["routed_knn_plans"]))
    save()
    for length in CONTEXT_LENGTHS:
        for clients in CLIENTS:
            for side, url in sides.items():
                before = loads()
                res = run_clients(url, name, contexts[length], clients, seconds=seconds, k=K)
                results["rows"].append({"measure": "concurrency", "side": side, "context_tokens": length, **res,
                                        "load_before": before, "load_after": loads()})
                say(json.dumps(results["rows"][-1]))
            save()
    before = loads()
    with psycopg.connect(cluster_url) as conn:
        results["skew"] = {**skew(conn, name), "load_before": before, "load_after": loads()}
    results["summary"] = summary(results)
    results["markdown"] = markdown(results)
    save()
    return results


# --- the report -----------------------------------------------------------------------------------

def _row(results: dict, measure: str, side: str, length: int, clients: int | None = None) -> dict | None:
    for r in results["rows"]:
        if (r["measure"], r["side"], r["context_tokens"]) == (measure, side, length) and \
                (clients is None or r.get("clients") == clients):
            return r
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summary(results: dict) -> list[dict]:
    """Cluster / single for each measure: round trip p50 and p95, tokens/s, requests/s."""
    out = []
    for length in sorted({r["context_tokens"] for r in results["rows"]}):
        s, c = _row(results, "next_token", "single", length), _row(results, "next_token", "cluster", length)
        if s and c:
            out.append({"measure": "next_token", "context_tokens": length,
                        "p50_ratio": _ratio(c["p50_ms"], s["p50_ms"]), "p95_ratio": _ratio(c["p95_ms"], s["p95_ms"]),
                        "routed_fraction": c["routed_fraction"]})
        s, c = _row(results, "generate_tokens", "single", length), _row(results, "generate_tokens", "cluster", length)
        if s and c:
            out.append({"measure": "generate_tokens", "context_tokens": length,
                        "tokens_per_second_ratio": _ratio(c["tokens_per_second"], s["tokens_per_second"]),
                        "routed_fraction": c["routed_fraction"]})
        for clients in sorted({r["clients"] for r in results["rows"] if r["measure"] == "concurrency"}):
            s = _row(results, "concurrency", "single", length, clients)
            c = _row(results, "concurrency", "cluster", length, clients)
            if s and c:
                out.append({"measure": "concurrency", "context_tokens": length, "clients": clients,
                            "requests_per_second_ratio": _ratio(c["calls_per_second"], s["calls_per_second"])})
    return out


def _f(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def _routed(row: dict) -> str:
    return f"{_pct(row.get('routed_fraction'))} ({row.get('routed', 0)} / {row.get('fanned_out', 0)})"


def _nodes(cpu: dict | None) -> str:
    return ", ".join(f"{name} {_f(ms)}" for name, ms in cpu.items()) if cpu else "—"


def _load(row: dict) -> str:
    return f"{row['load_before'][0]:.2f} → {row['load_after'][0]:.2f}" if row.get("load_before") else "—"


def markdown(results: dict) -> str:
    """The results as markdown tables: round trips, generation, concurrency, skew, with the machine."""
    m, cl = results.get("machine", {}), results.get("cluster", {})
    lines = [f"Atom set `{results['atom_set']}` ({results.get('clone', {}).get('atoms', 0):,} atoms), K = "
             f"{results['max_neighbors']}. Machine: {m.get('cpu')}, {m.get('cores')} cores, PostgreSQL "
             f"{m.get('postgresql')}; cluster: Citus {cl.get('citus')}, {len(cl.get('workers', []))} workers, "
             f"{cl.get('shards')} shards, route_spread {cl.get('route_spread')}; ht_kernel() single "
             f"{results.get('single', {}).get('ht_kernel')}, cluster {cl.get('ht_kernel')}. "
             "Routed: routed / (routed + fanned out) of the cluster's KNNs (routed / fanned out).", ""]
    agreement = results.get("agreement", {})
    lines += ["| context tokens | single p50 ms | single p95 ms | cluster p50 ms | cluster p95 ms | cluster/single p50 | "
              "cluster/single p95 | routed | answers differ | load 1 min |",
              "|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    for length in sorted({r["context_tokens"] for r in results["rows"] if r["measure"] == "next_token"}):
        s, c = _row(results, "next_token", "single", length), _row(results, "next_token", "cluster", length)
        if not (s and c):
            continue
        differ = agreement.get(f"next_token_{length}", {})
        lines.append(f"| {length} | {_f(s['p50_ms'])} | {_f(s['p95_ms'])} | {_f(c['p50_ms'])} | {_f(c['p95_ms'])} | "
                     f"{_f(_ratio(c['p50_ms'], s['p50_ms']))} | {_f(_ratio(c['p95_ms'], s['p95_ms']))} | {_routed(c)} | "
                     f"{differ.get('differ', '—')} of {differ.get('compared', '—')} | {_load(s)}; {_load(c)} |")
    lines += ["", "| prompt tokens | single tokens/s | cluster tokens/s | cluster/single | routed | cluster ms/token | "
              "cluster next_token p50 ms | coordinator backend CPU ms/token | cluster CPU ms/token by node | "
              "machine CPU ms/token (single; cluster) | outputs differ | load 1 min |",
              "|---:|---:|---:|---:|---|---:|---:|---:|---|---|---:|---|"]
    for length in sorted({r["context_tokens"] for r in results["rows"] if r["measure"] == "generate_tokens"}):
        s, c = _row(results, "generate_tokens", "single", length), _row(results, "generate_tokens", "cluster", length)
        rt = _row(results, "next_token", "cluster", length) or {}
        if not (s and c):
            continue
        differ = agreement.get(f"generate_tokens_{length}", {})
        lines.append(f"| {length} | {_f(s['tokens_per_second'], 1)} | {_f(c['tokens_per_second'], 1)} | "
                     f"{_f(_ratio(c['tokens_per_second'], s['tokens_per_second']))} | {_routed(c)} | "
                     f"{_f(c['ms_per_token'])} | {_f(rt.get('p50_ms'))} | {_f(c['backend_cpu_ms_per_token'])} | "
                     f"{_nodes(c.get('node_cpu_ms_per_token'))} | "
                     f"{_f(s['machine_cpu_ms_per_token'])}; {_f(c['machine_cpu_ms_per_token'])} | "
                     f"{differ.get('differ', '—')} of {differ.get('prompts', '—')} | {_load(s)}; {_load(c)} |")
    lines += ["", "| context tokens | clients | single requests/s | cluster requests/s | cluster/single | "
              "single p50 ms | cluster p50 ms | errors | load 1 min |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    keys = sorted({(r["context_tokens"], r["clients"]) for r in results["rows"] if r["measure"] == "concurrency"})
    for length, clients in keys:
        s = _row(results, "concurrency", "single", length, clients)
        c = _row(results, "concurrency", "cluster", length, clients)
        if not (s and c):
            continue
        lines.append(f"| {length} | {clients} | {_f(s['calls_per_second'], 1)} | {_f(c['calls_per_second'], 1)} | "
                     f"{_f(_ratio(c['calls_per_second'], s['calls_per_second']))} | {_f(s['p50_ms'])} | "
                     f"{_f(c['p50_ms'])} | {len(s['errors']) + len(c['errors'])} | {_load(s)}; {_load(c)} |")
    pl = results.get("routed_knn_plans")
    if pl:
        lines += ["", f"The routed KNN statement alone (EXPLAIN ANALYZE through the coordinator, {pl['calls']} "
                      f"8-token centroids): at most {pl['max_tasks']} task(s); the worker's execution p50 "
                      f"{_f(pl['worker_p50_ms'])} ms, p95 {_f(pl['worker_p95_ms'])} ms; the whole statement p50 "
                      f"{_f(pl['statement_p50_ms'])} ms; the worker read and sorted the whole cell in "
                      f"{pl['sorted_whole_cell']} of {pl['calls']} (cell rows p50 {_f(pl['sorted_cell_rows_p50'], 0)}, "
                      f"max {_f(pl['sorted_cell_rows_max'], 0)}) instead of walking the GiST in distance order."]
    sk = results.get("skew")
    if sk:
        n = sk["capacity_shards"]
        lines += ["", f"| cells | shards | largest shard share | largest worker share | even share | "
                      f"largest share hashed into {n} shards | even share at {n} | largest cell share | "
                      "hash ranges match the cluster |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        lines.append(f"| {sk['cells']:,} | {sk['shards']} | {_pct(sk['largest_shard_share'])} | "
                     f"{_pct(sk['largest_worker_share'])} | {_pct(1 / sk['shards'])} | "
                     f"{_pct(sk[f'largest_shard_share_{n}_shards'])} | {_pct(sk['even_share_capacity'])} | "
                     f"{_pct(sk['largest_cell_share'])} | {'yes' if sk['hash_ranges_match_cluster'] else 'NO'} |")
    return "\n".join(lines)
