"""Run the benchmark suite and write JSON + a Markdown table (`hartonomous bench`)."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import psycopg
from rich.console import Console
from rich.progress import Progress

from hartonomous.benchmark import concurrency, latency, synthetic, targets, throughput
from hartonomous.errors import UserError

QUICK_SIZES = (10**4, 10**5, 10**6)
FULL_SIZES = (10**4, 10**5, 10**6, 10**7)
REAL_SETS = ("smollm2-token", "smollm2-context")


def machine() -> dict:
    import torch

    info = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    try:
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                                 if line.startswith("model name"))
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (OSError, StopIteration, ValueError):
        pass
    return info


def run(url: str, *, full: bool = False, calls: int = 300, brute_calls: int = 10,
        concurrency_seconds: float = 5.0, generation: bool = True, rebuild: bool = False,
        console: Console | None = None) -> dict:
    console = console or Console(stderr=True)
    sizes = FULL_SIZES if full else QUICK_SIZES
    results: dict = {"mode": "full" if full else "quick", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "machine": machine(), "latency": [], "ingest": [], "concurrency": []}
    with psycopg.connect(url) as conn, Progress(console=console, transient=True) as progress:
        server = conn.execute("SHOW server_version").fetchone()[0]
        jit = conn.execute("SHOW jit").fetchone()[0]
        results["machine"].update(postgres=server, jit=jit)
        task = progress.add_task("synthetic atom sets", total=len(sizes))
        for n in sizes:
            progress.update(task, description=f"synthetic set of {n:,} atoms")
            report = synthetic.ensure_synthetic_atom_set(conn, n, rebuild=rebuild or n == 10**6)
            if report is not None:
                results["ingest"].append({
                    "atoms": n, "atoms_per_s": report.atoms_per_second, "copy_s": report.copy_seconds,
                    "index_build_s": report.index_seconds, "total_s": report.total_seconds,
                    "clustered": False, "order": "Morton (Z-order) before COPY",
                })
            progress.advance(task)
        real = [r[0] for r in conn.execute("SELECT name FROM atom_sets WHERE name = ANY(%s)",
                                           (list(REAL_SETS),)).fetchall()]
        real_sizes = dict(conn.execute(
            "SELECT s.name, (SELECT count(*) FROM atoms a WHERE a.atom_set_id = s.id) FROM atom_sets s "
            "WHERE s.name = ANY(%s)", (real,)).fetchall())
        conn.commit()

        contexts = synthetic.random_contexts(calls, synthetic.SYNTHETIC_VOCAB)
        brute = contexts[:brute_calls]
        task = progress.add_task("next_token latency", total=len(sizes) + len(real))
        for n in sizes:
            progress.update(task, description=f"next_token latency at {n:,} atoms")
            res = latency.measure(url, synthetic.synthetic_name(n), n, contexts,
                                  brute_contexts=brute if n <= 10**6 or full else None)
            results["latency"].append(res.as_dict())
            progress.advance(task)
        for name in real:
            vocab = conn.execute("SELECT vocab_size FROM atom_sets WHERE name = %s", (name,)).fetchone()[0]
            conn.commit()
            real_contexts = synthetic.random_contexts(calls, min(vocab, 5000), seed=2)
            res = latency.measure(url, name, int(real_sizes[name]), real_contexts, brute_contexts=brute[:3])
            results["latency"].append(res.as_dict())
            progress.advance(task)

        task = progress.add_task("concurrency", total=4)
        mid = synthetic.synthetic_name(10**6)
        for clients in (1, 2, 4, 8):
            progress.update(task, description=f"{clients} concurrent clients")
            results["concurrency"].append(concurrency.run_clients(url, mid, contexts, clients,
                                                                  seconds=concurrency_seconds))
            progress.advance(task)

    if generation:
        gen: dict = {}
        if "smollm2-context" in real or real:
            gen.update(throughput.spatial("smollm2-context" if "smollm2-context" in real else real[0]))
        else:
            gen["spatial_note"] = "no SmolLM2 atom set: run `make demo` (or hartonomous build) first"
        console.print("exact path on CPU (loads SmolLM2)…")
        gen.update(throughput.exact("cpu"))
        import torch

        if torch.cuda.is_available():
            gen.update(throughput.exact("cuda"))
        results["throughput"] = gen
    results["targets"] = targets.evaluate(results)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return results


def markdown(results: dict, command: str) -> str:
    m = results["machine"]
    lines = [f"Command: `{command}`  ",
             f"Machine: {m.get('cpu_model', '?')}, {m.get('cpu_count')} cores, {m.get('memory_gib', '?')} GiB, "
             f"PostgreSQL {m.get('postgres')}, jit={m.get('jit')}, torch {m.get('torch')} "
             f"({m.get('torch_threads')} threads), CUDA: {m.get('cuda') or 'none'}  ",
             f"Run: {results['started']} → {results['finished']}", "",
             "### next_token latency", "",
             "| atom set | atoms | in-db p50 (ms) | in-db p95 (ms) | round trip p50 (ms) | round trip p95 (ms) "
             "| shared buffers p50 | brute force p50 (ms) | index speed-up |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["latency"]:
        bf = f"{r['brute_force_p50_ms']:.1f}" if r.get("brute_force_p50_ms") else "—"
        sp = f"{r['index_speedup']:.0f}×" if r.get("index_speedup") else "—"
        lines.append(f"| {r['atom_set']} | {r['atoms']:,} | {r['in_db_p50_ms']:.3f} | {r['in_db_p95_ms']:.3f} | "
                     f"{r['roundtrip_p50_ms']:.3f} | {r['roundtrip_p95_ms']:.3f} | {r['shared_buffers_p50']:.0f} | "
                     f"{bf} | {sp} |")
    if results["ingest"]:
        lines += ["", "### Ingest (binary COPY in Morton order, GiST nd build, one transaction)", "",
                  "| atoms | atoms/s | COPY (s) | index build (s) | total (s) |", "|---:|---:|---:|---:|---:|"]
        for r in results["ingest"]:
            lines.append(f"| {r['atoms']:,} | {r['atoms_per_s']:,.0f} | {r['copy_s']:.1f} | "
                         f"{r['index_build_s']:.1f} | {r['total_s']:.1f} |")
    lines += ["", "### Concurrency (next_token at 10^6 atoms, one connection per client)", "",
              "| clients | calls/s | p50 (ms) | p99 (ms) | errors |", "|---:|---:|---:|---:|---:|"]
    for r in results["concurrency"]:
        lines.append(f"| {r['clients']} | {r['calls_per_second']:,.0f} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                     f"{len(r['errors'])} |")
    if results.get("throughput"):
        lines += ["", "### Generation throughput", "", "| measure | value |", "|---|---:|"]
        for key, value in results["throughput"].items():
            lines.append(f"| {key} | {value:,.2f} |" if isinstance(value, float) else f"| {key} | {value} |")
    lines += ["", "### Targets", "", "| what | target | measured | met |", "|---|---|---:|---|"]
    for t in results["targets"]:
        measured = "not measured" if t["measured"] is None else f"{t['measured']}{(' ' + t['unit']) if t['unit'] else ''}"
        met = "—" if t["met"] is None else ("yes" if t["met"] else "**no**")
        lines.append(f"| {t['what']} | {t['target']} | {measured} | {met} |")
    return "\n".join(lines) + "\n"


def write(results: dict, out_dir: Path, command: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"bench-{results['mode']}"
    json_path, md_path = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    json_path.write_text(json.dumps({**results, "command": command}, indent=2, default=str))
    md_path.write_text(markdown(results, command))
    return json_path, md_path


def check_ready(url: str) -> None:
    with psycopg.connect(url) as conn:
        if not conn.execute("SELECT 1 FROM pg_proc WHERE proname = 'next_token'").fetchone():
            raise UserError("next_token is not installed; run `hartonomous migrate` first")
