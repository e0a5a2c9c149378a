"""Throughput of next_token with N concurrent clients, each on its own connection."""

from __future__ import annotations

import threading
import time

import psycopg

from benchmarks.latency import next_token_call
from hartonomous.measure import percentile


def run_clients(url: str, atom_set: str, contexts: list[list[int]], clients: int,
                seconds: float = 5.0, k: int = 100) -> dict:
    """Calls/s and per-call latency percentiles with `clients` threads for `seconds`."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    start_gate = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def worker(i: int) -> None:
        try:
            with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
                cur.execute(*next_token_call(contexts[0], k, atom_set), prepare=True)
                cur.fetchall()
                start_gate.wait()
                j = i
                while time.perf_counter() < stop_at[0]:
                    t0 = time.perf_counter()
                    cur.execute(*next_token_call(contexts[j % len(contexts)], k, atom_set), prepare=True)
                    cur.fetchall()
                    latencies[i].append((time.perf_counter() - t0) * 1000)
                    j += clients
        except Exception as exc:  # recorded, reported, never hidden
            errors.append(f"{type(exc).__name__}: {exc}")
            try:
                start_gate.abort()
            except threading.BrokenBarrierError:
                pass

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + seconds + 3600
    try:
        start_gate.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass
    began = time.perf_counter()
    stop_at[0] = began + seconds
    for t in threads:
        t.join(timeout=seconds + 60)
    elapsed = time.perf_counter() - began
    flat = [x for per in latencies for x in per]
    return {
        "clients": clients,
        "seconds": round(elapsed, 2),
        "calls": len(flat),
        "calls_per_second": len(flat) / elapsed if elapsed > 0 else 0.0,
        "p50_ms": percentile(flat, 50),
        "p99_ms": percentile(flat, 99),
        "errors": errors,
    }
