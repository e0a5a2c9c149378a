"""next_token latency: in the database, as a client round trip, and brute force as a ratio.

How each number is taken (docs/benchmarks.md says the same):

- **in-database time**: a PL/pgSQL loop in the server (a temporary function, `pg_temp`) calls
  `next_token` once per context and reads `clock_timestamp()` before and after each call, so
  the time is the function's execution with its plans cached, without the client, the network
  protocol, parsing or EXPLAIN's instrumentation. The timer itself costs ~2 µs per call.
  `hartonomous bench` times all the atom sets in interleaved rounds (`interleaved_in_database`)
  so that the machine's load changes hit every set alike.
- **backend CPU per call**: the backend's on-CPU nanoseconds over the whole loop
  (`/proc/<pid>/schedstat`, only when the server runs on this machine), divided by the calls.
  On a loaded machine it stays close to the true cost while wall-clock percentiles grow.
- **shared buffers per call**: `EXPLAIN (ANALYZE, BUFFERS, TIMING OFF)` of the same call; the
  top node (the function scan) counts every buffer the function touches, nested statements
  included (checked against `pg_stat_get_xact_blocks_fetched`). Hits + reads: each time a
  scan pins a page counts once, so 100 heap tuples fetched from alternating pages count ~100.
- **round trip**: wall time of execute + fetch of a prepared statement from this client.
- **brute force**: the same loop on a fresh session with index scans (and bitmap scans) off,
  so `next_token` plans a sequential scan and a top-N sort of the whole atom set.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import psycopg

from hartonomous import sqlcalls
from hartonomous.atomset import load_atom_set
from hartonomous.measure import explain as explain_statement, percentile
from hartonomous.sqlcalls import SpatialArgs


def next_token_call(ctx: list[int], k: int, atom_set: str) -> tuple[str, dict]:
    """The benchmarked call: next_token with the sampler's defaults and K = k neighbours."""
    query = sqlcalls.next_token_query(ctx, spatial=SpatialArgs(max_neighbors=k), atom_set=atom_set)
    return query.sql, query.params


IN_DB_TIMER = """
CREATE OR REPLACE FUNCTION pg_temp.bench_next_token_ms(p_atom_set text, p_contexts integer[],
                                                       p_length integer, p_k integer)
RETURNS SETOF double precision LANGUAGE plpgsql AS $$
DECLARE
    t0  timestamptz;
    ctx integer[];
BEGIN
    FOR i IN 0 .. cardinality(p_contexts) / p_length - 1 LOOP
        ctx := p_contexts[i * p_length + 1 : (i + 1) * p_length];
        t0 := clock_timestamp();
        PERFORM count(*) FROM next_token(ctx, max_neighbors => p_k, atom_set => p_atom_set);
        RETURN NEXT extract(epoch FROM clock_timestamp() - t0) * 1000;
    END LOOP;
END
$$
"""

TIMER_NOTE = ("PL/pgSQL loop in the server, clock_timestamp() around each next_token call "
              "(plans cached; no client, protocol or EXPLAIN overhead)")


@dataclass
class LatencyResult:
    atom_set: str
    atoms: int
    max_neighbors: int
    calls: int
    in_db_p50_ms: float | None            # percentiles: None when there were no calls
    in_db_p95_ms: float | None
    roundtrip_p50_ms: float | None
    roundtrip_p95_ms: float | None
    shared_buffers_p50: float | None
    shared_buffers_p95: float | None
    shared_buffers_max: float | None
    in_db_cpu_ms: float | None = None       # mean backend CPU per call (None: server not local)
    in_db_round_p50_ms: list[float] = field(default_factory=list)  # p50 of each interleaved round
    explain_p50_ms: float | None = None     # EXPLAIN ANALYZE's execution time, for comparison
    buffers_by_relation: dict = field(default_factory=dict)
    brute_force_calls: int = 0
    brute_force_p50_ms: float | None = None
    index_speedup: float | None = None
    load_1m: list[float] = field(default_factory=list)  # load average before and after

    def as_dict(self) -> dict:
        return asdict(self)


def backend_cpu_ns(conn: psycopg.Connection) -> int | None:
    """On-CPU nanoseconds of this connection's backend, when it runs on this machine."""
    if conn.info.host not in ("localhost", "127.0.0.1", "::1") and not conn.info.host.startswith("/"):
        return None
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def in_database(conn: psycopg.Connection, atom_set: str, contexts: list[list[int]],
                k: int = 100) -> tuple[list[float], float | None]:
    """Per-call execution time (ms) from the server-side loop, and mean backend CPU ms per call."""
    length = len(contexts[0])
    if any(len(c) != length for c in contexts):
        raise ValueError("the in-database timer needs contexts of one length")
    conn.execute(IN_DB_TIMER)
    flat = [t for c in contexts for t in c]
    cpu0 = backend_cpu_ns(conn)
    times = [row[0] for row in conn.execute("SELECT * FROM pg_temp.bench_next_token_ms(%s, %s, %s, %s)",
                                            (atom_set, flat, length, k))]
    cpu1 = backend_cpu_ns(conn)
    cpu = (cpu1 - cpu0) / 1e6 / len(contexts) if cpu0 is not None and cpu1 is not None else None
    return times, cpu


def explain(conn: psycopg.Connection, atom_set: str, contexts: list[list[int]],
            k: int = 100) -> tuple[list[float], list[float]]:
    """Shared buffers (hit + read) of each call and EXPLAIN ANALYZE's execution time (ms)."""
    plans = [explain_statement(conn, *next_token_call(ctx, k, atom_set)) for ctx in contexts]
    return [p.execution_ms for p in plans], [p.shared_buffers for p in plans]


def buffers_by_relation(url: str, atom_set: str, contexts: list[list[int]], k: int = 100) -> dict:
    """Mean buffers per call by relation (atoms heap / GiST index, tokens, other), from the
    per-transaction statistics counters."""
    query = ("SELECT c.relname, pg_stat_get_xact_blocks_fetched(c.oid) FROM pg_class c "
             "WHERE c.relkind IN ('r', 'i', 't', 'p', 'I') AND pg_stat_get_xact_blocks_fetched(c.oid) > 0")
    with psycopg.connect(url) as conn:  # one transaction: the xact counters accumulate
        set_id = load_atom_set(conn, atom_set).id
        names = {f"atoms_{set_id}": "atoms heap", f"atoms_{set_id}_position_idx": "atoms GiST index",
                 "tokens": "tokens heap", "tokens_pkey": "tokens primary key"}
        for ctx in contexts[:3]:
            conn.execute(*next_token_call(ctx, k, atom_set)).fetchall()
        totals: dict[str, float] = {}
        for ctx in contexts:
            before = dict(conn.execute(query).fetchall())
            conn.execute(*next_token_call(ctx, k, atom_set)).fetchall()
            after = dict(conn.execute(query).fetchall())
            for rel, n in after.items():
                if rel == "pg_class":  # the counting query's own scan
                    continue
                key = names.get(rel, "other")
                totals[key] = totals.get(key, 0.0) + n - before.get(rel, 0)
        conn.rollback()
    return {key: round(v / len(contexts), 1) for key, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def roundtrip(conn: psycopg.Connection, atom_set: str, contexts: list[list[int]], k: int = 100) -> list[float]:
    """Wall time (ms) of execute + fetch of a prepared next_token from this client."""
    times = []
    with conn.cursor() as cur:
        for ctx in contexts:
            start = time.perf_counter()
            cur.execute(*next_token_call(ctx, k, atom_set), prepare=True)
            cur.fetchall()
            times.append((time.perf_counter() - start) * 1000)
    return times


def brute_force(url: str, atom_set: str, contexts: list[list[int]], k: int = 100) -> list[float]:
    """The in-database loop with index scans disabled, on a fresh session (so no cached plan)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan"):
            conn.execute(f"SET {setting} = off")
        times, _ = in_database(conn, atom_set, contexts, k)
    return times


def interleaved_in_database(url: str, work: list[tuple[str, list[list[int]]]], k: int = 100,
                            rounds: int = 3) -> dict[str, tuple[list[float], float | None, list[float]]]:
    """In-database times of several atom sets, measured in interleaved rounds.

    Each set gets its own session (plans stay cached); the contexts are split into `rounds`
    slices and the sets take turns, slice by slice, so a change in the machine's load spreads
    over every set instead of landing on one (otherwise the 10^7 / 10^5 ratio compares sets
    measured minutes apart). Each slice runs once untimed right before it is timed, so its
    pages are in shared buffers although all the sets together may not fit."""
    conns = {}
    try:
        for atom_set, contexts in work:
            conn = psycopg.connect(url, autocommit=True)
            conns[atom_set] = conn
            conn.execute("SET jit = off")
            in_database(conn, atom_set, contexts[:10], k)  # plans
        out: dict[str, tuple[list[float], list[float], list[float]]] = {name: ([], [], []) for name, _ in work}
        for r in range(rounds):
            for atom_set, contexts in work:
                part = contexts[r::rounds]
                in_database(conns[atom_set], atom_set, part, k)  # warm: the pages this slice touches
                times, cpu = in_database(conns[atom_set], atom_set, part, k)
                out[atom_set][0].extend(times)
                out[atom_set][1].append(cpu * len(part) if cpu is not None else float("nan"))
                out[atom_set][2].append(round(percentile(times, 50), 3))
        return {name: (times, (sum(cpus) / len(times)) if cpus and not np.isnan(sum(cpus)) else None, p50s)
                for name, (times, cpus, p50s) in out.items()}
    finally:
        for conn in conns.values():
            conn.close()


def measure(url: str, atom_set: str, atoms: int, contexts: list[list[int]], k: int = 100,
            brute_contexts: list[list[int]] | None = None, warmup: int = 20,
            in_db: tuple[list[float], float | None, list[float]] | None = None) -> LatencyResult:
    """Every latency number of one atom set; `in_db` passes times already measured (interleaved)."""
    load = [round(os.getloadavg()[0], 2)]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET jit = off")  # next_token pins it too; this keeps the timer loop alike
        if in_db is None:
            in_database(conn, atom_set, contexts, k)  # warm-up: plans and every page the calls touch
            times, cpu = in_database(conn, atom_set, contexts, k)
            in_db = (times, cpu, [round(percentile(times, 50), 3)])
        else:
            explain(conn, atom_set, contexts[:warmup], k)
        db_times, cpu, round_p50s = in_db
        explain_times, buffers = explain(conn, atom_set, contexts, k)
        roundtrip(conn, atom_set, contexts[:warmup], k)
        rt_times = roundtrip(conn, atom_set, contexts, k)
    result = LatencyResult(
        atom_set=atom_set, atoms=atoms, max_neighbors=k, calls=len(db_times),
        in_db_p50_ms=percentile(db_times, 50), in_db_p95_ms=percentile(db_times, 95),
        roundtrip_p50_ms=percentile(rt_times, 50), roundtrip_p95_ms=percentile(rt_times, 95),
        shared_buffers_p50=percentile(buffers, 50), shared_buffers_p95=percentile(buffers, 95),
        shared_buffers_max=max(buffers, default=None),
        in_db_cpu_ms=cpu, in_db_round_p50_ms=round_p50s, explain_p50_ms=percentile(explain_times, 50),
        buffers_by_relation=buffers_by_relation(url, atom_set, contexts[:30], k),
    )
    if brute_contexts:
        bf = brute_force(url, atom_set, brute_contexts, k)
        result.brute_force_calls = len(bf)
        result.brute_force_p50_ms = percentile(bf, 50)
        result.index_speedup = result.brute_force_p50_ms / result.in_db_p50_ms
    load.append(round(os.getloadavg()[0], 2))
    result.load_1m = load
    return result
