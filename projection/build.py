"""`hartonomous build`: model -> 3D projection -> labels -> atoms -> bandwidth -> history -> ingest.

The stages live in projection.stages; `build` runs them in order. Nothing is written to the
database until the last stage, one transaction per set (hartonomous.atomset.write), so an
interrupted build leaves nothing behind. The gate (--gate, the default with --target corpus) is
fitted after the ingest, on the written set: if that fails, the set is kept without a gate and the
error says so (`gate_not_fitted`). With --controls the random-positions control is
written first and the set second (the set records the control's name); if the set's write
fails, the control is dropped again.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace

import psycopg

from hartonomous.atomset import BuildStats, atom_set_exists, list_atom_sets
from hartonomous.errors import UserError
from hartonomous.threads import fixed_threads
from projection import stages
from projection.options import KEEP, BuildOptions
from projection.progress import Reporter
from projection.risk import fit_risk

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
    history_weight: float
    history_window: int
    stats: BuildStats
    seconds: float
    stage_seconds: dict[str, float]
    control: "BuildResult | None" = None


def require_new_name(conn, options: BuildOptions) -> None:
    """Refuse to overwrite an existing set (or its control) unless --replace; leaves the connection idle."""
    names = [options.name] + ([options.random_positions_name] if options.controls else [])
    for name in names:
        if not options.replace and atom_set_exists(conn, name):
            raise UserError(f"atom set '{name}' already exists; pass --replace or run "
                            f"`hartonomous atom-sets drop {name}`")
    conn.rollback()  # write_atom_set needs an idle connection: it runs its own transaction


def becomes_default(conn, options: BuildOptions) -> bool:
    """Whether the set should be the default: --default, or no other set is (the control, written
    first, would otherwise take the place of a first set); leaves the connection idle."""
    others = [s.name for s in list_atom_sets(conn) if s.is_default
              and s.name not in (options.name, options.random_positions_name)]
    conn.rollback()
    return options.make_default or not others


def build(conn, options: BuildOptions, model=None, tokenizer=None, reporter: Reporter | None = None) -> BuildResult:
    """Run a whole build; `model`/`tokenizer` default to loading `options.model`. torch and BLAS run
    on a fixed number of threads throughout (hartonomous.threads), so the same command on the same
    machine gives the same set (docs/atoms.md, Determinism)."""
    with fixed_threads():
        return _build(conn, options, model, tokenizer, reporter)


def fit_gate_after_ingest(conn, options: BuildOptions, loaded, ui: Reporter) -> None:
    """The augmented path's gate, fitted on the set's calibration half against the real next token
    (hartonomous.augment.gates) and stored beside the set; it needs the written set (store_distribution)."""
    from hartonomous.augment.calibrate import calibration_windows, fit_set_gate, positions_in

    conn.rollback()
    from hartonomous.augment.gate import MIN_POSITIONS

    total = positions_in(calibration_windows(loaded.texts.calibration_text, loaded.tokenizer))
    if total < MIN_POSITIONS:
        ui.step(f"no gate for the augmented path: {total} calibration positions, a gate needs {MIN_POSITIONS}")
        return
    with ui.bar("fitting the augmented path's gate", total, unit="positions") as advance:
        gate = fit_set_gate(conn, options.name, model=loaded.model, tokenizer=loaded.tokenizer,
                            on_positions=advance)
    conn.commit()
    ui.step(f"gate fitted on {gate.positions:,} calibration positions (log-loss {gate.exact_loss:.3f} exact -> "
            f"{gate.calibration_loss:.3f} augmented)")


def gate_not_fitted(conn, name: str, atoms: int, cause: BaseException) -> UserError:
    """The error of a build whose gate failed after its ingest committed: the set is kept, without a
    gate (the augmented path refuses it and says how to fit one; every other path serves it), as a
    rebuild would redo the whole ingest. The message says so, and what to do."""
    with contextlib.suppress(psycopg.Error):
        conn.rollback()
    reason = "interrupted" if isinstance(cause, KeyboardInterrupt) else (str(cause).strip().splitlines() or [
        type(cause).__name__])[0]
    return UserError(f"atom set '{name}' was written ({atoms:,} atoms) and is kept without a gate for the augmented "
                     f"path: fitting the gate failed ({reason}); fit it with `hartonomous gate fit {name}`, or drop "
                     f"the set with `hartonomous atom-sets drop {name}`")


def _build(conn, options: BuildOptions, model, tokenizer, reporter: Reporter | None) -> BuildResult:
    ui = reporter or Reporter()
    options.check()
    started = time.perf_counter()
    require_new_name(conn, options)
    seconds: dict[str, float] = {}

    def timed(stage: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - t0
        return result

    loaded = timed("load", stages.load, options, model, tokenizer, ui)
    projected = timed("project", stages.project, options, loaded, ui)
    labelled = timed("label", stages.label, options, loaded, ui)
    labelled = timed("self_distill", stages.self_distill, options, loaded, labelled, ui)
    centroid = timed("choose_centroid", stages.choose_centroid, options, loaded, projected, labelled, ui)
    learned, lattice, positions = None, None, projected.positions
    if options.positions == "lattice":
        lattice = timed("place_on_lattice", stages.place_on_lattice, options, loaded, projected, ui)
        positions = lattice.positions
    if options.positions == "learned":
        learned = timed("learn_positions", stages.learn_positions, options, loaded, projected, labelled, centroid, ui)
        positions, centroid = learned.positions, learned.centroid
    atoms = timed("make_atoms", stages.make_atoms, options, loaded, positions, labelled, centroid, ui)
    calibrated = timed("calibrate", stages.calibrate, options, loaded, labelled, atoms, ui)
    history = timed("calibrate_history", stages.calibrate_history, options, loaded, positions, labelled,
                    atoms, calibrated, ui)
    risk_model = timed("fit_risk", fit_risk, options, loaded, positions, labelled, atoms, calibrated,
                       history, ui)
    control = None
    if options.controls:
        control = timed("random_positions", stages.random_positions, options, loaded, projected, labelled,
                        centroid, ui, None if lattice is None else lattice.positions)
    stats = stages.collect_stats(options, loaded, projected, labelled, atoms, calibrated, history, control, learned)
    stats = stats.model_copy(update={"stage_seconds": dict(seconds)})   # the stages before the ingest (its own: stats.ingest)
    control_result = None
    if control is not None:
        default = becomes_default(conn, options)
        control_stats = stages.control_stats(options, loaded, projected, labelled, control)
        report = timed("ingest_control", stages.ingest_control, conn, options, loaded, control, control_stats, ui)
        control_stats = control_stats.model_copy(update={"ingest": report.stats()})
        control_result = BuildResult(report.atom_set_id, control.name, options.kind, report.atoms, loaded.vocab_size,
                                     centroid.window, centroid.decay, control.history.bandwidth,
                                     control.history.weight, control.history.window, control_stats,
                                     seconds["random_positions"] + seconds["ingest_control"], {})
        options = replace(options, make_default=default)
    try:
        report = timed("ingest", stages.ingest, conn, options, loaded, projected, atoms, history, stats, ui, learned,
                       risk_model=risk_model, lattice=lattice)
    except BaseException:
        if control is not None:
            stages.drop_control(conn, control)
        raise
    stats = stats.model_copy(update={"ingest": report.stats()})
    if options.gate and options.target == "corpus" and loaded.texts.calibration_chunks:
        try:
            timed("fit_gate", fit_gate_after_ingest, conn, options, loaded, ui)
        except (Exception, KeyboardInterrupt) as exc:
            raise gate_not_fitted(conn, options.name, report.atoms, exc) from exc
    return BuildResult(report.atom_set_id, options.name, options.kind, report.atoms, loaded.vocab_size,
                       centroid.window, centroid.decay, history.bandwidth, history.weight, history.window, stats,
                       time.perf_counter() - started, seconds, control_result)
