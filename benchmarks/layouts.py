"""The storage layouts side by side (`hartonomous bench --layouts`): rows vs tiles (issue 18).

For each size, two synthetic atom sets hold the same uniform random atoms, one per layout
(hartonomous/atomset/write.py), with a context set's centroid (window 3, decay 0.01) and history
atoms on (weight 1, window 512). next_token is timed with K = 100 on 512-token contexts (history
atoms included: 511 per call) and on 8-token contexts, in the server (latency.in_database, the
sets taking turns in interleaved rounds), and its shared buffers per call are read from EXPLAIN
(ANALYZE, BUFFERS). Both layouts return the same rows (tests/test_layouts.py), so the faster one is
the build's default.
"""

from __future__ import annotations

import time

import numpy as np
import psycopg

from benchmarks import latency, synthetic
from hartonomous.atomset import AtomRows, AtomSetSpec, BuildStats, SyntheticStats, TokenRows, write_atom_set
from hartonomous.atomset.write import DEFAULT_LAYOUT, INDEX_LAYOUT, LAYOUTS, TILE_ATOMS
from hartonomous.measure import describe_machine, load_average, percentile

SIZES = (10**5, 10**6)
FULL_SIZES = (10**5, 10**6, 10**7)
CONTEXT_LENGTHS = (512, 8)
K = 100
HISTORY_WEIGHT, HISTORY_WINDOW = 1.0, 512
STORAGE = f"{INDEX_LAYOUT}; tiles of {TILE_ATOMS} atoms"


def set_name(n_atoms: int, layout: str) -> str:
    return f"bench-layout-{layout}-{n_atoms}"


def ensure_sets(conn: psycopg.Connection, n_atoms: int, seed: int = 0, rebuild: bool = False) -> list[str]:
    """Both layouts' sets of `n_atoms` (the same atoms), built unless they exist with this storage."""
    rng = np.random.default_rng(seed)
    tokens = TokenRows(np.arange(synthetic.SYNTHETIC_VOCAB), [f"tok{i}" for i in range(synthetic.SYNTHETIC_VOCAB)],
                       rng.random((synthetic.SYNTHETIC_VOCAB, 3)))
    atoms = AtomRows(rng.integers(0, synthetic.SYNTHETIC_VOCAB, n_atoms), rng.random((n_atoms, 3)))
    names = []
    for layout in LAYOUTS:
        name = set_name(n_atoms, layout)
        exists, stored = synthetic.stored_layout(conn, name)
        if rebuild or not exists or stored != STORAGE:
            spec = AtomSetSpec(name=name, model="synthetic", vocab_size=synthetic.SYNTHETIC_VOCAB, embedding_dim=0,
                               projection="synthetic", kind="context", centroid_window=3, centroid_decay=0.01,
                               history_weight=HISTORY_WEIGHT, history_window=HISTORY_WINDOW, layout=layout,
                               stats=BuildStats(synthetic=SyntheticStats(distribution="uniform unit cube", seed=seed,
                                                                         layout=STORAGE)))
            write_atom_set(conn, spec, tokens, atoms, replace=True)
        names.append(name)
    return names


def run(url: str, sizes: tuple[int, ...] = SIZES, calls: int = 100, rebuild: bool = False) -> dict:
    """Build what is missing, then time and count buffers for every (layout, size, context length)."""
    results: dict = {"mode": "layouts", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sizes": list(sizes),
                     "method": {"max_neighbors": K, "history_weight": HISTORY_WEIGHT,
                                "history_window": HISTORY_WINDOW, "calls": calls, "storage": STORAGE,
                                "in_db_timer": latency.TIMER_NOTE, "rounds": 3},
                     "load_1m": {"start": load_average()}, "rows": []}
    with psycopg.connect(url) as conn:
        results["machine"] = describe_machine(conn)
        conn.commit()
        sets = [(name, n) for n in sizes for name in ensure_sets(conn, n, rebuild=rebuild)]
    for length in CONTEXT_LENGTHS:
        contexts = synthetic.random_contexts(calls, synthetic.SYNTHETIC_VOCAB, length=length, seed=3)
        timed = latency.interleaved_in_database(url, [(name, contexts) for name, _ in sets], k=K)
        with psycopg.connect(url, autocommit=True) as conn:
            for name, n in sets:
                latency.explain(conn, name, contexts[:5], K)  # plans and pages
                _, buffers = latency.explain(conn, name, contexts[:min(calls, 50)], K)
                times, cpu, round_p50s = timed[name]
                results["rows"].append({
                    "atom_set": name, "layout": name.split("-")[2], "atoms": n, "context_length": length,
                    "in_db_p50_ms": percentile(times, 50), "in_db_p95_ms": percentile(times, 95),
                    "in_db_round_p50_ms": round_p50s, "in_db_cpu_ms": cpu,
                    "shared_buffers_p50": percentile(buffers, 50), "shared_buffers_max": max(buffers)})
    results["load_1m"]["end"] = load_average()
    results["verdict"] = verdict(results)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return results


def _row(results: dict, layout: str, atoms: int, length: int) -> dict | None:
    return next((r for r in results["rows"] if (r["layout"], r["atoms"], r["context_length"]) == (layout, atoms, length)),
                None)


def verdict(results: dict) -> dict:
    """Which layout is faster at the largest size with 512-token contexts, and each layout's scaling."""
    largest, smallest, length = max(results["sizes"]), min(results["sizes"]), CONTEXT_LENGTHS[0]
    p50 = {layout: (_row(results, layout, largest, length) or {}).get("in_db_p50_ms") for layout in LAYOUTS}
    scaling = {}
    for layout in LAYOUTS:
        big, small = _row(results, layout, largest, length), _row(results, layout, smallest, length)
        scaling[layout] = (round(big["in_db_p50_ms"] / small["in_db_p50_ms"], 2)
                           if big and small and small["in_db_p50_ms"] else None)
    faster = min((lay for lay in LAYOUTS if p50[lay] is not None), key=lambda lay: p50[lay], default=None)
    return {"at_atoms": largest, "context_length": length, "p50_ms": p50, "faster": faster,
            "build_default": DEFAULT_LAYOUT, f"p50_ratio_{largest}_over_{smallest}": scaling}


def markdown(results: dict, command: str) -> str:
    m, load = results["machine"], results["load_1m"]
    lines = [f"Command: `{command}`  ",
             f"Machine: {m.get('cpu', '?')}, {m.get('cores')} cores; PostgreSQL {m.get('postgresql')}, PostGIS "
             f"{m.get('postgis')}; load average (1 min) start {load.get('start')}, end {load.get('end')}  ",
             f"Storage: {results['method']['storage']}; K = {K}; history atoms weight {HISTORY_WEIGHT:g}, window "
             f"{HISTORY_WINDOW}; {results['method']['calls']} calls per set and context length", "",
             "| layout | atoms | context | in-db p50 (ms) | in-db p95 (ms) | p50 per round (ms) | backend CPU/call (ms) "
             "| shared buffers p50 | max |", "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
    for r in sorted(results["rows"], key=lambda r: (-r["context_length"], r["atoms"], r["layout"])):
        cpu = "—" if r["in_db_cpu_ms"] is None else f"{r['in_db_cpu_ms']:.3f}"
        lines.append(f"| {r['layout']} | {r['atoms']:,} | {r['context_length']} | {r['in_db_p50_ms']:.3f} | "
                     f"{r['in_db_p95_ms']:.3f} | {' / '.join(f'{x:.2f}' for x in r['in_db_round_p50_ms'])} | {cpu} | "
                     f"{r['shared_buffers_p50']:.0f} | {r['shared_buffers_max']:.0f} |")
    v = results["verdict"]
    lines += ["", f"Faster at {v['at_atoms']:,} atoms with {v['context_length']}-token contexts: **{v['faster']}** "
                  f"(p50 " + ", ".join(f"{k} {x:.3f} ms" for k, x in v["p50_ms"].items() if x is not None)
              + f"); the build's default layout is {v['build_default']}."]
    return "\n".join(lines) + "\n"
