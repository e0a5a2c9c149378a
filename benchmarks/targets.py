"""The issue's performance targets, checked against measured values (a miss stays visible)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Target:
    what: str
    goal: str
    measure: Callable[[dict], float | None]
    ok: Callable[[float], bool]
    unit: str = ""
    limit: str = ""  # what limits it when missed (docs/benchmarks.md explains the measurements)


def _latency(results: dict, atoms: int, field: str) -> float | None:
    for row in results.get("latency", []):
        if row["atoms"] == atoms and row["atom_set"].startswith("bench-synthetic"):
            return row.get(field)
    return None


def _ratio(results: dict) -> float | None:
    hi, lo = _latency(results, 10**7, "in_db_p50_ms"), _latency(results, 10**5, "in_db_p50_ms")
    return hi / lo if hi and lo else None


def _throughput(results: dict, key: str) -> float | None:
    return (results.get("throughput") or {}).get(key)


def _speedup(results: dict) -> float | None:
    t = results.get("throughput") or {}
    spatial, exact = t.get("spatial_client_ms_per_token"), t.get("exact_cpu_ms_per_token")
    return exact / spatial if spatial and exact else None


TARGETS = [
    Target("next_token at 10^6 atoms, in-database (p50)", "≤ 1 ms",
           lambda r: _latency(r, 10**6, "in_db_p50_ms"), lambda v: v <= 1.0, " ms",
           "CPU work per call: the GiST KNN-100 ~60% (~2,500 index entries compared, ~75 heap "
           "fetches), the SQL kernel + sampler ~30% (window functions over 100 rows), checks, "
           "centroid and function calls ~10%; this VM's speed also varies ~1.7x from minute to "
           "minute (p50 per round)"),
    Target("next_token at 10^7 atoms, in-database (p50)", "≤ 1.5 ms",
           lambda r: _latency(r, 10**7, "in_db_p50_ms"), lambda v: v <= 1.5, " ms",
           "the same work as at 10^6 with ~30% more GiST entries compared (~3,300; the tree has 4 "
           "levels at both sizes); pages were warm (no reads) in this measurement"),
    Target("latency(10^7) / latency(10^5)", "≤ 2", _ratio, lambda v: v <= 2.0, "×",
           "the KNN visits more leaves as the tree deepens; sets are timed in interleaved rounds"),
    Target("index vs brute force at 10^6", "≥ 100× faster",
           lambda r: _latency(r, 10**6, "index_speedup"), lambda v: v >= 100, "×",
           "brute force is a parallel sequential scan plus a top-N sort"),
    Target("shared buffers per call at 10^6 (p50)", "≤ 50",
           lambda r: _latency(r, 10**6, "shared_buffers_p50"), lambda v: v <= 50, "",
           "the floor of a heap-based KNN-100: ~75 heap page pins (each neighbour is fetched from "
           "the heap; a pin counts whenever the next one is on another page), ~40 GiST pages, "
           "4 per context token (primary key + heap), 2 for the atom set; PostGIS has no "
           "index-only KNN"),
    Target("spatial generation, Python client", "≥ 500 tokens/s",
           lambda r: _throughput(r, "spatial_client_tokens_per_s"), lambda v: v >= 500, " tok/s",
           "one next_token round trip per token plus the Python engine loop"),
    Target("spatial generation, in-database", "≥ 1000 tokens/s",
           lambda r: _throughput(r, "spatial_in_db_tokens_per_s"), lambda v: v >= 1000, " tok/s",
           "each step is one next_token (~1.5 ms on smollm2-context); 1000 tokens/s needs ≤ 1 ms"),
    Target("spatial vs exact, per token on CPU", "≥ 25× faster", _speedup, lambda v: v >= 25, "×",
           "the spatial step's round trip against SmolLM2-135M's decode step on this CPU"),
]


def evaluate(results: dict) -> list[dict]:
    rows = []
    for target in TARGETS:
        value = target.measure(results)
        rows.append({
            "what": target.what, "target": target.goal,
            "measured": None if value is None else round(float(value), 3),
            "unit": target.unit.strip(),
            "met": None if value is None else bool(target.ok(float(value))),
            "limit": target.limit,
        })
    return rows
