"""`hartonomous` command line: the composition root (the only runtime module that imports `projection` and `benchmarks`).

Errors a user can cause print one line on stderr and exit 1; see `main`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import typer
from rich.console import Console

from hartonomous.config import get_settings
from hartonomous.errors import UserError

app = typer.Typer(
    help="Geometric next-token inference in PostgreSQL/PostGIS, measured against exact inference.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
db_app = typer.Typer(help="Manage the embedded PostgreSQL cluster (or show the configured server).",
                     no_args_is_help=True)
app.add_typer(db_app, name="db")
console = Console()


def fail(message: str, code: int = 1) -> None:
    """Print one line on stderr and exit non-zero."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(code)


def _external() -> str | None:
    return get_settings().database_url


@db_app.command("up")
def db_up() -> None:
    """Create (initdb) and start the embedded cluster; a no-op when it is already running."""
    from hartonomous.db.connection import connect, embedded_cluster, owner_url, redact

    if _external():
        with connect(owner_url()) as conn:
            conn.execute("SELECT 1")
        console.print(f"using HARTONOMOUS_DATABASE_URL ({redact(owner_url())}); nothing to start")
        return
    cluster = embedded_cluster()
    outcome = cluster.up()
    console.print(f"embedded database {outcome} on port {cluster.running_port()} ({cluster.data_dir})")


@db_app.command("down")
def db_down() -> None:
    """Stop the embedded cluster cleanly (fast shutdown)."""
    from hartonomous.db.connection import embedded_cluster

    if _external():
        raise UserError("HARTONOMOUS_DATABASE_URL is set; the external server is not managed by hartonomous")
    console.print(f"embedded database {embedded_cluster().down()}")


@db_app.command("status")
def db_status(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show whether the database is up, where, and its migration state."""
    from hartonomous.db.connection import embedded_cluster, owner_url, redact
    from hartonomous.db import migrate

    if _external():
        info: dict = {"mode": "external", "url": redact(owner_url())}
    else:
        info = {"mode": "embedded", **embedded_cluster().status()}
    running = info.get("running", True)
    if running:
        url = owner_url(autostart=False)
        info["revision"] = migrate.current_revision(url)
        info["head"] = migrate.head_revision()
        info["function_drift"] = migrate.function_drift(url) if info["revision"] else []
        if info["revision"]:
            info.update(migrate.active_kernel(url))
    from hartonomous.runtimes import runtime_summary

    info["exact_runtime"] = runtime_summary()
    from hartonomous.paths import PATHS

    info["paths"] = ", ".join(PATHS)       # the generation paths this install declares (hartonomous/paths/)
    if as_json:
        print(json.dumps(info, indent=2, default=str))
    else:
        for key, value in info.items():
            console.print(f"{key:>15}: {value}")
    if not running:
        raise typer.Exit(3)


@db_app.command("url")
def db_url(reader: bool = typer.Option(False, "--reader", help="URL of the least-privilege role.")) -> None:
    """Print the libpq URL (for psql and other tools)."""
    from hartonomous.db.connection import owner_url, reader_url

    print(reader_url(autostart=False) if reader else owner_url(autostart=False))


@db_app.command("psql", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def db_psql(ctx: typer.Context) -> None:
    """Open psql on the database; extra arguments go to psql."""
    from hartonomous.db.connection import owner_url

    psql = shutil.which("psql")
    if psql is None:
        raise UserError("psql is not installed; install postgresql-client (apt-get install postgresql-client)")
    os.execv(psql, [psql, owner_url(), *ctx.args])


@app.command("migrate")
def migrate_cmd(
    revision: str = typer.Argument("head", help="Target revision (default: head)."),
    down: bool = typer.Option(False, "--down", help="Downgrade to REVISION (use 'base' for empty)."),
) -> None:
    """Upgrade the schema to head (or downgrade) and reinstall drifted SQL functions."""
    from hartonomous.db import migrate
    from hartonomous.db.connection import owner_url

    url = owner_url()
    if down:
        migrate.downgrade(url, revision)
        console.print(f"downgraded to {revision}")
        return
    migrate.upgrade(url, revision)
    drift = migrate.function_drift(url)
    if drift and revision == "head":
        migrate.reinstall_sql_functions(url)
        console.print(f"reinstalled {len(drift)} drifted function(s) from sql/")
    console.print(f"database at revision {migrate.current_revision(url)}")


def _parse_window(value: str | None) -> object:
    """--window: an integer >= 1, or 'all' (every context token); None = the kind's default."""
    from projection.build import KEEP

    if value is None:
        return KEEP
    if value.strip().lower() in ("all", "none"):
        return None
    try:
        window = int(value)
    except ValueError:
        raise UserError(f"--window must be a positive integer or 'all', got '{value}'") from None
    if window < 1:
        raise UserError(f"--window must be a positive integer or 'all', got '{value}'")
    return window


@app.command("build")
def build_cmd(
    name: str = typer.Option(..., "--name", help="Name of the new atom set."),
    kind: str = typer.Option("context", "--kind", help="token (one atom per vocabulary token) or context "
                             "(distilled: key = context centroid, value = the model's next token)."),
    model: str = typer.Option(None, "--model", help="'smollm2' or a local Hugging Face model dir "
                              "(default: HARTONOMOUS_MODEL or smollm2)."),
    corpus: list[str] = typer.Option(None, "--corpus", help="What to distill; repeatable: UTF-8 text files, "
                                     "directories (walked recursively; binary, non-UTF-8 and duplicate files are "
                                     "skipped), or a built-in corpus: python-docstrings (the default: the Python "
                                     "standard library's docstrings) or python-source (the *.py source of the "
                                     "standard library and the installed packages, without tests)."),
    include: list[str] = typer.Option(None, "--include", help="With --corpus DIRECTORY: read only the files whose "
                                      "name matches this glob, e.g. '*.py'; repeatable (default: every file)."),
    exclude: list[str] = typer.Option(None, "--exclude", help="With --corpus DIRECTORY or python-source: leave out "
                                      "(of training text and holdout) the files whose path relative to their root "
                                      "matches this glob (fnmatch, case-sensitive; '*' also matches '/'), e.g. "
                                      "'site-packages/*' or 'sqlalchemy/orm/query.py'; python-source's roots are the "
                                      "stdlib and each site-packages directory; repeatable; the set records the "
                                      "globs."),
    max_tokens: int = typer.Option(100_000, "--max-tokens", help="Training tokens to distill (context sets)."),
    projection: str = typer.Option("lmds", "--projection", help="lmds (Landmark MDS) or pca."),
    landmarks: int = typer.Option(512, "--landmarks", help="Number of LMDS landmarks."),
    landmark_method: str = typer.Option("kmeans++", "--landmark-method", help="kmeans++, fps or random."),
    metric: str = typer.Option("euclidean", "--metric", help="Embedding distance: euclidean or cosine."),
    window: str = typer.Option(None, "--window", help="Centroid window W (an integer, or 'all'); "
                               "default 3 for context sets, all for token sets (the original design)."),
    decay: float = typer.Option(None, "--decay", help="Centroid decay in (0, 1]; default 0.01 for context "
                                "sets, 1 for token sets."),
    target: str = typer.Option("soft", "--target", help="soft (the exact model's top-k next tokens as atoms "
                               "weighing their probabilities), argmax (its next token), corpus (the text's: no "
                               "model pass, scales to 10^7 tokens) or mixed (soft on the first --teacher-tokens, "
                               "corpus on the rest)."),
    teacher_tokens: int = typer.Option(100_000, "--teacher-tokens", help="--target mixed: how many of the first "
                                       "training tokens get the exact model's soft labels."),
    self_distill: int = typer.Option(0, "--self-distill", help="Also let the exact model write this many tokens, "
                                     "continuing prompts cut from the training text (batched; greedy and sampled), "
                                     "and key atoms on its own words: what a speculative drafter must predict. "
                                     "0 = off."),
    self_distill_only: bool = typer.Option(False, "--self-distill-only", help="Atoms from the self-distilled text "
                                           "alone (the corpus still gives the prompts and the holdout)."),
    self_distill_temperature: float = typer.Option(0.8, "--self-distill-temperature", help="Every other batch of "
                                                   "--self-distill is sampled at this temperature; 0 = all greedy."),
    soft_k: int = typer.Option(8, "--soft-k", help="How many of the exact model's most probable next tokens "
                               "--target soft keeps per position (1-64)."),
    merge_radius: float = typer.Option(0.0, "--merge-radius", help="Merge atoms of one token within this "
                                       "3D distance into one weighted atom (0 = exact duplicates only)."),
    full_keys: bool = typer.Option(False, "--full-keys", help="Also store full-dimensional keys (pgvector)."),
    kernel: str = typer.Option(None, "--kernel", help="gaussian, exponential or backoff (counts the atoms "
                               "sharing the longest suffix with the context; for deep keys). Default: backoff "
                               "with --positions lattice, else gaussian."),
    bandwidth: float = typer.Option(None, "--bandwidth", help="Kernel bandwidth h (default: calibrated)."),
    bandwidth_objective: str = typer.Option("log-likelihood", "--bandwidth-objective",
                                            help="Calibrate h for log-likelihood (of the exact argmax) or top1."),
    max_neighbors: int = typer.Option(100, "--max-neighbors", help="K used for calibration (as next_token)."),
    sweep: bool = typer.Option(False, "--sweep", help="Try several window/decay pairs on the holdout "
                               "and keep the best (overrides --window/--decay)."),
    context_length: int = typer.Option(512, "--context-length", help="Tokens per teacher-forcing context."),
    batch_tokens: int = typer.Option(4096, "--batch-tokens", help="Tokens per forward batch."),
    holdout_chars: int = typer.Option(None, "--holdout-chars", help="Held-out characters (default: about "
                                      "10% of --max-tokens, at most 50000; for directories and python-source 50000 "
                                      "characters of whole files, the same at every --max-tokens)."),
    seed: int = typer.Option(0, "--seed", help="Seed for landmarks, the corpus shuffle and sampling."),
    device: str = typer.Option(None, "--device", help="auto, cpu or cuda (default: HARTONOMOUS_DEVICE)."),
    replace: bool = typer.Option(False, "--replace", help="Replace an atom set of the same name."),
    default: bool = typer.Option(False, "--default", help="Make it the default atom set."),
    history_weight: float = typer.Option(None, "--history-weight", help="Weight of the context's own history "
                                         "atoms (0 = off; default: calibrated on the holdout's calibration half "
                                         "for context sets, 0 for token sets)."),
    history_window: int = typer.Option(512, "--history-window", help="How many earlier context positions "
                                       "become history atoms (0-4096)."),
    controls: bool = typer.Option(False, "--controls/--no-controls", help="Also build NAME.random-positions: "
                                  "the same atoms keyed with randomly permuted token positions (a control)."),
    gate: bool = typer.Option(True, "--gate/--no-gate", help="With --target corpus: after the ingest, fit the "
                              "augmented path's gate on the calibration half (hartonomous gate fit NAME later "
                              "does the same)."),
    layout: str = typer.Option(None, "--layout", help="Storage of the atoms for next_token's KNN: rows (a GiST "
                               "index over the atoms) or tiles (also packed into Hilbert-ordered tiles: the same "
                               "results in fewer buffers per call). Default: the faster one in docs/benchmarks.md."),
    positions: str = typer.Option(None, "--positions", help="projection (the 3D projection's token "
                                  "positions) or learned (trained from them by gradient descent against the exact "
                                  "model's labels, early-stopped on the calibration half; context sets) or lattice (one cell of a 37^3 "
                                  "lattice per token, along Hilbert curves through the projection: deep keys whose "
                                  "nearest atoms share the longest suffix with the context; window 8, decay 1/128). "
                                  "Default: lattice for context sets of code (--corpus python-source, .py files, "
                                  "directories with --include '*.py'), where it agrees with the exact model more often "
                                  "(docs/fidelity.md); else projection."),
    epochs: int = typer.Option(30, "--epochs", help="--positions learned: at most this many epochs (KNN "
                               "recomputed each epoch)."),
    learning_rate: float = typer.Option(0.01, "--learning-rate", help="--positions learned: Adam step size, in "
                                        "units of the positions' spread."),
    learn_decay: bool = typer.Option(False, "--learn-decay/--no-learn-decay", help="--positions learned: also "
                                     "train the centroid decay."),
    keep_epoch: str = typer.Option("best", "--keep-epoch", help="--positions learned: best (the epoch best on "
                                   "the calibration half, early-stopped; may be the projection itself) or last "
                                   "(the last of --epochs, whatever the calibration half says: a diagnostic)."),
    calibrate_by: str = typer.Option("top1", "--calibrate-by", help="How the history weight and its bandwidth are "
                                     "chosen on the calibration half: top1 (best top-1 agreement with the exact "
                                     "argmax, near-ties by log-likelihood) or loglik (by --bandwidth-objective, "
                                     "the default before commit 8cc461e)."),
    teacher_cache: bool = typer.Option(True, "--teacher-cache/--no-teacher-cache", help="Reuse (and store) the "
                                       "exact model's labels per chunk under HARTONOMOUS_HOME/cache/teacher."),
) -> None:
    """Build an atom set from a model: 3D projection, atoms, bandwidth calibration, ingest."""
    from pathlib import Path

    from hartonomous.db.connection import connect, owner_url
    from hartonomous.corpus.teacher import cache_dir
    from projection.build import BuildOptions, build
    from projection.progress import RichReporter

    settings = get_settings()
    options = BuildOptions(
        name=name, kind=kind, model=model or settings.model, corpus=[Path(c) for c in corpus or []],
        include=list(include or []), exclude=list(exclude or []),
        max_tokens=max_tokens, teacher_tokens=teacher_tokens, projection=projection, landmarks=landmarks, landmark_method=landmark_method,
        metric=metric, window=_parse_window(window), decay=decay, target=target, soft_k=soft_k,
        merge_radius=merge_radius, history_weight=history_weight, history_window=history_window, controls=controls, gate=gate,
        full_keys=full_keys, kernel=kernel, bandwidth=bandwidth, bandwidth_objective=bandwidth_objective,
        max_neighbors=max_neighbors, sweep=sweep,
        context_length=context_length, batch_tokens=batch_tokens, holdout_chars=holdout_chars, seed=seed,
        device=device or settings.device, replace=replace, make_default=default, positions=positions,
        epochs=epochs, learning_rate=learning_rate, learn_decay=learn_decay, keep_epoch=keep_epoch,
        teacher_cache=cache_dir(settings.home) if teacher_cache else None, calibrate_by=calibrate_by,
        self_distill=self_distill, self_distill_only=self_distill_only,
        self_distill_temperature=self_distill_temperature)
    if layout is not None:
        options.layout = layout
    options.check()
    with connect(owner_url()) as conn:
        result = build(conn, options, reporter=RichReporter(console))
    _print_build_summary(result)


def _print_build_summary(result) -> None:
    from rich.table import Table

    s = result.stats
    table = Table(title=f"atom set '{result.name}' (id {result.atom_set_id})", show_header=False)
    rows = [
        ("kind", result.kind),
        ("atoms", f"{result.atoms:,} (before merging: {s.atoms.before_merge:,})"),
        ("tokens", f"{result.tokens:,}"),
        ("projection", f"trustworthiness {s.projection.trustworthiness:.3f}, "
                       f"recall@10 {s.projection.recall_at_10:.3f}"),
        ("centroid", f"window {result.window or 'all'}, decay {result.decay}"),
        ("bandwidth", f"h = {result.bandwidth:.4g} ({getattr(s.bandwidth, 'kernel', '')})"),
        ("history", f"weight {result.history_weight:g}, window {result.history_window}"),
        ("held-out top-1", f"{s.bandwidth.top1:.3f} vs the exact argmax, log-likelihood "
                           f"{s.bandwidth.log_likelihood:.3f} (calibration half: {s.calibration_split.positions:,} "
                           f"positions; test half {s.test_split.positions:,})"),
        ("forward pass", (f"{s.distill.tokens_per_second:,.0f} tokens/s" if s.distill.tokens_per_second else
                          "all labels from the teacher-label cache") + f" ({s.distill.device})"),
        ("ingest", f"{s.ingest.atoms_per_second:,.0f} atoms/s ({s.ingest.total_seconds:.1f}s)"),
        ("total", f"{result.seconds:.1f}s ("
                  + ", ".join(f"{k} {v:.1f}s" for k, v in result.stage_seconds.items()) + ")"),
    ]
    if s.self_distill is not None:
        d = s.self_distill
        rows.append(("self-distilled", f"{d['tokens']:,} tokens the model wrote ({d['greedy_sequences']} greedy, "
                                       f"{d['sampled_sequences']} sampled continuations"
                                       + (", its atoms alone" if d.get("only") else "") + ")"))
    if result.control is not None:
        c = result.control
        rows.append(("control", f"'{c.name}': {c.atoms:,} atoms, h = {c.bandwidth:.4g}, history weight "
                                f"{c.history_weight:g}, held-out top-1 {c.stats.bandwidth.top1:.3f}, "
                                f"log-likelihood {c.stats.bandwidth.log_likelihood:.3f}"))
    learned = s.learned_positions
    if learned is not None:
        first, kept = learned.curve[0], learned.curve[learned.best_epoch]
        rows.append(("learned positions", f"kept epoch {learned.best_epoch} of {len(learned.curve) - 1} "
                                          f"({learned.seconds:.1f}s); calibration top-1 {first['calibration_top1']:.3f}"
                                          f" -> {kept['calibration_top1']:.3f}, log-likelihood "
                                          f"{first['calibration_log_likelihood']:.3f} -> "
                                          f"{kept['calibration_log_likelihood']:.3f}"))
        _print_loss_curve(learned.curve)
    for key, value in rows:
        table.add_row(key, value)
    if s.centroid_sweep:
        sweep = Table(title="centroid sweep (held-out, calibrated h each)")
        for column in ("window", "decay", "atoms", "h", "top-1", "log-likelihood"):
            sweep.add_column(column, justify="right")
        for r in s.centroid_sweep:
            sweep.add_row("all" if r["window"] is None else str(r["window"]), f"{r['decay']:g}", f"{r['atoms']:,}",
                          f"{r['h']:.4g}", f"{r['top1']:.3f}", f"{r['log_likelihood']:.3f}")
        console.print(sweep)
    console.print(table)


def _print_loss_curve(curve: list[dict]) -> None:
    """The loss curve of `build --positions learned` (epoch 0 = the starting positions)."""
    from rich.table import Table

    table = Table(title="learned positions: loss curve (calibration half re-calibrated each epoch)")
    for column in ("epoch", "train KL", "cal. top-1", "cal. log-lik.", "cal. h", "rms moved / spread", "s"):
        table.add_column(column, justify="right")
    for r in curve:
        table.add_row(str(r["epoch"]), f"{r['train_kl']:.4f}", f"{r['calibration_top1']:.3f}",
                      f"{r['calibration_log_likelihood']:.3f}", f"{r['calibration_h']:.4g}",
                      f"{r['rms_displacement']:.4f}", f"{r['seconds']:.1f}")
    console.print(table)


@app.command("index")
def index_cmd(
    directory: str = typer.Argument(..., help="The repository's folder."),
    name: str = typer.Option(None, "--name", help="The atom set (default: the folder's name)."),
    exclude: list[str] = typer.Option(None, "--exclude", help="Leave out files or folders whose path relative to "
                                      "DIRECTORY matches this glob (fnmatch, '*' also matches '/'); repeatable."),
    recalibrate: bool = typer.Option(False, "--recalibrate", help="Refit the set's parameters (keys' bandwidth, "
                                     "history weight, risk model, gate) on the files as they are now: a full "
                                     "rebuild. Without it a run updates the set in place with its frozen parameters."),
    model: str = typer.Option(None, "--model", help="First index only: 'smollm2' or a local Hugging Face model "
                              "dir (default: HARTONOMOUS_MODEL or smollm2)."),
    watch: bool = typer.Option(False, "--watch", help="After this run, keep following DIRECTORY: saves are applied "
                               "as they happen (debounced), until Ctrl-C."),
) -> None:
    """Index a repository into an atom set that follows it: the first run builds it with the measured
    defaults for code (or prose), later runs apply only new, changed and removed files, in place."""
    from pathlib import Path

    from hartonomous.repository.index import index_repository

    def first_index(*args, **kwargs):      # the build (torch, the model) is imported only for a first index
        from projection.index import first_index as build

        return build(*args, **kwargs)

    def say(message: str) -> None:
        console.print(message, highlight=False)

    if watch:
        from hartonomous.repository.watch import watch_repository

        watch_repository(Path(directory), name, exclude=list(exclude or []), say=say, first_index=first_index,
                         model=model, progress=True, recalibrate=recalibrate)
        return
    report = index_repository(Path(directory), name, exclude=list(exclude or []), recalibrate=recalibrate,
                              first_index=first_index, model=model, say=say)
    console.print(report.summary(), highlight=False)
    if report.drift:
        console.print(report.drift, highlight=False)


atom_sets_app = typer.Typer(help="List atom sets; drop one; choose the default.")
app.add_typer(atom_sets_app, name="atom-sets")


@atom_sets_app.callback(invoke_without_command=True)
def atom_sets_list(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the atom sets with their key stats (default set marked *)."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    from hartonomous.atomset import list_atom_sets
    from hartonomous.db.connection import connect, owner_url

    with connect(owner_url()) as conn:
        rows = sorted((_catalog_row(record) for record in list_atom_sets(conn)), key=lambda r: r["name"])
    if as_json:
        print(json.dumps(rows, indent=2, default=str))
        return
    if not rows:
        console.print("no atom sets; build one with `hartonomous build --name NAME --kind context`")
        return

    def num(value, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    table = Table()
    for column in ("name", "kind", "atoms", "projection", "trustworthiness", "recall@10", "window", "decay",
                   "bandwidth", "held-out top-1", "model"):
        table.add_column(column, justify="left" if column in ("name", "kind", "projection", "model") else "right")
    for r in rows:
        table.add_row(("* " if r["is_default"] else "") + r["name"], r["kind"], num(r["atoms"], ","),
                      r["projection"], num(r["trustworthiness"], ".3f"), num(r["recall_at_10"], ".3f"),
                      "all" if r["centroid_window"] is None else str(r["centroid_window"]),
                      num(r["centroid_decay"], "g"), num(r["bandwidth"], ".4g"), num(r["holdout_top1"], ".3f"),
                      r["model"])
    console.print(table)


def _catalog_row(record) -> dict:
    """The facts `hartonomous atom-sets` shows about one set (stats that a set lacks are None)."""
    st = record.stats
    return {"name": record.name, "kind": record.kind, "is_default": record.is_default, "model": record.model,
            "model_key": record.model_key, "projection": record.projection,
            "centroid_window": record.centroid_window, "centroid_decay": record.centroid_decay,
            "kernel": record.kernel, "bandwidth": record.bandwidth, "history_weight": record.history_weight,
            "history_window": record.history_window, "vocab_size": record.vocab_size, "atoms": record.atoms,
            "trustworthiness": st.projection.trustworthiness if st.projection else None,
            "recall_at_10": st.projection.recall_at_10 if st.projection else None,
            "holdout_top1": st.bandwidth.top1 if st.bandwidth else None,
            "forward_tokens_per_second": st.distill.tokens_per_second if st.distill else None,
            "ingest_atoms_per_second": st.ingest.atoms_per_second if st.ingest else None,
            "created_at": record.created_at}


@atom_sets_app.command("drop")
def atom_sets_drop(name: str = typer.Argument(..., help="The atom set to remove.")) -> None:
    """Remove an atom set with its atoms, tokens and landmarks."""
    from hartonomous.atomset import drop_atom_set
    from hartonomous.db.connection import connect, owner_url

    with connect(owner_url()) as conn:
        controls = drop_atom_set(conn, name)
    console.print(f"dropped atom set '{name}'" + (f" and its controls {', '.join(controls)}" if controls else ""))


@atom_sets_app.command("default")
def atom_sets_default(name: str = typer.Argument(..., help="The atom set next_token uses by default.")) -> None:
    """Make NAME the default atom set (next_token's atom_set => NULL)."""
    from hartonomous.atomset import set_default_atom_set
    from hartonomous.db.connection import connect, owner_url

    with connect(owner_url()) as conn:
        set_default_atom_set(conn, name)
    console.print(f"'{name}' is now the default atom set")


from hartonomous.cli_generate import register as _register_generation  # noqa: E402

_register_generation(app)  # generate, next-token

from hartonomous.compare.cli import register as _register_compare  # noqa: E402

_register_compare(app)  # compare

from hartonomous.augment.cli import register as _register_gate  # noqa: E402

_register_gate(app)  # gate fit, gate show

from hartonomous.server.cli import register as _register_serve  # noqa: E402

_register_serve(app)  # serve

from hartonomous.db.cluster_cli import cluster_app, register as _register_cluster  # noqa: E402

_register_cluster(app)  # cluster

from benchmarks.cli import register as _register_bench  # noqa: E402

_register_bench(app, cluster_app)  # bench, cluster bench


def main() -> None:
    """Entry point: run the app, turning user-fixable errors into one line and exit 1."""
    import sqlalchemy.exc
    import psycopg

    try:
        app(standalone_mode=False)
    except UserError as exc:
        fail(str(exc))
    except (typer.Exit, SystemExit) as exc:
        sys.exit(getattr(exc, "exit_code", getattr(exc, "code", 0)))
    except (typer.Abort, KeyboardInterrupt):
        fail("interrupted", 130)
    except (psycopg.OperationalError, sqlalchemy.exc.OperationalError) as exc:
        orig = getattr(exc, "orig", None) or exc
        fail(f"database unreachable ({orig}); check HARTONOMOUS_DATABASE_URL or run `hartonomous db up`")
    except sqlalchemy.exc.DBAPIError as exc:
        fail(str(getattr(exc, "orig", exc)).splitlines()[0])
    except psycopg.Error as exc:
        diag = getattr(exc, "diag", None)
        fail(diag.message_primary if diag and diag.message_primary else str(exc).splitlines()[0])
    except Exception as exc:
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):  # click/typer usage errors
            exc.show()
            sys.exit(exc.exit_code)
        raise


if __name__ == "__main__":
    main()
