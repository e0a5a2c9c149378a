"""The first index of a repository (and `index --recalibrate`): the build's stages on per-file chunks.

`hartonomous index DIR` (hartonomous/repository/index.py) hands over the repository's files,
each tokenized alone and placed in its split by a hash of its path. This module runs the build's
own stages (projection/stages.py) on them, with no options to choose: the measured best defaults
(docs/fidelity.md "Default keys per corpus", docs/demo.md) for code, lattice keys with the
backoff kernel (window 8, decay 1/128), and for prose the projection's keys with the Gaussian
kernel (window 3, decay 0.01); corpus labels (no model pass over the training files), the rows
layout (updated in place), history weight and bandwidth fitted on the calibration split, the risk
model, and the augmented path's gate. Training chunks never cross a file boundary, so a file's
atoms are its own and later runs can add or subtract them (hartonomous/repository/update.py).

Everything, the gate and the file table included, is written in one transaction: an index
killed at any point leaves nothing (or, with --recalibrate, the set as it was).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path

import json
import numpy as np

from hartonomous.corpus.sources import Corpus
from hartonomous.errors import UserError
from hartonomous.repository.chunking import file_chunks
from hartonomous.repository.split import CALIBRATION_SHARE, TEST_SHARE, path_fraction
from hartonomous.repository.update import FileEntry, insert_files
from hartonomous.splits import SEPARATOR
from hartonomous.threads import fixed_threads
from projection import stages
from projection.options import BuildOptions
from projection.progress import Reporter, RichReporter
from projection.risk import fit_risk

CONTEXT_LENGTH = 512
# The parameters and the gate are fitted on about this many calibration tokens: about what a code
# build calibrates on at every size (3,279 tokens of python-source, docs/demo.md "Sizing").
FIT_TOKENS = 4_096


def index_options(name: str, model: str, code: bool, replace: bool, landmarks: int = 512) -> BuildOptions:
    """The build options of an indexed set: code's or prose's measured defaults, corpus labels, rows."""
    keys = dict(positions="lattice", kernel="backoff") if code else dict(positions="projection", kernel="gaussian")
    options = BuildOptions(name=name, kind="context", model=model, target="corpus", replace=replace,
                           landmarks=landmarks, context_length=CONTEXT_LENGTH, gate=True, **keys)
    options.layout = "rows"
    return options


def fitting_files(entries: list[FileEntry]) -> list[FileEntry]:
    """The calibration files the parameters are fitted on: in order of their path's hash, until
    FIT_TOKENS tokens (so a large repository's fit costs what a build's does; the same files
    whatever else the repository holds)."""
    chosen, tokens = [], 0
    for e in sorted((e for e in entries if e.split == "calibration"), key=lambda e: path_fraction(e.path)):
        if tokens >= FIT_TOKENS:
            break
        chosen.append(e)
        tokens += len(e.token_ids)
    return chosen


def repository_texts(root: Path, entries: list[FileEntry], texts: dict[str, str], context_length: int) -> stages.Texts:
    """The build's Texts from the files: training chunks per file; the fitting calibration files' and
    the test files' texts joined by a blank line (the holdout, held out by document), their chunks per file."""
    by_split = {s: [e for e in entries if e.split == s] for s in ("train", "test")}
    by_split["calibration"] = fitting_files(entries)
    chunks = {s: [c for e in files for c in file_chunks(e.token_ids, context_length)] for s, files in by_split.items()}
    calibration_text = SEPARATOR.join(texts[e.path] for e in by_split["calibration"])
    test_text = SEPARATOR.join(texts[e.path] for e in by_split["test"])
    if not chunks["train"]:
        raise UserError(f"{root} has no training files with 2 or more tokens ({len(entries)} files read); index a "
                        "directory with more text")
    if not chunks["calibration"]:
        raise UserError(f"{root} has {len(entries)} files and none falls in the calibration split (the "
                        f"{CALIBRATION_SHARE:.0%} of files chosen by a hash of their path) that fits the set's "
                        "parameters; index a larger directory")
    corpus = Corpus(f"repository {root} ({len(entries)} files)", calibration_text + SEPARATOR + test_text,
                    calibration_text, test_text, len(by_split["calibration"]) + len(by_split["test"]),
                    train_text=None, train_count=len(by_split["train"]))
    train_ids = np.concatenate([e.token_ids for e in by_split["train"]]).astype(np.int64)
    return stages.Texts(corpus, train_ids, "", chunks["train"], calibration_text, chunks["calibration"], test_text,
                        chunks["test"])


def first_index(conn, *, root: Path, name: str, entries: list[FileEntry], texts: dict[str, str], code: bool,
                model: str, replace: bool, progress: bool, model_obj=None, tokenizer=None, landmarks: int = 512,
                reporter: Reporter | None = None) -> int:
    """Build the indexed set (or rebuild it, `replace`) in one transaction; returns its atom count."""
    with fixed_threads():
        return _first_index(conn, root, name, entries, texts, code, model, replace, progress, model_obj, tokenizer,
                            landmarks, reporter)


def _first_index(conn, root, name, entries, texts, code, model, replace, progress, model_obj, tokenizer, landmarks,
                 reporter) -> int:
    from rich.console import Console

    from hartonomous.atomset import CorpusStats

    ui = reporter or (RichReporter(Console(stderr=True)) if progress else Reporter())
    options = index_options(name, model, code, replace, landmarks)
    options.check()
    if model_obj is None or tokenizer is None:
        from hartonomous.config import get_settings
        from hartonomous.corpus.teacher import cache_dir
        from hartonomous.model import load_model, load_tokenizer, pick_device

        ui.step(f"loading model {model}")
        model_obj, tokenizer = load_model(model, pick_device(get_settings().device)), load_tokenizer(model)
        options.teacher_cache = cache_dir(get_settings().home)   # as `build`: --recalibrate reuses the labels
    model_name = getattr(model_obj.config, "name_or_path", None) or model
    embeddings = model_obj.get_input_embeddings().weight.detach().float().cpu().numpy()
    loaded = stages.Loaded(model_obj, tokenizer, model_name, embeddings,
                           repository_texts(root, entries, texts, options.context_length))
    ui.step(f"defaults for {'code: lattice keys, backoff kernel' if code else 'prose: projection keys, gaussian kernel'}")
    projected = stages.project(options, loaded, ui)
    labelled = stages.label(options, loaded, ui)
    centroid = stages.choose_centroid(options, loaded, projected, labelled, ui)
    lattice, positions = None, projected.positions
    if options.positions == "lattice":
        lattice = stages.place_on_lattice(options, loaded, projected, ui)
        positions = lattice.positions
    atoms = stages.make_atoms(options, loaded, positions, labelled, centroid, ui)
    calibrated = stages.calibrate(options, loaded, labelled, atoms, ui)
    history = stages.calibrate_history(options, loaded, positions, labelled, atoms, calibrated, ui)
    risk_model = fit_risk(options, loaded, positions, labelled, atoms, calibrated, history, ui)
    stats = stages.collect_stats(options, loaded, projected, labelled, atoms, calibrated, history)
    split_files = {s: [e for e in entries if e.split == s] for s in ("train", "calibration", "test")}
    tokens = {s: int(sum(len(e.token_ids) for e in files)) for s, files in split_files.items()}
    stats = stats.model_copy(update={"corpus": CorpusStats(
        source=f"repository {root}", files=[str(root)], split="documents", train_tokens=tokens["train"],
        train_segments=len(split_files["train"]), context_length=options.context_length, seed=options.seed,
        documents=len(entries), holdout_documents=len(split_files["calibration"]) + len(split_files["test"]),
        train_documents=len(split_files["train"]))})
    fitted_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    fit = fitting_files(entries)
    fitted = {"at": fitted_at, **{f"{s}_files": len(f) for s, f in split_files.items()},
              **{f"{s}_tokens": tokens[s] for s in split_files},
              "fit_files": len(fit), "fit_tokens": int(sum(len(e.token_ids) for e in fit))}
    repository = {"root": str(root), "defaults": "code" if code else "prose", "next_file_id": len(entries),
                  "split_rule": {"hash": "sha256(path)[:8] / 2^64", "calibration_share": CALIBRATION_SHARE,
                                 "test_share": TEST_SHARE},
                  "fitted": fitted, "updates": 0, "calibration_changed_tokens": 0, "train_changed_tokens": 0}
    with conn.transaction():
        report = stages.ingest(conn, options, loaded, projected, atoms, history, stats, ui, None,
                               risk_model=risk_model, lattice=lattice)
        t0 = time.perf_counter()
        with ui.bar("file table", len(entries), "file") as advance:
            insert_files(conn, report.atom_set_id, entries, 0)
            advance(len(entries))
        repository["file_table_seconds"] = round(time.perf_counter() - t0, 3)
        conn.execute("UPDATE atom_sets SET root = %s, stats = stats || jsonb_build_object('repository', %s::jsonb) "
                     "WHERE id = %s", (str(root), json.dumps(repository), report.atom_set_id))
        _fit_gate(conn, name, loaded, ui, fitted)
    return report.atoms


def _fit_gate(conn, name: str, loaded: stages.Loaded, ui: Reporter, fitted: dict) -> None:
    """The gate, fitted on the calibration split inside the index's transaction; recorded with what
    it was fitted on and when (`hartonomous gate show`). Too few calibration positions: no gate."""
    from hartonomous.augment.calibrate import calibration_windows, fit_set_gate, positions_in
    from hartonomous.augment.gate import MIN_POSITIONS

    total = positions_in(calibration_windows(loaded.texts.calibration_text, loaded.tokenizer))
    if total < MIN_POSITIONS:
        ui.step(f"no gate for the augmented path: {total} calibration positions, a gate needs {MIN_POSITIONS}")
        return
    with ui.bar("fitting the augmented path's gate", total, unit="positions") as advance:
        gate = fit_set_gate(conn, name, model=loaded.model, tokenizer=loaded.tokenizer, on_positions=advance)
    on = {"split": "calibration", "files": fitted["fit_files"], "tokens": fitted["fit_tokens"],
          "at": fitted["at"], "index": "first index or --recalibrate; updates keep it"}
    conn.execute("UPDATE augment_gates g SET details = g.details || jsonb_build_object('fitted_on', %s::jsonb) "
                 "FROM atom_sets s WHERE s.id = g.atom_set_id AND s.name = %s", (json.dumps(on), name))
    ui.step(f"gate fitted on {gate.positions:,} calibration positions (log-loss {gate.exact_loss:.3f} exact -> "
            f"{gate.calibration_loss:.3f} augmented)")
