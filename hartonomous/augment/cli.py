"""`hartonomous gate fit|show`: the augmented path's gate of an atom set."""

from __future__ import annotations

import json
import math

import typer
from rich.console import Console

gate_app = typer.Typer(help="The augmented path's gate: how far to trust the atom store at each step.",
                       no_args_is_help=True)
console = Console()


def _describe(name: str, gate) -> dict:
    return {"atom_set": name, **gate.as_dict(),
            "calibration_perplexity": {"exact": math.exp(gate.exact_loss), "augmented": math.exp(gate.calibration_loss)}}


@gate_app.command("fit")
def gate_fit(
    atom_set: str = typer.Argument(..., help="The atom set (built with --target corpus) whose gate to fit."),
    max_positions: int = typer.Option(None, "--max-positions", min=24,
                                      help="Fit on at most this many calibration positions (default: all)."),
    max_neighbors: int = typer.Option(100, "--max-neighbors", min=1, max=100_000,
                                      help="The store's KNN size, as the augmented path will call it."),
    as_json: bool = typer.Option(False, "--json", help="Print the fitted gate as JSON."),
) -> None:
    """Fit the gate on the set's calibration split (never its test split) against the real next
    token, with the exact reference model, and store it beside the set (replacing an older one)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from hartonomous.augment.calibrate import fit_set_gate
    from hartonomous.db.connection import connect, owner_url

    with connect(owner_url(), autocommit=True) as conn, \
            Progress(TextColumn("fitting the gate"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                     console=console, transient=True, disable=as_json) as bar:
        task = bar.add_task("walk", total=None)
        gate = fit_set_gate(conn, atom_set, max_positions=max_positions, max_neighbors=max_neighbors,
                            on_total=lambda n: bar.update(task, total=n),
                            on_positions=lambda n: bar.advance(task, n))
    if as_json:
        print(json.dumps(_describe(atom_set, gate), indent=2))
        return
    d = _describe(atom_set, gate)
    console.print(f"gate of '{atom_set}' fitted on {gate.positions:,} calibration positions: perplexity "
                  f"{d['calibration_perplexity']['exact']:.3f} (exact) -> {d['calibration_perplexity']['augmented']:.3f} "
                  "(augmented) on that split; score it on the test split with `hartonomous compare`")


@gate_app.command("show")
def gate_show(atom_set: str = typer.Argument(..., help="The atom set whose gate to show.")) -> None:
    """Print the set's gate (features, coefficients, how it was fitted, when and on what) as JSON."""
    from hartonomous.augment.gates import load_gate
    from hartonomous.db.connection import connect, reader_url

    with connect(reader_url()) as conn:
        gate = load_gate(conn, atom_set)
        (fitted_at,) = conn.execute("SELECT g.fitted_at FROM augment_gates g JOIN atom_sets s ON s.id = g.atom_set_id "
                                    "WHERE s.name = %s", (atom_set,)).fetchone()
    described = _describe(atom_set, gate)
    described["fitted_at"] = fitted_at.isoformat(timespec="seconds")
    # An indexed set's gate says what it was fitted on (extra.fitted_on: split, files, tokens); updates keep it.
    print(json.dumps(described, indent=2, default=str))


def register(app: typer.Typer) -> None:
    app.add_typer(gate_app, name="gate")
