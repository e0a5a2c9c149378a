"""`hartonomous index` timed on a real repository: the first index, one changed and one removed file.

    python -m benchmarks.repository_index --root DIR --name NAME [--first] [--check 40] --out FILE.json

With --first the set is indexed from scratch (the model loaded, the files tokenized, the
parameters and the gate fitted, the file table written: the whole command). Then, on the set as
it is: the training file whose token count is nearest TARGET_TOKENS (2,000) is changed (a line
inserted at its middle, so its chunks after the edit shift) and `index` applied, timed end to end
(walk, compare, tokenize, apply, commit); the change is reverted (timed too); a file of about the
same size is removed and `index` applied, then restored. Every run is the whole `index_repository`
call, the walk of the directory included. With --check N, the changed set's next_token is then
compared on N contexts with a fresh index of the same files with the set's frozen parameters
(hartonomous.repository.update.write_fresh), the largest difference reported. Sizes: the file table
(atom_set_files with its TOAST and indexes, this set's rows) against the set's size on disk (its
atoms partition, tokens, token blocks and file rows). The JSON records the command, the CPU and
the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timed_index(root: Path, name: str, **kwargs) -> dict:
    from hartonomous.repository.index import index_repository

    t0 = time.perf_counter()
    report = index_repository(root, name, progress=False, **kwargs)
    seconds = time.perf_counter() - t0
    applied = report.atoms_applied
    return {"seconds": round(seconds, 3), "kind": report.kind, "added": report.added, "changed": report.changed,
            "removed": report.removed, "unchanged": report.unchanged, "atoms": report.atoms,
            "atoms_inserted": applied.inserted if applied else None, "atoms_updated": applied.updated if applied else None,
            "atoms_deleted": applied.deleted if applied else None, "stage_seconds": report.stage_seconds}


def sizes(conn, name: str) -> dict:
    set_id, stats = conn.execute("SELECT id, stats FROM atom_sets WHERE name = %s", (name,)).fetchone()
    (files_bytes, files, tokens) = conn.execute(
        "SELECT coalesce(sum(pg_column_size(f.*)), 0), count(*), coalesce(sum(n_tokens), 0) FROM atom_set_files f "
        "WHERE atom_set_id = %s", (set_id,)).fetchone()
    (table_total,) = conn.execute("SELECT pg_total_relation_size('atom_set_files')").fetchone()
    (atoms_bytes,) = conn.execute(f"SELECT pg_total_relation_size('atoms_{set_id}')").fetchone()
    (token_bytes,) = conn.execute("SELECT coalesce(sum(pg_column_size(t.*)), 0) FROM tokens t WHERE atom_set_id = %s",
                                  (set_id,)).fetchone()
    (block_bytes,) = conn.execute("SELECT coalesce(sum(pg_column_size(b.*)), 0) FROM token_blocks b "
                                  "WHERE atom_set_id = %s", (set_id,)).fetchone()
    (atoms,) = conn.execute("SELECT count(*) FROM atoms WHERE atom_set_id = %s", (set_id,)).fetchone()
    set_bytes = int(atoms_bytes) + int(token_bytes) + int(block_bytes) + int(files_bytes)
    return {"files": int(files), "file_tokens": int(tokens), "atoms": int(atoms),
            "file_rows_bytes": int(files_bytes), "atom_set_files_total_bytes": int(table_total),
            "atoms_partition_bytes": int(atoms_bytes), "tokens_bytes": int(token_bytes + block_bytes),
            "set_bytes": set_bytes, "file_table_share": round(int(files_bytes) / set_bytes, 4),
            "bytes_per_file_token": round(int(files_bytes) / max(int(tokens), 1), 2),
            "file_table_seconds": (stats.get("repository") or {}).get("file_table_seconds")}


def pick(conn, name: str, target: int, avoid: str | None = None) -> tuple[str, int]:
    """The training file whose token count is nearest `target` (not `avoid`)."""
    return conn.execute("SELECT f.path, f.n_tokens FROM atom_set_files f JOIN atom_sets s ON s.id = f.atom_set_id "
                        "WHERE s.name = %s AND f.split = 'train' AND f.path <> coalesce(%s, '') "
                        "ORDER BY abs(f.n_tokens - %s), f.path LIMIT 1", (name, avoid, target)).fetchone()


def frozen_index(url: str, like: str, name: str, root: Path) -> dict:
    """Write `name` as a fresh index of `root` with `like`'s frozen parameters; timed."""
    import psycopg

    from hartonomous.atomset import load_atom_set
    from hartonomous.atomset.catalog import tokenizer_for
    from hartonomous.repository.files import walk_repository
    from hartonomous.repository.index import entries_for
    from hartonomous.repository.split import unique_contents
    from hartonomous.repository.update import write_fresh

    t0 = time.perf_counter()
    with psycopg.connect(url) as conn:
        tokenizer = tokenizer_for(load_atom_set(conn, like))
        conn.rollback()
        files, duplicates = unique_contents(walk_repository(root).files)
        entries = entries_for(root, files, tokenizer)
        t1 = time.perf_counter()
        write_fresh(conn, like, name, str(root), entries)
    return {"like": like, "files": len(entries), "duplicates": duplicates,
            "tokens": int(sum(len(e.token_ids) for e in entries)),
            "train_tokens": int(sum(len(e.token_ids) for e in entries if e.split == "train")),
            "walk_and_tokenize_seconds": round(t1 - t0, 1), "write_seconds": round(time.perf_counter() - t1, 1)}


def check_equal(url: str, name: str, root: Path, contexts: int) -> dict:
    """next_token of the updated set against a fresh index of the same files with its frozen parameters."""
    import numpy as np
    import psycopg

    from hartonomous import sqlcalls
    from hartonomous.atomset import drop_atom_set, load_atom_set
    from hartonomous.atomset.catalog import tokenizer_for
    from hartonomous.repository.files import walk_repository
    from hartonomous.repository.index import entries_for
    from hartonomous.repository.split import unique_contents
    from hartonomous.repository.update import write_fresh

    fresh = f"{name[:50]}-fresh"
    with psycopg.connect(url) as conn:
        tokenizer = tokenizer_for(load_atom_set(conn, name))
        conn.rollback()
        files, _ = unique_contents(walk_repository(root).files)
        entries = entries_for(root, files, tokenizer)
        t0 = time.perf_counter()
        write_fresh(conn, name, fresh, str(root), entries)
        rebuild = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        train = [e for e in entries if e.split == "train" and len(e.token_ids) > 64]
        worst, compared = 0.0, 0
        try:
            for i in range(contexts):
                e = train[int(rng.integers(len(train)))]
                end = int(rng.integers(8, len(e.token_ids)))
                context = e.token_ids[max(0, end - 64):end].tolist()
                a = dict(sqlcalls.next_token(conn, context, atom_set=name))
                b = dict(sqlcalls.next_token(conn, context, atom_set=fresh))
                if a.keys() != b.keys():
                    worst = float("inf")
                    break
                worst = max([worst] + [abs(a[t] - b[t]) for t in a])
                compared += 1
        finally:
            conn.rollback()
            drop_atom_set(conn, fresh)
    return {"contexts": compared, "max_abs_difference": worst, "fresh_rebuild_seconds": round(rebuild, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--first", action="store_true", help="index from scratch first (the set must not exist)")
    parser.add_argument("--frozen-from", help="write the set NAME as a fresh index of ROOT with this indexed set's "
                        "frozen parameters (no model pass: for a set too large to calibrate here)")
    parser.add_argument("--target-tokens", type=int, default=2000)
    parser.add_argument("--check", type=int, default=0, help="compare next_token with a fresh index on N contexts")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    import psycopg

    from hartonomous.db.connection import owner_url

    url = owner_url()
    root = args.root.resolve()
    result: dict = {"command": "python -m benchmarks.repository_index " + " ".join(sys.argv[1:] if argv is None else argv),
                    "date": time.strftime("%Y-%m-%d"), "cpu": cpu_name(), "cores": os.cpu_count(),
                    "load_before": os.getloadavg(), "root": str(root)}
    if args.first:
        from projection.index import first_index

        result["first_index"] = timed_index(root, args.name, first_index=first_index)
    if args.frozen_from:
        result["fresh_index_with_frozen_parameters"] = frozen_index(url, args.frozen_from, args.name, root)
    with psycopg.connect(url) as conn:
        result["sizes"] = sizes(conn, args.name)
        changed, changed_tokens = pick(conn, args.name, args.target_tokens)
        removed, removed_tokens = pick(conn, args.name, args.target_tokens, avoid=changed)
    timed_index(root, args.name)                        # the set up to date with the folder before timing
    path = root / changed
    original = path.read_text(encoding="utf-8")
    lines = original.split("\n")
    path.write_text("\n".join(lines[:len(lines) // 2] + ["# an edited line, inserted at the file's middle"]
                              + lines[len(lines) // 2:]), encoding="utf-8")
    result["changed_file"] = {"path": changed, "tokens": changed_tokens, **timed_index(root, args.name)}
    if args.check:
        result["changed_file"]["equal_to_fresh_index"] = check_equal(url, args.name, root, args.check)
    path.write_text(original, encoding="utf-8")
    result["changed_file_reverted"] = timed_index(root, args.name)
    gone = root / removed
    keep = Path(tempfile.mkdtemp()) / gone.name          # outside the root: the walk must not see it
    shutil.move(gone, keep)
    try:
        result["removed_file"] = {"path": removed, "tokens": removed_tokens, **timed_index(root, args.name)}
    finally:
        shutil.move(keep, gone)
    result["removed_file_restored"] = timed_index(root, args.name)
    result["load_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
