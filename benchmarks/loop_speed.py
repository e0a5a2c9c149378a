"""The in-database loop's speed: generate_tokens continuing a 512-token context, 256 tokens (issue 42 (11)).

The check: on the default set (the demo's smollm2-context), a 512-token window of the set's own
held-out text (benchmarks.kernel.real_contexts), 256 new tokens with the sampler's defaults and a
seed. Each run opens a fresh session, as `psql -c` does, and times its first call (what psql's
\\timing sees in a new session: the session's one-time costs included) and then a second one
(warm: plans, positions and the context's state kept). Both as wall seconds at the client and as
the backend's CPU seconds (/proc/<pid>/schedstat, where the server runs on this machine), which a
loaded machine disturbs much less. Where the set records no held-out text (or no set is named and
none is the default) it runs on a stand-in built without a model (stand_in below).

    python -m benchmarks.loop_speed URL [--set NAME] [--runs 5] [--library PATH ...]

prints one JSON line per run and kernel library, with the 1-minute load before and after.
--library compares builds of the native kernel in one database: each run points the extension's
functions (pg_proc.probin) at each library in turn and back at the installed one at the end; it
needs a superuser and is meant for a database of one's own (docs/benchmarks/2026-12-02-loop-speed.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import psycopg

from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, atom_set_exists, write_atom_set
from hartonomous.centroid import prefix_centroids

CONTEXT, NEW_TOKENS = 512, 256
INSTALLED = "$libdir/hartonomous_kernel"
CALL = "SELECT cardinality(generate_tokens(%s, %s, atom_set => %s, seed => 1))"

# The stand-in: 49,152 tokens at uniform random positions and a 40,000-token stream from a sparse
# random successor chain (each token continues with one of its 8 successors, Zipf-weighted, or jumps
# to a Zipf-drawn token one time in ten); 8 atoms per position (the next token and 7 more successors,
# weighted like soft top-8 targets), keyed like the demo build (window 3, decay 0.01, gaussian,
# bandwidth 0.006, history atoms weight 1 over 512 positions); the first 36,384 tokens become atoms,
# the context is a window of the rest.
STAND_IN = "bench-loop-demo-like"
VOCAB, SUCCESSORS, SOFT_K = 49_152, 8, 8
TRAIN_TOKENS, STREAM_TOKENS = 36_384, 40_000


def stream(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token positions, the token stream, each token's successors) of the stand-in."""
    rng = np.random.default_rng(seed)
    positions = rng.random((VOCAB, 3))
    zipf = 1.0 / np.arange(1, VOCAB + 1)
    zipf /= zipf.sum()
    successors = rng.choice(VOCAB, size=(VOCAB, SUCCESSORS), p=zipf)
    pick = 1.0 / np.arange(1, SUCCESSORS + 1)
    pick /= pick.sum()
    tokens = np.empty(STREAM_TOKENS, dtype=np.int64)
    tokens[0] = 0
    jumps = rng.random(STREAM_TOKENS) < 0.1
    jump_to = rng.choice(VOCAB, size=STREAM_TOKENS, p=zipf)
    which = rng.choice(SUCCESSORS, size=STREAM_TOKENS, p=pick)
    for t in range(1, STREAM_TOKENS):
        tokens[t] = jump_to[t] if jumps[t] else successors[tokens[t - 1], which[t]]
    return positions, tokens, successors


def stand_in(conn: psycopg.Connection) -> list[int]:
    """Build the stand-in set unless it exists; returns its 512-token context."""
    positions, tokens, successors = stream()
    context = [int(t) for t in tokens[TRAIN_TOKENS:TRAIN_TOKENS + CONTEXT]]
    if atom_set_exists(conn, STAND_IN):
        conn.commit()
        return context
    train = tokens[:TRAIN_TOKENS]
    keys = prefix_centroids(positions[train], 3, 0.01)[:-1]       # key of prefix t: its next token train[t + 1]
    soft = np.concatenate([train[1:, None], successors[train[:-1], 1:SOFT_K]], axis=1)
    weights = np.broadcast_to(np.linspace(1.0, 0.2, SOFT_K), soft.shape)
    spec = AtomSetSpec(name=STAND_IN, model="synthetic", vocab_size=VOCAB, embedding_dim=0, projection="synthetic",
                       kind="context", centroid_window=3, centroid_decay=0.01, bandwidth=0.006,
                       history_weight=1.0, history_window=512)
    atoms = AtomRows(soft.reshape(-1), np.repeat(keys, SOFT_K, axis=0), np.ascontiguousarray(weights).reshape(-1))
    write_atom_set(conn, spec, TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], positions), atoms,
                   replace=True)
    conn.commit()
    return context


def set_and_context(url: str, name: str | None) -> tuple[str, list[int]]:
    """The set measured (the named one, else the default one) and its 512-token context."""
    from benchmarks.kernel import real_contexts

    with psycopg.connect(url) as conn:
        if name is None:
            row = conn.execute("SELECT name FROM atom_sets WHERE is_default").fetchone()
            name = row[0] if row else None
        contexts = real_contexts(conn, name, 1, CONTEXT) if name else None
        if contexts:
            return name, contexts[0]
        return STAND_IN, stand_in(conn)


def point_at(url: str, library: str) -> None:
    """Point the kernel's functions at `library` (a path without .so, or the installed one)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE pg_proc p SET probin = %s FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid"
                     " WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND p.probin IS NOT NULL"
                     "   AND e.extname = 'hartonomous_kernel'", (library,))


def _cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:                 # the server runs elsewhere
        return None


def _timed(conn: psycopg.Connection, pid: int, name: str, context: list[int]) -> dict:
    cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
    (n,) = conn.execute(CALL, (context, NEW_TOKENS, name)).fetchone()
    wall, cpu1 = time.perf_counter() - t0, _cpu_seconds(pid)
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    return {"new_tokens": n, "wall_s": wall, "tokens_per_s": n / wall,
            "backend_cpu_s": cpu, "tokens_per_cpu_s": n / cpu if cpu else None}


def run(url: str, name: str, context: list[int], library: str) -> dict:
    """One fresh session: its first call, then a warm one."""
    load = os.getloadavg()[0]
    with psycopg.connect(url, autocommit=True) as conn:
        (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone()
        first = _timed(conn, pid, name, context)
        warm = _timed(conn, pid, name, context)
        (kernel,) = conn.execute("SELECT ht_kernel()").fetchone()
    return {"atom_set": name, "kernel": kernel, "library": library, "context": len(context),
            "first_call": first, "warm": warm, "load_1m": [load, os.getloadavg()[0]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--set", default=None, help="the atom set (default: the database's default set)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--library", action="append", default=None,
                        help="a kernel library to compare (path without .so; repeatable; needs a superuser)")
    args = parser.parse_args()
    name, context = set_and_context(args.url, args.set)
    libraries = args.library or [INSTALLED]
    try:
        for _ in range(args.runs):
            for library in libraries:           # interleaved, so that the machine's load falls on each alike
                if args.library:
                    point_at(args.url, library)
                print(json.dumps(run(args.url, name, context, library)), flush=True)
    finally:
        if args.library:
            point_at(args.url, INSTALLED)


if __name__ == "__main__":
    main()
