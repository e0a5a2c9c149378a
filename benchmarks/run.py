"""Run the benchmark suite and write JSON + a Markdown table (`hartonomous bench`)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import psycopg
from rich.console import Console
from rich.progress import Progress

from benchmarks import concurrency, latency, synthetic, targets, throughput
from hartonomous.atomset import atom_set_names, list_atom_sets
from hartonomous.config import get_settings
from hartonomous.errors import UserError
from hartonomous.measure import describe_machine, exact_path

QUICK_SIZES = (10**4, 10**5, 10**6)
FULL_SIZES = (10**4, 10**5, 10**6, 10**7)
REAL_SETS = ("smollm2-token", "smollm2-context")
CONCURRENCY_LEVELS = (1, 2, 4, 8)
LATENCY_ROUNDS = 3                 # in-database timing: the sets take turns, a third of the calls each time
CONCURRENCY_SET = 10**6            # the set the concurrency runs use (the largest one if smaller)
BYTES_PER_ATOM = 260               # heap + GiST + primary key, measured at 10^7 (2.57 GB)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _ingest_row(n: int, report, stored: dict | None) -> dict | None:
    if report is not None:
        return {"atoms": n, "atoms_per_s": report.atoms_per_second, "copy_s": report.copy_seconds,
                "index_build_s": report.index_seconds, "total_s": report.total_seconds,
                "built": "this run", "layout": synthetic.INDEX_LAYOUT}
    if stored:
        return {"atoms": n, "atoms_per_s": stored.get("atoms_per_second"), "copy_s": stored.get("copy_seconds"),
                "index_build_s": stored.get("index_seconds"), "total_s": stored.get("total_seconds"),
                "built": stored.get("built_at"), "layout": synthetic.INDEX_LAYOUT}
    return None


def check_disk(url: str, sizes: tuple[int, ...]) -> None:
    """Refuse a run whose synthetic sets would not fit on the embedded cluster's disk."""
    from hartonomous.db.connection import embedded_cluster

    if get_settings().database_url:  # an external server: its disk is not ours to check
        return
    data_dir = Path(embedded_cluster().data_dir)
    with psycopg.connect(url) as conn:
        have = set(atom_set_names(conn))
    need = sum(n * BYTES_PER_ATOM for n in sizes if synthetic.synthetic_name(n) not in have)
    if need and data_dir.exists() and shutil.disk_usage(data_dir).free < 1.5 * need:
        free = shutil.disk_usage(data_dir).free / 2**30
        raise UserError(f"the synthetic atom sets need ~{need / 2**30:.1f} GiB and {free:.1f} GiB is free "
                        f"under {data_dir}; free some space or run `hartonomous bench --quick`")


def run(url: str, *, full: bool = False, calls: int = 300, brute_calls: int = 10,
        concurrency_seconds: float = 5.0, generation: bool = True, rebuild: bool = False,
        sizes: tuple[int, ...] | None = None, concurrency_levels: tuple[int, ...] = CONCURRENCY_LEVELS,
        real_sets: tuple[str, ...] = REAL_SETS, console: Console | None = None) -> dict:
    console = console or Console(stderr=True)
    sizes = tuple(sizes) if sizes else (FULL_SIZES if full else QUICK_SIZES)
    results: dict = {"mode": "full" if full else "quick", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "machine": {}, "sizes": list(sizes), "load_1m": {"start": _load()},
                     "latency": [], "ingest": [], "concurrency": [],
                     "method": {"in_db_timer": latency.TIMER_NOTE, "in_db_rounds": LATENCY_ROUNDS,
                                "max_neighbors": 100,
                                "context_length": 8, "calls_per_set": calls,
                                "brute_force_calls": brute_calls, "index_layout": synthetic.INDEX_LAYOUT}}
    with psycopg.connect(url) as conn, Progress(console=console, transient=True) as progress:
        results["machine"] = describe_machine(conn)  # the exact path's keys are filled in if it runs
        conn.commit()
        task = progress.add_task("synthetic atom sets", total=len(sizes))
        for n in sizes:
            progress.update(task, description=f"synthetic set of {n:,} atoms")
            report = synthetic.ensure_synthetic_atom_set(conn, n, rebuild=rebuild)
            row = _ingest_row(n, report, synthetic.stored_ingest(conn, synthetic.synthetic_name(n)))
            if row:
                results["ingest"].append(row)
            progress.advance(task)
        real_sets_found = {s.name: s for s in list_atom_sets(conn) if s.name in real_sets}
        real = sorted(real_sets_found)
        conn.commit()
        results["real_sets_missing"] = [name for name in real_sets if name not in real]

        contexts = synthetic.random_contexts(calls, synthetic.SYNTHETIC_VOCAB)
        brute = contexts[:brute_calls]
        work = [(synthetic.synthetic_name(n), n, contexts, brute) for n in sizes]
        for name in real:
            found = real_sets_found[name]
            real_contexts = synthetic.random_contexts(calls, min(found.vocab_size, 5000), seed=2)
            work.append((name, found.atoms, real_contexts, real_contexts[:min(3, brute_calls)]))
        results["load_1m"]["latency_start"] = _load()
        progress.update(progress.add_task("in-database time, interleaved rounds", total=None),
                        description=f"in-database time: {len(work)} atom sets, {LATENCY_ROUNDS} interleaved rounds")
        in_db = latency.interleaved_in_database(url, [(w[0], w[2]) for w in work], rounds=LATENCY_ROUNDS)
        task = progress.add_task("next_token latency", total=len(work))
        for name, atoms, ctxs, brute_ctxs in work:
            progress.update(task, description=f"buffers, round trip and brute force on {name}")
            res = latency.measure(url, name, atoms, ctxs, brute_contexts=brute_ctxs, in_db=in_db[name])
            results["latency"].append(res.as_dict())
            progress.advance(task)

        results["load_1m"]["concurrency_start"] = _load()
        task = progress.add_task("concurrency", total=len(concurrency_levels))
        mid = synthetic.synthetic_name(CONCURRENCY_SET if CONCURRENCY_SET in sizes else max(sizes))
        results["concurrency_atom_set"] = mid
        for clients in concurrency_levels:
            progress.update(task, description=f"{clients} concurrent clients")
            row = concurrency.run_clients(url, mid, contexts, clients, seconds=concurrency_seconds)
            row["load_1m"] = _load()
            results["concurrency"].append(row)
            progress.advance(task)

    if generation:
        results["load_1m"]["generation_start"] = _load()
        gen: dict = {}
        if "smollm2-context" in real:
            gen.update(throughput.spatial("smollm2-context"))
        else:
            gen["spatial_note"] = ("no smollm2-context atom set: build it (hartonomous build --name "
                                   "smollm2-context --kind context) for the spatial generation rows")
        console.print("exact path on CPU (loads SmolLM2)…")
        gen.update(throughput.exact("cpu"))
        import torch

        devices = ["cpu"]
        if torch.cuda.is_available():
            gen.update(throughput.exact("cuda"))
            devices.append("cuda")
        results["machine"].update(exact_path(", ".join(devices), get_settings().model))  # the Client's model
        results["throughput"] = gen
    else:
        results["throughput_note"] = "generation throughput not measured (--no-generation)"
    results["load_1m"]["end"] = _load()
    results["targets"] = targets.evaluate(results)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return results


def _f(value, fmt: str = ".3f", none: str = "—") -> str:
    return none if value is None else format(value, fmt)


def markdown(results: dict, command: str) -> str:
    m = results["machine"]
    s = m.get("server_settings") or {}
    load = results.get("load_1m", {})
    lines = [f"Command: `{command}`  ",
             f"Machine: {m.get('cpu', '?')}, {m.get('cores')} cores, {m.get('memory_gib', '?')} GiB; "
             f"PostgreSQL {m.get('postgresql')}, PostGIS {m.get('postgis')}, shared_buffers "
             f"{s.get('shared_buffers')}, jit={s.get('jit')}"
             + (f"; torch {m['torch']} ({m.get('torch_threads')} threads), GPU: {m.get('gpu') or 'none'}"
                if m.get("torch") else "") + "  ",
             *([f"Exact path: {m['exact_model']}  "] if m.get("exact_model") else []),
             f"Run: {results['started']} → {results['finished']}; load average (1 min): "
             + ", ".join(f"{k} {v}" for k, v in load.items()) + "  ",
             f"Index layout: {results['method']['index_layout']}  ",
             f"In-database time: {results['method']['in_db_timer']}", "",
             "### next_token latency (k = 100 neighbours, 8-token contexts)", "",
             "| atom set | atoms | in-db p50 (ms) | in-db p95 (ms) | p50 per round (ms) | backend CPU/call (ms) "
             "| round trip p50 (ms) | round trip p95 (ms) | shared buffers p50 | brute force p50 (ms) "
             "| index speed-up | load |",
             "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results["latency"]:
        sp = f"{r['index_speedup']:,.0f}×" if r.get("index_speedup") else "—"
        rounds = " / ".join(f"{x:.2f}" for x in r.get("in_db_round_p50_ms", []))
        lines.append(f"| {r['atom_set']} | {r['atoms']:,} | {r['in_db_p50_ms']:.3f} | {r['in_db_p95_ms']:.3f} | "
                     f"{rounds} | {_f(r.get('in_db_cpu_ms'))} | {r['roundtrip_p50_ms']:.3f} | {r['roundtrip_p95_ms']:.3f} | "
                     f"{r['shared_buffers_p50']:.0f} | {_f(r.get('brute_force_p50_ms'), ',.1f')} | {sp} | "
                     f"{'→'.join(str(x) for x in r.get('load_1m', []))} |")
    lines += ["", "Shared buffers per call by relation (mean):", "",
              "| atom set | " + " | ".join(("atoms heap", "atoms GiST index", "tokens primary key", "tokens heap",
                                           "other")) + " |", "|---|---:|---:|---:|---:|---:|"]
    for r in results["latency"]:
        b = r.get("buffers_by_relation", {})
        lines.append(f"| {r['atom_set']} | " + " | ".join(
            _f(b.get(k), ".1f", "0") for k in ("atoms heap", "atoms GiST index", "tokens primary key",
                                               "tokens heap", "other")) + " |")
    if results["ingest"]:
        lines += ["", "### Ingest (binary COPY in Hilbert order, then the GiST nd build; one transaction)", "",
                  "| atoms | atoms/s | COPY (s) | index build (s) | total (s) | built |",
                  "|---:|---:|---:|---:|---:|---|"]
        for r in results["ingest"]:
            lines.append(f"| {r['atoms']:,} | {_f(r['atoms_per_s'], ',.0f')} | {_f(r['copy_s'], '.1f')} | "
                         f"{_f(r['index_build_s'], '.1f')} | {_f(r['total_s'], '.1f')} | {r['built']} |")
    lines += ["", f"### Concurrency (next_token on {results.get('concurrency_atom_set')}, one connection "
              "and one thread per client)", "",
              "| clients | calls/s | p50 (ms) | p99 (ms) | errors | load |", "|---:|---:|---:|---:|---:|---:|"]
    for r in results["concurrency"]:
        lines.append(f"| {r['clients']} | {r['calls_per_second']:,.0f} | {_f(r['p50_ms'])} | {_f(r['p99_ms'])} | "
                     f"{len(r['errors'])} | {r.get('load_1m', '')} |")
    if results.get("throughput"):
        lines += ["", "### Generation throughput", "", "| measure | value |", "|---|---:|"]
        for key, value in results["throughput"].items():
            lines.append(f"| {key} | {value:,.2f} |" if isinstance(value, float) else f"| {key} | {value} |")
    elif results.get("throughput_note"):
        lines += ["", "### Generation throughput", "", results["throughput_note"]]
    if results.get("real_sets_missing"):
        lines += ["", "Real atom sets not present (not measured): " + ", ".join(results["real_sets_missing"])]
    lines += ["", "### Targets", "", "| what | target | measured | met | what limits it |", "|---|---|---:|---|---|"]
    for t in results["targets"]:
        measured = "not measured" if t["measured"] is None else f"{t['measured']}{(' ' + t['unit']) if t['unit'] else ''}"
        met = "—" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['what']} | {t['target']} | {measured} | {met} | {t['limit'] if t['met'] is False else ''} |")
    return "\n".join(lines) + "\n"


def write(results: dict, out_dir: Path, command: str) -> tuple[Path, Path]:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write to --out {out_dir}: {exc.strerror}") from exc
    stem = f"bench-{results['mode']}"
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps({**results, "command": command}, indent=2, default=str))
    md_path.write_text(markdown(results, command))
    return json_path, md_path


def check_ready(url: str) -> None:
    with psycopg.connect(url) as conn:
        if not conn.execute("SELECT 1 FROM pg_proc WHERE proname = 'next_token'").fetchone():
            raise UserError("next_token is not installed; run `hartonomous migrate` first")
