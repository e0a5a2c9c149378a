"""`hartonomous bench`: the benchmark suite's command."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console


def register(app: typer.Typer) -> None:
    @app.command("bench")
    def bench_cmd(
        full: bool = typer.Option(False, "--full", help="Include 10^7 atoms (builds a ~1 GB set once; longer)."),
        quick: bool = typer.Option(True, "--quick", help="10^4–10^6 atoms (minutes). The default."),
        out: Path = typer.Option(Path("reports/bench"), "--out", help="Folder for bench-<mode>.json/.md."),
        calls: int = typer.Option(300, "--calls", min=20, help="next_token calls per atom set."),
        brute_calls: int = typer.Option(10, "--brute-calls", min=1, help="Brute-force calls per atom set."),
        seconds: float = typer.Option(5.0, "--concurrency-seconds", min=1.0, help="Seconds per concurrency level."),
        generation: bool = typer.Option(True, "--generation/--no-generation",
                                        help="Also measure generation throughput (loads SmolLM2)."),
        rebuild: bool = typer.Option(False, "--rebuild", help="Rebuild the synthetic atom sets."),
    ) -> None:
        """Measure next_token latency and scaling, ingest, generation throughput and concurrency.

        Writes JSON and a Markdown table; docs/benchmarks.md records a run with its machine.
        """
        from hartonomous.benchmark import run
        from hartonomous.db.connection import owner_url

        url = owner_url()
        run.check_ready(url)
        command = "hartonomous bench " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "hartonomous bench --quick"
        results = run.run(url, full=full, calls=calls, brute_calls=brute_calls, concurrency_seconds=seconds,
                          generation=generation, rebuild=rebuild)
        json_path, md_path = run.write(results, out, command)
        Console().print(run.markdown(results, command))
        Console().print(f"wrote {json_path} and {md_path}")
