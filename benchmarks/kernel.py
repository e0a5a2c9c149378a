"""next_token's cost next to the bare KNN it cannot avoid (`hartonomous bench --kernel`, issue 23).

For each atom set (synthetic context sets of 10^5 and 10^6 uniform random atoms, --full adds 10^7,
and the default real set when it exists), each kernel (native: the hartonomous_kernel C extension;
plpgsql: the reference, SET hartonomous.kernel = 'plpgsql'), each context length (8, 64, 512 random
token ids; the real set's contexts are windows of its own corpus) and history atoms on and off:

- **next_token**: in the server, a PL/pgSQL loop reads clock_timestamp() around each call (the
  sampler's defaults, K = 100), as `hartonomous bench` does;
- **bare KNN-100**: in the same loop, the atoms partition's own index scan at the same centroid
  (`ORDER BY position <<->> c LIMIT 100`, the centroid computed beforehand, untimed): the part of
  next_token no implementation can skip; **overhead** = next_token p50 - KNN p50. The two take
  turns going first (even calls next_token, odd calls the KNN): whichever runs second at a centroid
  finds the pages it reads in the CPU's caches. Each order's own overhead is reported too
  (`overhead_next_first_p50_ms`, `overhead_knn_first_p50_ms`); runs before 2026-11-26 16:00 UTC
  always ran next_token first, the order that favours the KNN;
- **warm**: every call after one untimed pass over the same contexts (plans cached, pages in
  shared buffers); **cold**: the first call of a new session (no cached plan or catalog entry),
  median over fresh sessions; the pages stay in shared buffers (the OS cache is not dropped);
- **generate_tokens** from a 512-token prompt: new tokens per second, in one call, greedy;
- **pruning** (native kernel): the history atoms scored and skipped by exact pruning per call, and
  the KNN's ties across the k-th row, from the session's counters (htk_stats) over the timed pass. The
  contexts of a cell share no prefix, so every call computes its keys afresh: the per-session
  state of the context pays in generate_tokens, not here.
"""

from __future__ import annotations

import time

import numpy as np
import psycopg

from benchmarks import synthetic
from hartonomous.atomset import AtomRows, AtomSetSpec, BuildStats, SyntheticStats, TokenRows, write_atom_set
from hartonomous.atomset import atom_set_exists, load_atom_set
from hartonomous.atomset.write import INDEX_LAYOUT
from hartonomous.measure import describe_machine, load_average, percentile

SIZES = (10**5, 10**6)
FULL_SIZES = (10**5, 10**6, 10**7)
CONTEXT_LENGTHS = (8, 64, 512)
KERNELS = ("native", "plpgsql")
K = 100
HISTORY_WEIGHT, HISTORY_WINDOW = 1.0, 512
COLD_SESSIONS = 5
GENERATE_TOKENS = 128
REAL_SET = "smollm2-context"

TIMER = """
CREATE OR REPLACE FUNCTION pg_temp.bench_kernel(p_atom_set text, p_contexts integer[], p_length integer,
                                                p_k integer, p_history double precision)
RETURNS TABLE(next_token_ms double precision, knn_ms double precision, next_first boolean)
LANGUAGE plpgsql AS $$
DECLARE
    t0  timestamptz;
    ctx integer[];
    sid integer := (SELECT s.id FROM atom_sets s WHERE s.name = p_atom_set);
    c   geometry;
BEGIN
    FOR i IN 0 .. cardinality(p_contexts) / p_length - 1 LOOP
        ctx := p_contexts[i * p_length + 1 : (i + 1) * p_length];
        c := context_centroid(ctx, p_atom_set);
        next_first := i % 2 = 0;
        FOR turn IN 1 .. 2 LOOP
            IF (turn = 1) = next_first THEN
                t0 := clock_timestamp();
                PERFORM count(*) FROM next_token(ctx, max_neighbors => p_k, atom_set => p_atom_set,
                                                 history_weight => p_history);
                next_token_ms := extract(epoch FROM clock_timestamp() - t0) * 1000;
            ELSE
                t0 := clock_timestamp();
                PERFORM count(*) FROM (SELECT a.token_id FROM atoms a WHERE a.atom_set_id = sid
                                        ORDER BY a.position <<->> c LIMIT p_k) q;
                knn_ms := extract(epoch FROM clock_timestamp() - t0) * 1000;
            END IF;
        END LOOP;
        RETURN NEXT;
    END LOOP;
END
$$
"""


def set_name(n_atoms: int) -> str:
    return f"bench-kernel-{n_atoms}"


def ensure_set(conn: psycopg.Connection, n_atoms: int, seed: int = 0, rebuild: bool = False) -> str:
    """A context set of `n_atoms` uniform random atoms keyed like the default build (window 3,
    decay 0.01), history atoms weight 1 over 512 positions; built unless it exists."""
    name = set_name(n_atoms)
    exists, stored = synthetic.stored_layout(conn, name)
    if rebuild or not exists or stored != INDEX_LAYOUT:
        rng = np.random.default_rng(seed)
        vocab = synthetic.SYNTHETIC_VOCAB
        spec = AtomSetSpec(name=name, model="synthetic", vocab_size=vocab, embedding_dim=0, projection="synthetic",
                           kind="context", centroid_window=3, centroid_decay=0.01, history_weight=HISTORY_WEIGHT,
                           history_window=HISTORY_WINDOW,
                           stats=BuildStats(synthetic=SyntheticStats(distribution="uniform unit cube", seed=seed,
                                                                     layout=INDEX_LAYOUT)))
        tokens = TokenRows(np.arange(vocab), [f"tok{i}" for i in range(vocab)], rng.random((vocab, 3)))
        atoms = AtomRows(rng.integers(0, vocab, n_atoms), rng.random((n_atoms, 3)))
        write_atom_set(conn, spec, tokens, atoms, replace=True)
        conn.commit()
    return name


def real_contexts(conn: psycopg.Connection, name: str, n: int, length: int, seed: int = 3) -> list[list[int]] | None:
    """Windows of the real set's held-out text (its own tokenizer), or None when it records none."""
    from hartonomous.atomset import tokenizer_for
    from hartonomous.compare.atomset import holdout_text
    from hartonomous.errors import UserError

    found = load_atom_set(conn, name)
    conn.commit()
    try:
        ids = tokenizer_for(found).encode(holdout_text(found, "all").text)
    except UserError:                   # a set without a recorded holdout: measured on synthetic only
        return None
    if len(ids) < length + 1:
        return None
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(ids) - length, n)
    return [list(map(int, ids[s:s + length])) for s in starts]


def _session(url: str, kernel: str) -> psycopg.Connection:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET jit = off")
    if kernel == "plpgsql":
        conn.execute("SET hartonomous.kernel = 'plpgsql'")
    (active,) = conn.execute("SELECT ht_kernel()").fetchone()
    if active != kernel:
        conn.close()
        raise RuntimeError(f"kernel {kernel} is not available on this server (ht_kernel() = {active})")
    conn.execute(TIMER)
    return conn


def _timed(conn: psycopg.Connection, name: str, contexts: list[list[int]], history: float) -> list[tuple]:
    """(next_token ms, KNN ms, whether next_token ran first) per context."""
    flat = [t for c in contexts for t in c]
    return conn.execute("SELECT * FROM pg_temp.bench_kernel(%s, %s, %s, %s, %s)",
                        (name, flat, len(contexts[0]), K, history)).fetchall()


def _overhead(rows: list[tuple]) -> float | None:
    return percentile([r[0] for r in rows], 50) - percentile([r[1] for r in rows], 50) if rows else None


def measure(url: str, name: str, kernel: str, contexts: list[list[int]], history: float) -> dict:
    """Warm p50/p95 of next_token and the bare KNN, and the cold first call."""
    cold = []
    for i in range(COLD_SESSIONS):
        with _session(url, kernel) as conn:
            cold.append(_timed(conn, name, contexts[i:i + 1], history)[0][0])
    with _session(url, kernel) as conn:
        _timed(conn, name, contexts, history)                       # warm: plans and pages
        before = _native_stats(conn, kernel)
        rows = _timed(conn, name, contexts, history)
        after = _native_stats(conn, kernel)
    nt, knn = [r[0] for r in rows], [r[1] for r in rows]
    p50, knn50 = percentile(nt, 50), percentile(knn, 50)
    cell = {"next_token_p50_ms": p50, "next_token_p95_ms": percentile(nt, 95), "knn_p50_ms": knn50,
            "knn_p95_ms": percentile(knn, 95), "overhead_p50_ms": p50 - knn50,
            "overhead_next_first_p50_ms": _overhead([r for r in rows if r[2]]),
            "overhead_knn_first_p50_ms": _overhead([r for r in rows if not r[2]]),
            "cold_first_call_ms": percentile(cold, 50)}
    if before is not None:
        calls = after["steps"] - before["steps"] or 1
        cell.update({f"{k}_per_call": (after[k] - before[k]) / calls
                     for k in ("history_scored", "history_skipped", "knn_boundary_ties")})
    return cell


def _native_stats(conn: psycopg.Connection, kernel: str) -> dict | None:
    """The session's native counters (htk_stats: steps, history atoms scored and skipped by the
    exact pruning, KNN boundary ties), or None on the PL/pgSQL kernel."""
    if kernel != "native":
        return None
    row = conn.execute("SELECT steps, history_scored, history_skipped, knn_boundary_ties FROM htk_stats()").fetchone()
    return dict(zip(("steps", "history_scored", "history_skipped", "knn_boundary_ties"), row))


def generation(url: str, name: str, kernel: str, prompt: list[int]) -> dict:
    """generate_tokens from `prompt`, greedy, GENERATE_TOKENS new tokens, in one call (best of 3)."""
    with _session(url, kernel) as conn:
        conn.execute("SELECT generate_tokens(%s, 8, temperature => 0, atom_set => %s)", (prompt, name))
        best = None
        for _ in range(3):
            t0 = time.perf_counter()
            (ids,) = conn.execute("SELECT generate_tokens(%s, %s, temperature => 0, atom_set => %s)",
                                  (prompt, GENERATE_TOKENS, name)).fetchone()
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
    return {"new_tokens": len(ids), "seconds": best, "tokens_per_s": len(ids) / best if best else None}


def run(url: str, sizes: tuple[int, ...] = SIZES, calls: int = 100, rebuild: bool = False,
        real_sets: tuple[str, ...] = (REAL_SET,)) -> dict:
    """Build what is missing, then measure every (set, kernel, context length, history) cell; the
    real sets are measured when they exist."""
    results: dict = {"mode": "kernel", "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "sizes": list(sizes),
                     "method": {"max_neighbors": K, "calls": calls, "cold_sessions": COLD_SESSIONS,
                                "history_weight_on": HISTORY_WEIGHT, "history_window": HISTORY_WINDOW,
                                "generate_tokens": GENERATE_TOKENS, "notes": __doc__.strip()},
                     "load_1m": {"start": load_average()}, "rows": [], "generation": []}
    with psycopg.connect(url) as conn:
        results["machine"] = describe_machine(conn)
        conn.commit()
        work = [(ensure_set(conn, n, rebuild=rebuild), n, None) for n in sizes]
        for real in real_sets:
            if atom_set_exists(conn, real):
                conn.commit()
                found = load_atom_set(conn, real)
                conn.commit()
                work.append((real, found.atoms, "real"))
        conn.commit()
    for name, n, kind in work:
        with psycopg.connect(url) as conn:
            by_length = {length: (real_contexts(conn, name, calls, length) if kind else
                                  synthetic.random_contexts(calls, synthetic.SYNTHETIC_VOCAB, length=length, seed=3))
                         for length in CONTEXT_LENGTHS}
        if any(c is None for c in by_length.values()):
            continue
        for kernel in KERNELS:
            for length, contexts in by_length.items():
                for history in (HISTORY_WEIGHT, 0.0):
                    cell = measure(url, name, kernel, contexts, history)
                    results["rows"].append({"atom_set": name, "atoms": n, "kernel": kernel, "context_length": length,
                                            "history": history > 0, **cell})
            results["generation"].append({"atom_set": name, "atoms": n, "kernel": kernel, "prompt_tokens": 512,
                                          **generation(url, name, kernel, by_length[512][0])})
    results["load_1m"]["end"] = load_average()
    results["summary"] = summary(results)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return results


def _cell(results: dict, name: str, kernel: str, length: int, history: bool) -> dict:
    return next(r for r in results["rows"] if (r["atom_set"], r["kernel"], r["context_length"], r["history"])
                == (name, kernel, length, history))


def summary(results: dict) -> dict[str, dict[str, dict]]:
    """summary[kernel][atom set]: the issue's targets side by side: the overhead over the bare KNN
    (8 tokens; 512 tokens with history atoms), the 512/8 cost ratio, generate_tokens tokens/s."""
    out: dict[str, dict[str, dict]] = {}
    for g in results["generation"]:
        name, kernel = g["atom_set"], g["kernel"]
        short, long = _cell(results, name, kernel, 8, True), _cell(results, name, kernel, 512, True)
        out.setdefault(kernel, {})[name] = {
            "atoms": g["atoms"], "p50_ms_8": short["next_token_p50_ms"],
            "p50_ms_512_history": long["next_token_p50_ms"], "knn_p50_ms_512": long["knn_p50_ms"],
            "overhead_ms_8": short["overhead_p50_ms"], "overhead_ms_512_history": long["overhead_p50_ms"],
            "ratio_512_over_8": long["next_token_p50_ms"] / short["next_token_p50_ms"],
            "generate_tokens_per_s": g["tokens_per_s"]}
    return out


def markdown(results: dict, command: str) -> str:
    m, load = results["machine"], results["load_1m"]
    lines = [f"Command: `{command}`  ",
             f"Machine: {m.get('cpu', '?')}, {m.get('cores')} cores; PostgreSQL {m.get('postgresql')}, PostGIS "
             f"{m.get('postgis')}; load average (1 min) start {load.get('start')}, end {load.get('end')}  ",
             f"K = {K}; {results['method']['calls']} calls per cell, warm (after one untimed pass); cold = the first "
             f"call of a new session, median of {COLD_SESSIONS}", "",
             "| atom set | kernel | context | history | next_token p50 (ms) | p95 | bare KNN-100 p50 | overhead p50 "
             "| next_token first | KNN first | cold first call |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results["rows"]:
        lines.append(f"| {r['atom_set']} | {r['kernel']} | {r['context_length']} | {'on' if r['history'] else 'off'} | "
                     f"{r['next_token_p50_ms']:.3f} | {r['next_token_p95_ms']:.3f} | {r['knn_p50_ms']:.3f} | "
                     f"{r['overhead_p50_ms']:.3f} | {r['overhead_next_first_p50_ms']:.3f} | "
                     f"{r['overhead_knn_first_p50_ms']:.3f} | {r['cold_first_call_ms']:.2f} |")
    pruned = [r for r in results["rows"] if "history_skipped_per_call" in r and r["history"] and r["context_length"] > 8]
    if pruned:
        lines += ["", "| atom set | context | history atoms scored per call | skipped by exact pruning | "
                  "KNN boundary ties per call |", "|---|---:|---:|---:|---:|"]
        for r in pruned:
            lines.append(f"| {r['atom_set']} | {r['context_length']} | {r['history_scored_per_call']:.1f} | "
                         f"{r['history_skipped_per_call']:.1f} | {r['knn_boundary_ties_per_call']:.2f} |")
    lines += ["", "| atom set | kernel | overhead, 8 tokens (ms) | overhead, 512 + history (ms) | 512 / 8 cost |",
              "|---|---|---:|---:|---:|"]
    for kernel, sets in results.get("summary", {}).items():
        for name, s in sets.items():
            lines.append(f"| {name} | {kernel} | {s['overhead_ms_8']:.3f} | {s['overhead_ms_512_history']:.3f} "
                         f"| {s['ratio_512_over_8']:.2f}× |")
    lines += ["", "| atom set | kernel | generate_tokens from a 512-token prompt (tokens/s) |", "|---|---|---:|"]
    for g in results["generation"]:
        lines.append(f"| {g['atom_set']} | {g['kernel']} | {g['tokens_per_s']:.0f} ({g['new_tokens']} tokens in "
                     f"{g['seconds'] * 1000:.0f} ms) |")
    return "\n".join(lines) + "\n"
