"""`hartonomous bench` and `hartonomous cluster bench`: the benchmark suite's commands.

Registered by the composition root (hartonomous/cli.py); nothing else in the runtime imports `benchmarks`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from hartonomous.errors import UserError

HELP = (
    "Measure next_token latency and scaling, ingest, concurrency and generation throughput.\n\n"
    "--quick (the default) uses synthetic atom sets of 10^4, 10^5 and 10^6 uniform random atoms; --full adds "
    "10^7 (built once: a few minutes and ~2.6 GB of disk). Missing sets are built, and rebuilt when the "
    "ingest's index layout changed; the smollm2-token and smollm2-context sets are measured too when they "
    "exist.\n\n"
    "Per atom set: in-database p50/p95 (a PL/pgSQL loop timing each call with clock_timestamp()), backend CPU "
    "per call, shared buffers per call (EXPLAIN ANALYZE BUFFERS), the client round trip of a prepared "
    "statement, and brute force (index scans off) as a speed-up ratio. Then 1, 2, 4 and 8 concurrent "
    "clients, and generation tokens/s (spatial client loop, generate_tokens in the database, exact on CPU, "
    "and on CUDA if present).\n\n"
    "Writes <out>/bench-<quick|full>.json and .md and prints the tables; docs/benchmarks.md records a run "
    "with its machine. Benchmarks are not tests: run them on a quiet machine (the load average is recorded "
    "with the results).\n\n"
    "--speculative instead measures speculative decoding against its peers on SmolLM2 (transformers generate, "
    "transformers prompt-lookup decoding, llama.cpp's own decoding of the same GGUF (`make install-llama`), our "
    "exact and speculative paths on each exact runtime (torch, int4, llama: --runtimes); short prompts, documents "
    "from the atom set's held-out test half and repeated requests; writes <out>/bench-speculative[-quick].json "
    "and .md). With --quick: "
    "3 short prompts and 2 documents (a few minutes); without: 8 and 6.\n\n"
    "--augmented instead measures the augmented path against the exact path on the same runtime in one run: the "
    "median ms per generated token of each (greedy, memory off, 3 short prompts), the difference and whether it is "
    "within the target (augmented <= exact + 1 ms); --runtimes picks the runtimes (torch, int4, llama; default: "
    "the configured one), --atom-set the set (built with corpus labels, with a gate); writes "
    "<out>/bench-augmented.json and .md.\n\n"
    "--layouts instead compares the atom sets' storage layouts (rows, tiles; issue 18) on synthetic sets "
    "built in both: next_token p50/p95 and shared buffers per call with K = 100 on 512- and 8-token contexts "
    "with history atoms, at 10^5 and 10^6 atoms (--full: also 10^7; --sizes to choose).\n\n"
    "--kernel instead measures next_token on the native kernel (the hartonomous_kernel C extension) and on "
    "its PL/pgSQL reference next to the bare KNN-100 at the same centroids: 8-, 64- and 512-token contexts, "
    "history atoms on and off, warm and cold sessions, and generate_tokens from a 512-token prompt, at 10^5 "
    "and 10^6 synthetic atoms (--full: also 10^7) and on smollm2-context when it exists."
)


def _sizes(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        sizes = tuple(int(float(v)) for v in value.split(",") if v.strip())
    except ValueError:
        raise UserError(f"--sizes must be comma-separated atom counts such as 10000,1e6; got '{value}'")
    if not sizes or min(sizes) < 100 or max(sizes) > 10**8:
        raise UserError(f"--sizes must be atom counts between 100 and 1e8; got '{value}'")
    return sizes


def register(app: typer.Typer, cluster_app: typer.Typer) -> None:
    """`bench` on the app, `bench` on its `cluster` group."""
    cluster_app.command("bench")(cluster_bench)

    @app.command("bench", help=HELP)
    def bench_cmd(
        quick: bool = typer.Option(False, "--quick", help="10^4, 10^5 and 10^6 atoms (minutes). The default."),
        full: bool = typer.Option(False, "--full", help="Also 10^7 atoms (builds a ~2.6 GB set once)."),
        out: Path = typer.Option(Path("reports/bench"), "--out", help="Folder for bench-<mode>.json and .md."),
        calls: int = typer.Option(300, "--calls", help="next_token calls per atom set (>= 20)."),
        brute_calls: int = typer.Option(10, "--brute-calls",
                                        help="Brute-force calls per synthetic set, >= 1 (3 on real sets)."),
        seconds: float = typer.Option(5.0, "--concurrency-seconds",
                                      help="Seconds per concurrency level (1, 2, 4, 8 clients), >= 1."),
        generation: bool = typer.Option(True, "--generation/--no-generation",
                                        help="Measure generation tokens/s (loads SmolLM2; spatial rows need "
                                             "the smollm2-context atom set)."),
        rebuild: bool = typer.Option(False, "--rebuild", help="Rebuild the synthetic atom sets (ingest timings)."),
        sizes: str = typer.Option(None, "--sizes", metavar="N,N,...",
                                  help="Atom counts instead of the mode's, e.g. 1e4,1e6."),
        speculative: bool = typer.Option(False, "--speculative",
                                         help="Benchmark speculative decoding against its peers instead."),
        targets: bool = typer.Option(False, "--targets", help="Speculative: the int4 runtime's targets table beside "
                                     "llama.cpp (its own process) in one run instead: decode and first token apart, "
                                     "prefix cache, prompt lookup, memory, augmented cost, start-up, a busy "
                                     "neighbour; writes <out>/<date>-targets.json and .md (benchmarks/"
                                     "speculative_targets.py)."),
        prompts: int = typer.Option(2, "--prompts", help="Targets: prompts per row (1..8)."),
        atom_set: str = typer.Option(None, "--atom-set", help="Speculative: the drafting atom set (default set)."),
        threads: int = typer.Option(None, "--threads", help="Speculative: torch threads (default: min(cores, 4))."),
        draft_tokens: int = typer.Option(4, "--draft-tokens", help="Speculative: first draft length (1..64)."),
        max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Speculative: new tokens per prompt."),
        runtimes: str = typer.Option(None, "--runtimes", metavar="R,R",
                                     help="Speculative: fast exact runtimes measured beside the torch reference "
                                          "(int4, llama; default: int4, and llama where installed). llama.cpp's "
                                          "own decoding of the same file is always a row."),
        kernel: bool = typer.Option(False, "--kernel", help="next_token on the native and PL/pgSQL kernels next to the "
                                    "bare KNN-100 instead: 8-, 64- and 512-token contexts, history on and off, warm and "
                                    "cold, generate_tokens from a 512-token prompt; 10^5 and 10^6 atoms (--full adds "
                                    "10^7) and smollm2-context when it exists; writes <out>/bench-kernel.json and .md."),
        augmented: bool = typer.Option(False, "--augmented",
                                       help="The augmented path vs the exact path, ms per generated token on "
                                            "the same runtime, and the difference (target: <= +1 ms); writes "
                                            "<out>/bench-augmented.json and .md."),
        completion: bool = typer.Option(False, "--completion", help="Line completion on held-out files of real "
                                        "repositories instead (--repo, repeatable): exact, exact + retrieval, "
                                        "augmented, augmented + retrieval, counting ⊕ exact and spatial, EM and ES "
                                        "with intervals; builds each repository's store; writes "
                                        "<out>/bench-completion.json, .md and completion-em.png (docs/completion.md)."),
        repo: list[Path] = typer.Option(None, "--repo", help="Completion: a repository of Python files "
                                        "(repeatable)."),
        lines_per_file: int = typer.Option(5, "--lines-per-file", help="Completion: lines per held-out file."),
        held_out_files: int = typer.Option(4, "--held-out-files", help="Completion: files held out per repository."),
        in_file_tokens: int = typer.Option(1024, "--in-file-tokens", help="Completion: tokens of the file before "
                                           "the line."),
        retrieval_tokens: int = typer.Option(512, "--retrieval-tokens", help="Completion: tokens of retrieved "
                                             "chunks (the + retrieval systems)."),
        seed: int = typer.Option(0, "--seed", help="Completion: the seed of the held-out files and lines."),
        layouts: bool = typer.Option(False, "--layouts", help="Compare the storage layouts (rows, tiles) instead: "
                                     "10^5 and 10^6 atoms (--full adds 10^7), 512- and 8-token contexts with "
                                     "history atoms; writes <out>/bench-layouts.json and .md."),
    ) -> None:
        from benchmarks import run
        from hartonomous.db.connection import owner_url

        if quick and full:
            raise UserError("--quick and --full exclude each other; pick one (--quick is the default)")
        if completion:
            return _completion(out, repo or [], lines_per_file, held_out_files, in_file_tokens, retrieval_tokens,
                               seed, rebuild)
        if augmented:
            return _augmented(out, atom_set, threads, max_new_tokens, runtimes)
        if speculative and targets:
            return _targets(out, atom_set, prompts, max_new_tokens)
        if speculative:
            return _speculative(quick, full, out, atom_set, threads, draft_tokens, max_new_tokens, runtimes)
        if calls < 20:
            raise UserError(f"--calls must be at least 20 (percentiles need them), got {calls}")
        if layouts:
            return _layouts(full, out, calls, rebuild, _sizes(sizes))
        if kernel:
            return _kernel(full, out, calls, rebuild, _sizes(sizes))
        if brute_calls < 1:
            raise UserError(f"--brute-calls must be at least 1, got {brute_calls}")
        if not seconds >= 1:
            raise UserError(f"--concurrency-seconds must be at least 1, got {seconds}")
        chosen = _sizes(sizes)
        url = owner_url()
        run.check_ready(url)
        run.check_disk(url, chosen or (run.FULL_SIZES if full else run.QUICK_SIZES))
        command = "hartonomous bench " + (" ".join(sys.argv[2:]) if len(sys.argv) > 2 else "--quick")
        results = run.run(url, full=full, calls=calls, brute_calls=brute_calls, concurrency_seconds=seconds,
                          generation=generation, rebuild=rebuild, sizes=chosen)
        json_path, md_path = run.write(results, out, command)
        Console().print(run.markdown(results, command))
        Console().print(f"wrote {json_path} and {md_path}")


def _augmented(out: Path, atom_set: str | None, threads: int | None, max_new_tokens: int,
               runtimes: str | None) -> None:
    """`hartonomous bench --augmented`: see benchmarks.augmented."""
    from benchmarks import augmented, run
    from hartonomous.db.connection import owner_url

    if threads is not None and threads < 1:
        raise UserError(f"--threads must be at least 1, got {threads}")
    if not 1 <= max_new_tokens <= 1024:
        raise UserError(f"--max-new-tokens must be between 1 and 1024, got {max_new_tokens}")
    chosen: tuple[str | None, ...] = (None,)
    if runtimes is not None:
        chosen = tuple(r.strip() for r in runtimes.split(",") if r.strip())
        bad = [r for r in chosen if r not in ("torch", "int4", "llama")]
        if bad or not chosen:
            raise UserError(f"--runtimes takes torch, int4 and llama with --augmented, got '{runtimes}'")
    url = owner_url()
    run.check_ready(url)
    command = "hartonomous bench " + " ".join(sys.argv[2:])
    results = augmented.run(url, atom_set=atom_set, runtimes=chosen, max_new_tokens=max_new_tokens, threads=threads)
    _write_report(out, results, augmented.markdown(results, command), command)


def _completion(out: Path, repos: list[Path], lines_per_file: int, held_out_files: int, in_file_tokens: int,
                retrieval_tokens: int, seed: int, rebuild: bool) -> None:
    """`hartonomous bench --completion --repo DIR ...`: see benchmarks.completion."""
    import psycopg

    from benchmarks import completion, run
    from benchmarks.line_completion.prompts import Budgets
    from benchmarks.line_completion.stores import python_files
    from hartonomous.db.connection import owner_url

    if not repos:
        raise UserError("--completion needs at least one --repo DIR (a repository of Python files)")
    if lines_per_file < 1:
        raise UserError(f"--lines-per-file must be at least 1, got {lines_per_file}")
    if held_out_files < 1:
        raise UserError(f"--held-out-files must be at least 1, got {held_out_files}")
    for root in repos:
        python_files(root)                                  # a directory without Python files: refused now
    budgets = Budgets(in_file_tokens, retrieval_tokens)
    url = owner_url()
    run.check_ready(url)
    command = "hartonomous bench " + " ".join(sys.argv[2:])
    with psycopg.connect(url, autocommit=True) as conn:
        results = completion.run(conn, repos, budgets=budgets, held_out_files=held_out_files,
                                 lines_per_file=lines_per_file, seed=seed, rebuild=rebuild)
    _write_report(out, results, completion.markdown(results, command), command)
    Console().print(f"wrote {completion.plot(results, out / 'completion-em.png')}")


def _layouts(full: bool, out: Path, calls: int, rebuild: bool, sizes: tuple[int, ...] | None) -> None:
    """`hartonomous bench --layouts`: see benchmarks.layouts."""
    from benchmarks import layouts, run
    from hartonomous.db.connection import owner_url

    url = owner_url()
    run.check_ready(url)
    chosen = sizes or (layouts.FULL_SIZES if full else layouts.SIZES)
    run.check_disk(url, tuple(2 * n for n in chosen))
    command = "hartonomous bench " + " ".join(sys.argv[2:])
    results = layouts.run(url, chosen, calls=calls, rebuild=rebuild)
    _write_report(out, results, layouts.markdown(results, command), command)


def _kernel(full: bool, out: Path, calls: int, rebuild: bool, sizes: tuple[int, ...] | None) -> None:
    """`hartonomous bench --kernel`: see benchmarks.kernel."""
    from benchmarks import kernel, run
    from hartonomous.db.connection import owner_url

    url = owner_url()
    run.check_ready(url)
    chosen = sizes or (kernel.FULL_SIZES if full else kernel.SIZES)
    run.check_disk(url, chosen)
    command = "hartonomous bench " + " ".join(sys.argv[2:])
    results = kernel.run(url, chosen, calls=calls, rebuild=rebuild)
    _write_report(out, results, kernel.markdown(results, command), command)


def _write_report(out: Path, results: dict, text: str, command: str) -> None:
    """<out>/bench-<mode>.json and .md, and the table on the console."""
    import json

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write to --out {out}: {exc.strerror}") from exc
    json_path, md_path = out / f"bench-{results['mode']}.json", out / f"bench-{results['mode']}.md"
    json_path.write_text(json.dumps({**results, "command": command}, indent=2, default=str))
    md_path.write_text(text)
    Console().print(text)
    Console().print(f"wrote {json_path} and {md_path}")


def _targets(out: Path, atom_set: str | None, prompts: int, max_new_tokens: int) -> None:
    """`hartonomous bench --speculative --targets`: see benchmarks.speculative_targets."""
    from benchmarks import run, speculative_targets
    from hartonomous.db.connection import owner_url

    if not 1 <= prompts <= 8:
        raise UserError(f"--prompts must be between 1 and 8, got {prompts}")
    if not 2 <= max_new_tokens <= 1024:
        raise UserError(f"--max-new-tokens must be between 2 and 1024, got {max_new_tokens}")
    url = owner_url()
    run.check_ready(url)
    command = "hartonomous bench " + " ".join(sys.argv[2:])
    results = speculative_targets.run(url, atom_set=atom_set or "code", prompts=prompts, new_tokens=max_new_tokens)
    json_path, md_path = speculative_targets.write(results, out, command)
    Console().print(speculative_targets.markdown(results, command))
    Console().print(f"wrote {json_path} and {md_path}")


def _speculative(quick: bool, full: bool, out: Path, atom_set: str | None, threads: int | None, draft_tokens: int,
                 max_new_tokens: int, runtimes: str | None = None) -> None:
    """`hartonomous bench --speculative [--quick]`: see benchmarks.speculative."""
    from benchmarks import run, speculative
    from hartonomous.db.connection import owner_url

    if full:
        raise UserError("--full is for the next_token suite; --speculative without --quick is its full size")
    if threads is not None and threads < 1:
        raise UserError(f"--threads must be at least 1, got {threads}")
    if not 1 <= draft_tokens <= 64:
        raise UserError(f"--draft-tokens must be between 1 and 64, got {draft_tokens}")
    if not 1 <= max_new_tokens <= 1024:
        raise UserError(f"--max-new-tokens must be between 1 and 1024, got {max_new_tokens}")
    chosen = None
    if runtimes is not None:
        chosen = tuple(r.strip() for r in runtimes.split(",") if r.strip())
        bad = [r for r in chosen if r not in ("int4", "llama")]
        if bad:
            raise UserError(f"--runtimes takes int4 and llama (torch always runs), got '{bad[0]}'")
    url = owner_url()
    run.check_ready(url)
    command = "hartonomous bench " + " ".join(sys.argv[2:])
    results = speculative.run(url, quick=quick, atom_set=atom_set, max_new_tokens=max_new_tokens, threads=threads,
                              draft_tokens=draft_tokens, runtimes=chosen)
    _write_report(out, results, speculative.markdown(results, command), command)


def cluster_bench(
    sizes: str = typer.Option("1e5,1e6", help="Comma-separated atom counts (synthetic mode)."),
    calls: int = typer.Option(200, help="next_token calls per size (or context length) and side."),
    out: str = typer.Option(None, help="Where the JSON goes (default .hartonomous/bench/scale-out.json, with "
                                       "--atom-set .hartonomous/bench/scale-out-routed.json)."),
    atom_set: str = typer.Option(None, "--atom-set", help="Instead of synthetic sets: this lattice set of the "
                                 "single-node db, copied to the cluster (routed there), on held-out code contexts."),
    seconds: float = typer.Option(10.0, "--seconds", help="With --atom-set: seconds per concurrency level (4, 16)."),
) -> None:
    """next_token on the single-node `db` vs this cluster, same synthetic sets, or with --atom-set the same
    real lattice set: round trips, generation, concurrency, the routed fraction and the skew (docs/scale-out.md)."""
    from benchmarks import routing, scaleout
    from hartonomous.db import migrate
    from hartonomous.db.cluster_cli import local_cluster
    from hartonomous.db.connection import embedded_cluster

    try:
        counts = tuple(int(float(v)) for v in sizes.split(",") if v.strip())
    except ValueError:
        raise UserError(f"--sizes must be comma-separated atom counts such as 1e5,1e6; got '{sizes}'") from None
    if calls < routing.MIN_CALLS:
        raise UserError(f"--calls must be at least {routing.MIN_CALLS}, got {calls}")
    if not seconds >= 1:
        raise UserError(f"--seconds must be at least 1, got {seconds}")
    cluster = local_cluster()
    if not cluster.is_running():
        raise UserError("the local Citus cluster is not running; start it with `hartonomous cluster up`")
    single = embedded_cluster()
    single.up()
    for url in (single.url(), cluster.url()):
        migrate.upgrade(url)
    if atom_set is not None:
        path = Path(out or ".hartonomous/bench/scale-out-routed.json")
        command = "hartonomous cluster bench " + " ".join(sys.argv[3:])
        nodes = {"single": {"node": single.data_dir},
                 "cluster": {"coordinator": cluster.coordinator.data_dir,
                             **{f"worker-{i}": w.data_dir for i, w in enumerate(cluster.workers(), start=1)}}}
        results = routing.run(single.url(), cluster.url(), atom_set, calls, seconds, path, command=command,
                              nodes=nodes)
        print(results["markdown"])
        print(f"wrote {path}")
        return
    results = scaleout.run(single.url(), cluster.url(), counts, calls, Path(out or ".hartonomous/bench/scale-out.json"))
    print(scaleout.markdown(results))
