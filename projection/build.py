"""`hartonomous build`: model -> 3D projection -> labels -> atoms -> bandwidth -> ingest.

The stages live in projection.stages; `build` runs them in order. Nothing is written to the
database until the last stage, which is one transaction (hartonomous.atomset.write), so an
interrupted build leaves nothing behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from hartonomous.atomset import BuildStats, atom_set_exists
from hartonomous.errors import UserError
from projection import stages
from projection.options import KEEP, BuildOptions
from projection.progress import Reporter

__all__ = ["KEEP", "BuildOptions", "BuildResult", "build", "require_new_name"]


@dataclass(frozen=True)
class BuildResult:
    """What the CLI prints at the end of a build."""

    atom_set_id: int
    name: str
    kind: str
    atoms: int
    tokens: int
    window: int | None
    decay: float
    bandwidth: float
    stats: BuildStats
    seconds: float


def require_new_name(conn, options: BuildOptions) -> None:
    """Refuse to overwrite an existing set unless --replace; leaves the connection idle."""
    if not options.replace and atom_set_exists(conn, options.name):
        raise UserError(f"atom set '{options.name}' already exists; pass --replace or run "
                        f"`hartonomous atom-sets drop {options.name}`")
    conn.rollback()  # write_atom_set needs an idle connection: it runs its own transaction


def build(conn, options: BuildOptions, model=None, tokenizer=None, reporter: Reporter | None = None) -> BuildResult:
    """Run a whole build; `model`/`tokenizer` default to loading `options.model`."""
    ui = reporter or Reporter()
    options.check()
    started = time.perf_counter()
    require_new_name(conn, options)
    loaded = stages.load(options, model, tokenizer, ui)
    projected = stages.project(options, loaded, ui)
    labelled = stages.label(options, loaded, ui)
    centroid = stages.choose_centroid(options, loaded, projected, labelled, ui)
    atoms = stages.make_atoms(options, loaded, projected, labelled, centroid, ui)
    calibrated = stages.calibrate(options, loaded, labelled, atoms, ui)
    stats = stages.collect_stats(options, loaded, projected, labelled, atoms, calibrated)
    report = stages.ingest(conn, options, loaded, projected, atoms, calibrated, stats, ui)
    stats = stats.model_copy(update={"ingest": report.stats()})
    return BuildResult(report.atom_set_id, options.name, options.kind, report.atoms, loaded.vocab_size,
                       centroid.window, centroid.decay, calibrated.bandwidth, stats, time.perf_counter() - started)
