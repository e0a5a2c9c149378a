"""next_token latency: in-database (EXPLAIN ANALYZE execution time + shared buffers), client
round trip (prepared statement), and brute force (index scans disabled) as a ratio."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

import numpy as np
import psycopg

NEXT_TOKEN = ("SELECT token_id, probability, cumulative_probability FROM "
              "next_token(%s, 1.0, 40, 0.9, NULL, %s, %s, 1.0)")


@dataclass
class LatencyResult:
    atom_set: str
    atoms: int
    max_neighbors: int
    calls: int
    in_db_p50_ms: float
    in_db_p95_ms: float
    roundtrip_p50_ms: float
    roundtrip_p95_ms: float
    shared_buffers_p50: float
    shared_buffers_max: float
    brute_force_calls: int = 0
    brute_force_p50_ms: float | None = None
    index_speedup: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def in_database(conn: psycopg.Connection, atom_set: str, contexts: list[list[int]],
                k: int = 100) -> tuple[list[float], list[float]]:
    """Execution time (ms) and shared buffers (hit + read) of each call, from EXPLAIN ANALYZE."""
    times, buffers = [], []
    for ctx in contexts:
        (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) " + NEXT_TOKEN,
                               (ctx, k, atom_set)).fetchone()
        plan = plan if isinstance(plan, list) else json.loads(plan)
        top = plan[0]
        times.append(float(top["Execution Time"]))
        node = top["Plan"]
        buffers.append(float(node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)))
    return times, buffers


def roundtrip(conn: psycopg.Connection, atom_set: str, contexts: list[list[int]], k: int = 100) -> list[float]:
    """Wall time (ms) of execute + fetch of a prepared next_token from this client."""
    times = []
    with conn.cursor() as cur:
        for ctx in contexts:
            start = time.perf_counter()
            cur.execute(NEXT_TOKEN, (ctx, k, atom_set), prepare=True)
            cur.fetchall()
            times.append((time.perf_counter() - start) * 1000)
    return times


def brute_force(url: str, atom_set: str, contexts: list[list[int]], k: int = 100) -> list[float]:
    """The same query with index scans disabled, on a fresh session (so no cached plan)."""
    with psycopg.connect(url, autocommit=True) as conn:
        for setting in ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan"):
            conn.execute(f"SET {setting} = off")
        times, _ = in_database(conn, atom_set, contexts, k)
    return times


def measure(url: str, atom_set: str, atoms: int, contexts: list[list[int]], k: int = 100,
            brute_contexts: list[list[int]] | None = None, warmup: int = 20) -> LatencyResult:
    with psycopg.connect(url, autocommit=True) as conn:
        in_database(conn, atom_set, contexts[:warmup], k)
        db_times, buffers = in_database(conn, atom_set, contexts, k)
        roundtrip(conn, atom_set, contexts[:warmup], k)
        rt_times = roundtrip(conn, atom_set, contexts, k)
    result = LatencyResult(
        atom_set=atom_set, atoms=atoms, max_neighbors=k, calls=len(contexts),
        in_db_p50_ms=_pct(db_times, 50), in_db_p95_ms=_pct(db_times, 95),
        roundtrip_p50_ms=_pct(rt_times, 50), roundtrip_p95_ms=_pct(rt_times, 95),
        shared_buffers_p50=_pct(buffers, 50), shared_buffers_max=max(buffers) if buffers else float("nan"),
    )
    if brute_contexts:
        bf = brute_force(url, atom_set, brute_contexts, k)
        result.brute_force_calls = len(bf)
        result.brute_force_p50_ms = _pct(bf, 50)
        result.index_speedup = result.brute_force_p50_ms / result.in_db_p50_ms
    return result
