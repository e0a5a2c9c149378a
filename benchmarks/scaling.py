"""The scaling table of atom sets built from one corpus at several sizes (docs/fidelity.md, issue 24).

    python -m benchmarks.scaling --out DIR SET [SET ...] [--reports DIR]

For each atom set, on one quiet machine, one after the other:

- **cost**: next_token's warm p50/p95 and the bare KNN-100's on 512-token windows of the set's own
  held-out text (its history weight and window), native kernel, timed in the server
  (benchmarks.kernel.measure: the same loop and alternation as `hartonomous bench --kernel`), and the
  shared buffers one call reads (EXPLAIN (ANALYZE, BUFFERS) of next_token, median);
- **the float4 recheck**: the GiST keeps float4 boxes, so atoms whose keys differ only beyond float4's
  resolution (deep keys sharing a long suffix) tie in the index and each must be fetched and its
  exact distance computed before the k nearest are known. Counted as the index entries one bare
  KNN-100 reads (the partition index's tuples-returned counter of the transaction,
  pg_stat_get_xact_tuples_returned) and the exact distances of those entries that tie the 100th
  at float4 (the entries read past the 100th are the recheck's extra work), with each call's
  execution time and the fitted cost of one entry read;
- **build**: training tokens, atoms, the seconds of every build stage and of the ingest, the atoms
  partition's size on disk (stats.stage_seconds, stats.ingest);
- **fidelity**, when `--reports DIR` holds `DIR/SET/report.json` from `hartonomous compare`: the spatial
  top-1 agreement with the exact argmax and its interval, and the paired difference to ∞-gram + cache.

Writes DIR/scaling.json and DIR/scaling.md with the command and the machine's load.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import psycopg

from benchmarks.kernel import measure, real_contexts
from hartonomous.atomset import load_atom_set
from hartonomous.measure import describe_machine, load_average

CONTEXT_LENGTH = 512
CALLS = 60
BUFFER_CALLS = 9


def buffers(conn: psycopg.Connection, name: str, contexts: list[list[int]]) -> float:
    """Median shared buffers (hit + read) of one next_token call."""
    counts = []
    for ctx in contexts[:BUFFER_CALLS]:
        (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM next_token(%s, atom_set => %s)",
                               (ctx, name)).fetchone()
        top = plan[0]["Plan"]
        counts.append(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0))
    return float(np.median(counts))


KNN_K = 100
FIT_SPREAD = 1000
KNN_READS = """
SELECT pg_stat_get_xact_tuples_returned(%(index)s::regclass)
"""


def index_reads(conn: psycopg.Connection, name: str, contexts: list[list[int]]) -> dict:
    """Index entries one bare KNN-100 reads at the centroid of each context (p50, p95, max), the
    share of calls reading more than 101 (the 100 it returns and at most one that ends the scan), and
    what reading costs: each call's warm execution time (EXPLAIN ANALYZE, second of two runs) and
    a least-squares line ms = a + b * entries read over the calls (None unless the reads span at
    least FIT_SPREAD entries)."""
    (set_id,) = conn.execute("SELECT id FROM atom_sets WHERE name = %s", (name,)).fetchone()
    index = f"atoms_{set_id}_position_idx"
    knn = (f"SELECT a.token_id FROM atoms a WHERE a.atom_set_id = {int(set_id)} "
           f"ORDER BY a.position <<->> %s::geometry LIMIT {KNN_K}")
    reads, ms = [], []
    for ctx in contexts:
        (center,) = conn.execute("SELECT context_centroid(%s, %s)::text", (ctx, name)).fetchone()
        for _ in range(2):
            (plan,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + knn, (center,)).fetchone()
        ms.append(plan[0]["Execution Time"])
        with conn.transaction():
            (before,) = conn.execute(KNN_READS, {"index": index}).fetchone()
            conn.execute(knn, (center,))
            (after,) = conn.execute(KNN_READS, {"index": index}).fetchone()
        reads.append(after - before)
    worst = int(np.argmax(reads))
    # The line needs reads that differ: with a spread under FIT_SPREAD entries it fits timing noise.
    slope = float(np.polyfit(reads, ms, 1)[0]) if max(reads) - min(reads) >= FIT_SPREAD else None
    return {"knn_index_reads_p50": float(np.median(reads)), "knn_index_reads_p95": float(np.percentile(reads, 95)),
            "knn_index_reads_max": int(reads[worst]), "knn_ms_at_max_reads": float(ms[worst]),
            "knn_explain_p50_ms": float(np.median(ms)), "knn_us_per_index_read": None if slope is None else slope * 1000,
            "knn_reads_past_k_share": float(np.mean([r > KNN_K + 1 for r in reads]))}


def fidelity(reports: Path | None, name: str) -> dict | None:
    path = reports / name / "report.json" if reports is not None else None
    if path is None or not path.exists():
        return None
    report = json.loads(path.read_text())
    top1 = report["fidelity"]["spatial"]["top1"]
    paired = next((c for c in report["comparisons"] if c["metric"] == "top1" and c["b"] == "∞-gram + cache"), None)
    return {"report": str(path), "positions": top1["n"], "top1": top1["mean"], "top1_ci95": top1["ci95"],
            "vs_infinigram_cache": None if paired is None else
            {k: paired[k] for k in ("difference", "interval", "p", "verdict")}}


def row(url: str, name: str, reports: Path | None) -> dict:
    with psycopg.connect(url, autocommit=True) as conn:
        info = load_atom_set(conn, name)
        contexts = real_contexts(conn, name, CALLS, CONTEXT_LENGTH)
        if contexts is None:
            raise SystemExit(f"atom set '{name}' has no held-out text of {CONTEXT_LENGTH + 1}+ tokens to time on")
        used = buffers(conn, name, contexts)
        reads = index_reads(conn, name, contexts)
    stats = info.stats
    cost = measure(url, name, "native", contexts, float(info.history_weight))
    ingest = stats.ingest
    extra = stats.model_extra or {}
    return {"atom_set": name, "kernel": info.kernel, "window": info.centroid_window, "decay": info.centroid_decay,
            "projection": info.projection, "train_tokens": stats.corpus.train_tokens if stats.corpus else None,
            "atoms": ingest.atoms if ingest else None, "next_token_buffers_p50": used, **reads,
            **{k: cost[k] for k in ("next_token_p50_ms", "next_token_p95_ms", "knn_p50_ms", "overhead_p50_ms")},
            "stage_seconds": extra.get("stage_seconds"),
            "ingest_seconds": ingest.total_seconds if ingest else None,
            "disk_bytes": getattr(ingest, "disk_bytes", None) if ingest else None,
            "fidelity": fidelity(reports, name)}


def markdown(result: dict) -> str:
    lines = [f"# Scaling: {', '.join(r['atom_set'] for r in result['rows'])}", "",
             f"`{result['command']}` on {result['machine'].get('cpu')} ({result['machine'].get('cores')} cores); load before {result['load_before']}, "
             f"after {result['load_after']}.", "",
             "| atom set | training tokens | atoms | top-1 [95% CI] | vs ∞-gram + cache | next_token p50 / p95 (ms) "
             "| KNN p50 (ms) | KNN index reads p50 / p95 / max (ms of the max) | µs per read | buffers | build (s) | ingest (s) | disk (MB) |",
             "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        f = r["fidelity"]
        top1 = f"{f['top1']:.3f} [{f['top1_ci95'][0]:.3f}, {f['top1_ci95'][1]:.3f}]" if f else "—"
        vs = f["vs_infinigram_cache"] if f else None
        vs = f"{vs['difference']:+.3f} [{vs['interval'][0]:+.3f}, {vs['interval'][1]:+.3f}] {vs['verdict']}" if vs else "—"
        build = f"{sum(r['stage_seconds'].values()):.0f}" if r["stage_seconds"] else "—"
        disk = f"{r['disk_bytes'] / 1e6:.0f}" if r["disk_bytes"] else "—"
        lines.append(f"| {r['atom_set']} | {r['train_tokens']:,} | {r['atoms']:,} | {top1} | {vs} | "
                     f"{r['next_token_p50_ms']:.2f} / {r['next_token_p95_ms']:.2f} | {r['knn_p50_ms']:.2f} | "
                     f"{r['knn_index_reads_p50']:.0f} / {r['knn_index_reads_p95']:.0f} / {r['knn_index_reads_max']} "
                     f"({r['knn_ms_at_max_reads']:.2f} ms) | {_fitted(r['knn_us_per_index_read'])} | "
                     f"{r['next_token_buffers_p50']:.0f} | {build} | {r['ingest_seconds'] or 0:.0f} | {disk} |")
    return "\n".join(lines) + "\n"


def _fitted(us: float | None) -> str:
    return "—" if us is None else f"{us:.2f}"


def main(argv: list[str] | None = None) -> None:
    from hartonomous.config import get_settings
    from hartonomous.db.connection import owner_url

    parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("atom_sets", nargs="+", help="atom sets, smallest first")
    parser.add_argument("--reports", type=Path, help="folder of `hartonomous compare` reports, one per set")
    parser.add_argument("--out", type=Path, default=Path("reports/scaling"))
    args = parser.parse_args(argv)
    url = owner_url(get_settings())
    before = load_average()
    rows = [row(url, name, args.reports) for name in args.atom_sets]
    with psycopg.connect(url) as conn:
        machine = describe_machine(conn)
    result = {"command": "python -m benchmarks.scaling " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": machine, "load_before": before, "load_after": load_average(), "rows": rows,
              "context_length": CONTEXT_LENGTH, "calls": CALLS}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaling.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "scaling.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
