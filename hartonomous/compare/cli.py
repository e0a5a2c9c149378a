"""`hartonomous compare`: the side-by-side report, with a progress bar and the headline table."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from hartonomous.compare import DEFAULT_MAX_POSITIONS

console = Console(stderr=True)


class RichProgress:
    """progress.Progress on a rich progress bar: one task per stage."""

    def __init__(self, bar: Progress):
        self.bar, self.task = bar, None

    def stage(self, description: str, total: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, completed=self.bar.tasks[self.task].total)
        self.task = self.bar.add_task(description, total=max(total, 1))

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.bar.advance(self.task, n)


def headline_table(report: dict) -> Table:
    from hartonomous.compare.render import headline_cells, headline_headers

    split = report["settings"].get("split")
    scored = f"{split} split" if split else "user text"
    table = Table(title=f"{report['atom_set']['name']}: spatial vs exact "
                        f"({report['fidelity']['positions']} positions, {scored})")
    for column in headline_headers(report):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for r in report["headline"]:
        table.add_row(*headline_cells(report, r))
    return table


def compare(
    atom_set: str = typer.Option(..., "--atom-set", help="Atom set to compare (see `hartonomous atom-sets`)."),
    text: list[Path] = typer.Option([], "--text", help="Evaluation text file (repeatable). Default: the "
                                    "test half of the atom set's held-out slice."),
    split: str = typer.Option(None, "--split", help="Which half of the held-out slice to score: test (default; "
                              "nothing is tuned on it) | calibration | all. Does not apply to --text."),
    prompts: Path = typer.Option(None, "--prompts", help="Prompts for free generation, one per line."),
    max_positions: int = typer.Option(DEFAULT_MAX_POSITIONS, "--max-positions",
                                      help="Teacher-forced positions in all (fewer where the text has fewer)."),
    max_neighbors: int = typer.Option(100, "--max-neighbors", help="K of next_token (and of the KNN baseline)."),
    max_new_tokens: int = typer.Option(32, "--max-new-tokens", help="Tokens per free generation."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampled generations."),
    distill_tokens: int = typer.Option(None, "--distill-tokens",
                                       help="Training tokens the counting baselines (n-grams, ∞-gram) learn "
                                            "from (default: as many as the build used; 0 = skip them)."),
    no_generation: bool = typer.Option(False, "--no-generation", help="Skip free generation."),
    device: str = typer.Option(None, "--device", help="Exact path device: auto | cpu | cuda "
                               "(default HARTONOMOUS_DEVICE, else auto)."),
    history_weight: float = typer.Option(None, "--history-weight",
                                         help="Weight of the history atoms in the spatial path, its control and the "
                                              "--against set (default: each set's calibrated weight; 0: none)."),
    against: str = typer.Option(None, "--against", help="A second atom set of the same model, scored on the same "
                                "positions and compared by paired tests (its own calibrated history weight "
                                "unless --history-weight is given)."),
    memory: bool = typer.Option(False, "--memory", help="The spatial path reads the atom set's memory of past "
                                "generations too (next_token(..., memory => true)) in the teacher-forced scores "
                                "and free generation; the report records what the memory held. Off by default, so "
                                "that reports depend on the atom set alone."),
    out: Path = typer.Option(None, "--out", help="Output folder (default reports/<atom set>/)."),
) -> None:
    """Compare the spatial path with exact inference: report.html, report.md, report.json."""
    from hartonomous.compare import CompareOptions, run_compare, write_report
    from hartonomous.config import get_settings
    from hartonomous.corpus.teacher import cache_dir as teacher_cache_dir
    from hartonomous.db.connection import connect, reader_url

    options = CompareOptions(
        atom_set=atom_set, texts=list(text), prompts=prompts, max_positions=max_positions,
        max_neighbors=max_neighbors, max_new_tokens=max_new_tokens, seed=seed, device=device or get_settings().device,
        generation=not no_generation, distill_tokens=distill_tokens,
        cache_dir=teacher_cache_dir(get_settings().home), split=split or "test",
        history_weight=history_weight, against=against, memory=memory,
        command=" ".join(["hartonomous", *map(shlex.quote, sys.argv[1:])]))
    options.validate()
    if split is not None and text:
        console.print(f"note: --split {split} applies to the atom set's held-out text only; the --text files are "
                      "scored whole")
    out = out or Path("reports") / atom_set
    with connect(reader_url(), autocommit=True) as conn:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console, transient=False) as bar:
            result = run_compare(conn, options, progress=RichProgress(bar))
    paths = write_report(result.report, result.figures, out)
    Console().print(headline_table(result.report))
    note = (result.report.get("intervals") or {}).get("note")
    if note:
        Console().print(f"note: {note}")
    Console().print(f"report: {paths['html']}  (also {paths['md'].name}, {paths['json'].name})")


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
