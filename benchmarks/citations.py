"""What citations cost: the file table and occurrence index's size per token, the index's cost to
writing files, and store_sources' time per generated token (sql/100_sources.sql).

    python -m benchmarks.citations --tokens 1000000 --queries 1000 --out FILE
    python -m benchmarks.citations --database NAME --queries 1000 --out FILE   # re-time a --keep run's

Files: this Python's own source (the standard library, then site-packages), .py files sorted by
path, tokenized alone with SmolLM2's tokenizer, line starts as `hartonomous index` records them,
every file 'train', until --tokens. They are written into atom_set_files of a fresh database (the
trigger fills atom_set_file_grams, the expression index the keys) in one COPY. Sizes are
pg_total_relation_size (heap, TOAST and indexes) of both tables; the GIN index of the keys is
atom_set_files'. Queries: --queries positions of held-out text (this repository's own
hartonomous/**/*.py, not in the files) and as many of stored text (positions of the files, a
verbatim regeneration: the longest matches), each one store_sources call as the engine makes it
(the context's last 256 tokens and the generated token, k 5, memory on, an empty memory), timed
from Python around the call over a kept connection; medians and quantiles in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import sysconfig
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parents[1]
CALL = "SELECT count(*) FROM store_sources(%s, %s, 5, %s, true)"


def source_files() -> list[Path]:
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    return [p for root in roots for p in sorted(root.rglob("*.py")) if p.is_file() and not p.is_symlink()]


def tokenize(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """Token ids and line starts (the first token whose span ends beyond each line's first character)."""
    enc = tokenizer.encode(text, add_special_tokens=False)
    ends = np.maximum.accumulate(np.asarray([e for _s, e in enc.offsets] or [0], dtype=np.int64))
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n" and i + 1 < len(text)]
    lines = np.minimum(np.searchsorted(ends, starts, side="right"), max(len(enc.ids) - 1, 0))
    return list(enc.ids), lines.tolist()


def load_files(tokenizer, budget: int) -> list[tuple[str, list[int], list[int]]]:
    files, total = [], 0
    for path in source_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if not text.strip() or len(text) > 1_000_000:
            continue
        ids, lines = tokenize(tokenizer, text)
        files.append((str(path), ids, lines))
        total += len(ids)
        if total >= budget:
            break
    return files


def write_files(conn: psycopg.Connection, set_id: int, files) -> float:
    start = time.perf_counter()
    with conn.cursor().copy("COPY atom_set_files (atom_set_id, file_id, path, content_sha256, size_bytes, n_tokens, "
                            "split, license, license_source, token_ids, line_starts) FROM STDIN") as copy:
        for file_id, (path, ids, lines) in enumerate(files, 1):
            copy.write_row((set_id, file_id, path, b"\0" * 32, len(ids) * 4, len(ids), "train", None, "unknown",
                            ids, lines))
    conn.commit()
    return time.perf_counter() - start


def time_calls(conn: psycopg.Connection, name: str, cases: list[tuple[list[int], int]]) -> dict:
    times, cited = [], 0
    for context, token in cases:
        start = time.perf_counter()
        (rows,) = conn.execute(CALL, (context[-256:], name, token), prepare=True).fetchone()
        times.append((time.perf_counter() - start) * 1000)
        cited += rows > 0
    q = statistics.quantiles(times, n=20)
    return {"calls": len(times), "median_ms": statistics.median(times), "p10_ms": q[1], "p90_ms": q[17],
            "mean_ms": statistics.fmean(times), "cited_share": cited / len(times)}


def cases_from(ids: list[int], count: int, rng: np.random.Generator) -> list[tuple[list[int], int]]:
    ends = rng.integers(16, len(ids), count)
    return [(ids[max(0, e - 256):e], ids[e]) for e in ends]


def fill(server: str, tokens: int, tokenizer) -> tuple[str, dict]:
    """A fresh scratch database on `server` with --tokens of files written: (its name, write timings)."""
    from hartonomous.db import migrate

    files = load_files(tokenizer, tokens)
    name = f"citations_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = server.rsplit("/", 1)[0] + f"/{name}"
    migrate.upgrade(url)
    with psycopg.connect(url) as conn:
        (set_id,) = conn.execute(
            "INSERT INTO atom_sets (name, model, vocab_size, embedding_dim, projection, kind, centroid_window, "
            "centroid_decay, bandwidth) VALUES ('bench', 'smollm2', 49152, 3, 'lattice', 'context', 8, 0.0078125, "
            "1.0) RETURNING id").fetchone()
        conn.commit()
        write_s = write_files(conn, set_id, files)
        start = time.perf_counter()
        conn.execute("SELECT sum(cardinality(ht_file_grams(token_ids))) FROM atom_set_files").fetchone()
        grams_s = time.perf_counter() - start
    return name, {"write_s": write_s, "grams_s": grams_s}


def measure(url: str, queries: int, tokenizer) -> dict:
    """Sizes and store_sources' time per call on a filled scratch database."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE atom_set_files")
        conn.execute("VACUUM ANALYZE atom_set_file_grams")
        files = conn.execute("SELECT token_ids FROM atom_set_files ORDER BY file_id").fetchall()
        stored = sum(len(ids) for (ids,) in files)
        sizes = {table: conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()[0]
                 for table in ("atom_set_files", "atom_set_file_grams")}
        gin = conn.execute("SELECT pg_relation_size('atom_set_files_grams_gin')").fetchone()[0]
        rng = np.random.default_rng(0)
        held = []
        for path in sorted((ROOT / "hartonomous").rglob("*.py")):
            held += tokenize(tokenizer, path.read_text(encoding="utf-8"))[0]
        flat = [t for (ids,) in files for t in ids]
        conn.execute(CALL, (held[:10], "bench", held[10]))       # warm the session's plans
        return {"files": len(files), "tokens": stored, "bytes": sizes, "gin_index_bytes": gin,
                "bytes_per_token": {k: v / stored for k, v in sizes.items()},
                "total_bytes_per_token": sum(sizes.values()) / stored,
                "held_out": time_calls(conn, "bench", cases_from(held, queries, rng)),
                "stored": time_calls(conn, "bench", cases_from(flat, queries, rng))}


def run(server: str, tokens: int, queries: int, keep: bool, database: str | None = None) -> dict:
    from hartonomous.model import load_fast_tokenizer

    tokenizer = load_fast_tokenizer()._tokenizer
    written = {}
    if database is None:
        database, written = fill(server, tokens, tokenizer)
    url = server.rsplit("/", 1)[0] + f"/{database}"
    try:
        return {**measure(url, queries, tokenizer), **written, "database": database}
    finally:
        if not keep and written:
            with psycopg.connect(server, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--url", help="owner URL of a server to create the scratch database on (default: the CLI's)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database")
    parser.add_argument("--database", help="time a scratch database a --keep run filled (its name) instead")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.url is None:
        from hartonomous.db.connection import owner_url

        args.url = owner_url()
    load = os.getloadavg()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result = run(args.url, args.tokens, args.queries, args.keep, args.database)
    result.update(command=" ".join(["python -m benchmarks.citations"] + (argv or sys.argv[1:])),
                  started=started, load_before=load, load_after=os.getloadavg(), cpu=cpu_name())
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


if __name__ == "__main__":
    main()
