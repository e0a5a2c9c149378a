"""The stages of a build, each a function from the earlier stages' frozen results to its own.

    load -> project -> label -> choose_centroid -> make_atoms -> calibrate -> (stats) -> ingest

load       the model, its input embeddings, and the tokenized corpus (training + held-out chunks)
project    the embeddings to 3D (LMDS or PCA) and the projection's quality
label      teacher forcing: the exact model's argmax at every training and held-out position
choose_centroid  the centroid window/decay: the options' own, or the best of a held-out sweep
make_atoms token or context atoms (merged), the held-out queries, full-dimensional keys if asked
calibrate  the kernel bandwidth on the holdout (or score a given one); the keys' bandwidth too
ingest     the one database write (hartonomous.atomset.write), a single transaction

Nothing touches the database before `ingest`. A new stage (soft labels, learned positions,
history calibration) takes the results it needs and returns a frozen result of its own.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass
from typing import Any

import numpy as np

from hartonomous.errors import UserError
from hartonomous.teacher import Forced
from projection import calibrate as cal
from projection.atoms import context_atoms, context_keys, context_values, merge_atoms, token_atoms
from hartonomous.corpus import Corpus, load_corpus
from projection.distill import chunk_ids, distill, tokenize
from hartonomous.atomset import (AtomRows, AtomSetSpec, AtomStats, BuildStats, CorpusStats, DistillStats, HoldoutStats,
                                 IngestReport, LandmarkRows, TokenRows, write_atom_set)
from projection.options import BuildOptions
from projection.progress import Reporter
from projection.project import FittedProjection, fit_projection
from projection.quality import projection_quality
from projection.sweep import CANDIDATES, Evaluated, sweep

KEY_CALIBRATION_QUERIES = 1000


# --- load ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Texts:
    """The tokenized corpus of a build: training chunks (context sets only) and held-out chunks."""

    corpus: Corpus
    train_ids: np.ndarray
    train_text: str
    train_chunks: list[np.ndarray]
    holdout_chunks: list[np.ndarray]


@dataclass(frozen=True)
class Loaded:
    """The model and tokenizer, the input embedding matrix (vocab x dim, float32), the corpus."""

    model: Any
    tokenizer: Any
    model_name: str
    embeddings: np.ndarray
    texts: Texts

    @property
    def vocab_size(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def dim(self) -> int:
        return int(self.embeddings.shape[1])


def load_texts(options: BuildOptions, tokenizer) -> Texts:
    is_context = options.kind == "context"
    corpus = load_corpus(options.corpus, options.max_tokens, options.holdout_chars, options.seed, train=is_context)
    holdout_chunks = chunk_ids(tokenize(tokenizer, corpus.holdout_text)[0], options.context_length)
    train_ids, train_text = tokenize(tokenizer, corpus.train_text, options.max_tokens)
    train_chunks = chunk_ids(train_ids, options.context_length)
    if is_context and not train_chunks:
        raise UserError("the corpus left no training text after the holdout; pass more text with --corpus")
    if not holdout_chunks:
        raise UserError("the holdout is empty; pass more text with --corpus or raise --holdout-chars")
    return Texts(corpus, train_ids, train_text, train_chunks, holdout_chunks)


def load(options: BuildOptions, model, tokenizer, ui: Reporter) -> Loaded:
    """`model`/`tokenizer` as given, or loaded from `options.model`; then the corpus (so a bad
    --corpus fails before the slow stages)."""
    if model is None or tokenizer is None:
        from hartonomous.model import load_model, load_tokenizer, pick_device

        ui.step(f"loading model {options.model}")
        model = load_model(options.model, pick_device(options.device))
        tokenizer = load_tokenizer(options.model)
    model_name = getattr(model.config, "name_or_path", None) or options.model
    embeddings = model.get_input_embeddings().weight.detach().float().cpu().numpy()
    return Loaded(model, tokenizer, model_name, embeddings, load_texts(options, tokenizer))


# --- project -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Projected:
    """The fitted projection, every token's 3D position, and stats['projection']."""

    fitted: FittedProjection
    quality: dict

    @property
    def positions(self) -> np.ndarray:
        return self.fitted.positions


def project(options: BuildOptions, loaded: Loaded, ui: Reporter) -> Projected:
    ui.step(f"projecting {loaded.vocab_size} x {loaded.dim} embeddings to 3D ({options.projection}"
            + (f", {options.landmarks} {options.landmark_method} landmarks" if options.projection == "lmds" else "")
            + f", {options.metric})")
    fitted = fit_projection(loaded.embeddings, options.projection, options.landmarks, options.landmark_method,
                            options.metric, options.seed)
    quality = projection_quality(loaded.embeddings, fitted.positions, options.metric, seed=options.seed)
    quality["seconds"] = fitted.seconds
    ui.step(f"projection: trustworthiness {quality['trustworthiness']:.3f}, "
            f"recall@10 {quality['recall_at_10']:.3f} ({fitted.seconds:.1f}s)")
    return Projected(fitted, quality)


# --- label ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Labelled:
    """The chunks the atoms and the calibration use, with the exact model's argmax at each position.

    train_chunks is empty for token sets; train_argmax is None unless the set's atoms are
    valued by the argmax (--target argmax). `forced` is the teacher-forcing pass itself.
    """

    train_chunks: list[np.ndarray]
    holdout_chunks: list[np.ndarray]
    train_argmax: list[np.ndarray] | None
    holdout_argmax: list[np.ndarray]
    forced: Forced
    device: str

    @property
    def holdout_targets(self) -> np.ndarray:
        """The exact argmax at every held-out atom position: what the calibration predicts."""
        return context_values(self.holdout_chunks, self.holdout_argmax, "argmax")


def label(options: BuildOptions, loaded: Loaded, ui: Reporter) -> Labelled:
    texts = loaded.texts
    train_chunks = texts.train_chunks if options.kind == "context" else []
    train_labelled = train_chunks if options.target == "argmax" else []
    label_chunks = train_labelled + texts.holdout_chunks
    ui.step(f"corpus: {texts.corpus.description}; {sum(map(len, train_chunks))} training tokens, "
            f"{sum(map(len, texts.holdout_chunks))} held-out tokens")
    with ui.bar("teacher forcing", int(sum(map(len, label_chunks))), "tok") as advance:
        forced = distill(loaded.model, label_chunks, options.batch_tokens, advance)
    ui.step(f"forward pass: {forced.tokens} tokens in {forced.seconds:.1f}s "
            f"({forced.tokens_per_second:,.0f} tokens/s)")
    return Labelled(train_chunks, texts.holdout_chunks,
                    forced.argmax[:len(train_labelled)] if options.target == "argmax" else None,
                    forced.argmax[len(train_labelled):], forced, str(next(loaded.model.parameters()).device))


# --- choose_centroid -----------------------------------------------------------------------

@dataclass(frozen=True)
class Centroid:
    """The context-centroid window and decay of the set; the sweep's rows when one chose them."""

    window: int | None
    decay: float
    sweep: list[dict] | None


def atom_rows(options: BuildOptions, labelled: Labelled, positions: np.ndarray, window: int | None,
              decay: float, full: np.ndarray | None = None) -> AtomRows:
    """The set's atoms for one (window, decay); full-dimensional keys from `full` when given."""
    if options.kind != "context":
        return token_atoms(positions, full)
    raw = context_atoms(labelled.train_chunks, labelled.train_argmax, positions, window, decay, options.target, full)
    return merge_atoms(raw, options.merge_radius)


def holdout_queries(labelled: Labelled, vectors: np.ndarray, window: int | None, decay: float,
                    dtype=np.float64) -> np.ndarray:
    """The context centroid of every held-out atom position (row i predicts holdout_targets[i])."""
    return context_keys(labelled.holdout_chunks, vectors, window, decay, dtype)


def fit_3d(options: BuildOptions, atoms: AtomRows, queries: np.ndarray, labelled: Labelled,
           vocab_size: int) -> cal.Fit:
    return cal.fit(atoms.positions, atoms.token_ids, atoms.weights, queries, labelled.holdout_targets,
                   options.kernel, options.max_neighbors, vocab_size, options.bandwidth_objective)


def choose_centroid(options: BuildOptions, loaded: Loaded, projected: Projected, labelled: Labelled,
                    ui: Reporter) -> Centroid:
    """The options' window and decay, or with --sweep the candidate with the best held-out top-1
    (each candidate's 3D atoms and calibrated bandwidth are made and dropped in turn)."""
    if not options.sweep:
        return Centroid(options.resolved_window(), options.resolved_decay(), None)

    def evaluate(window: int | None, decay: float) -> Evaluated:
        atoms = atom_rows(options, labelled, projected.positions, window, decay)
        queries = holdout_queries(labelled, projected.positions, window, decay)
        fitted = fit_3d(options, atoms, queries, labelled, loaded.vocab_size)
        return Evaluated(window, decay, int(len(atoms.token_ids)), fitted.calibration)

    with ui.bar("centroid sweep", len(CANDIDATES), "cand") as advance:
        best, rows = sweep(CANDIDATES, evaluate, advance)
    ui.step(f"sweep chose window={best.window or 'all'}, decay={best.decay} "
            f"(held-out top-1 {best.calibration['top1']:.3f})")
    return Centroid(best.window, best.decay, rows)


# --- make_atoms ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Atoms:
    """The atoms to ingest, their held-out 3D queries, and how many positions they came from."""

    centroid: Centroid
    rows: AtomRows
    queries: np.ndarray
    before_merge: int


def make_atoms(options: BuildOptions, loaded: Loaded, projected: Projected, labelled: Labelled,
               centroid: Centroid, ui: Reporter) -> Atoms:
    window, decay = centroid.window, centroid.decay
    ui.step(f"building {options.kind} atoms (window={window or 'all'}, decay={decay})")
    rows = atom_rows(options, labelled, projected.positions, window, decay,
                     loaded.embeddings if options.full_keys else None)
    before = sum(len(c) - 1 for c in labelled.train_chunks) if options.kind == "context" else loaded.vocab_size
    return Atoms(centroid, rows, holdout_queries(labelled, projected.positions, window, decay), int(before))


# --- calibrate -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibrated:
    """stats['bandwidth'] (the set's h and its held-out scores) and, with full keys, the keys' own."""

    calibration: dict
    keys: dict | None

    @property
    def bandwidth(self) -> float:
        return float(self.calibration["h"])


def key_calibration(options: BuildOptions, loaded: Loaded, labelled: Labelled, atoms: Atoms) -> dict:
    """Calibrate h for KNN on the full-dimensional keys (the pgvector baseline), on a seeded
    sample of at most KEY_CALIBRATION_QUERIES held-out positions."""
    queries = holdout_queries(labelled, loaded.embeddings, atoms.centroid.window, atoms.centroid.decay, np.float32)
    rng = np.random.default_rng(options.seed)
    pick = np.sort(rng.choice(len(queries), size=min(KEY_CALIBRATION_QUERIES, len(queries)), replace=False))
    return cal.fit(atoms.rows.keys, atoms.rows.token_ids, atoms.rows.weights, queries[pick],
                   labelled.holdout_targets[pick], options.kernel, options.max_neighbors, loaded.vocab_size,
                   options.bandwidth_objective).calibration


def calibrate(options: BuildOptions, loaded: Loaded, labelled: Labelled, atoms: Atoms, ui: Reporter) -> Calibrated:
    """The bandwidth that best predicts the held-out argmax (--bandwidth: keep the curve, score
    the given h), and with --full-keys the bandwidth of the full-dimensional keys."""
    fitted = fit_3d(options, atoms.rows, atoms.queries, labelled, loaded.vocab_size)
    calibration = fitted.calibration
    if options.bandwidth is not None:
        calibration = cal.with_given_bandwidth(fitted, labelled.holdout_targets, options.bandwidth, options.kernel,
                                               loaded.vocab_size)
    ui.step(f"bandwidth h={float(calibration['h']):.4g}: held-out top-1 {calibration['top1']:.3f}, "
            f"log-likelihood {calibration['log_likelihood']:.3f}, coverage {calibration['coverage']:.3f}")
    keys = None
    if options.full_keys:
        ui.step("calibrating the bandwidth of the full-dimensional keys (pgvector baseline)")
        keys = key_calibration(options, loaded, labelled, atoms)
    return Calibrated(calibration, keys)


# --- stats and ingest ----------------------------------------------------------------------

def collect_stats(options: BuildOptions, loaded: Loaded, projected: Projected, labelled: Labelled,
                  atoms: Atoms, calibrated: Calibrated) -> BuildStats:
    """atom_sets.stats of the build (the ingest adds its own timings under `ingest`)."""
    texts, is_context = loaded.texts, options.kind == "context"
    train_tokens = int(sum(map(len, labelled.train_chunks)))
    return BuildStats(
        projection=projected.quality,
        bandwidth=calibrated.calibration,
        centroid_sweep=atoms.centroid.sweep,
        corpus=CorpusStats(source=texts.corpus.description, text=texts.train_text if is_context else None,
                           files=[str(p) for p in options.corpus], train_tokens=train_tokens,
                           train_segments=texts.corpus.train_segments, max_tokens=options.max_tokens,
                           context_length=options.context_length, seed=options.seed,
                           python=platform.python_version()),
        holdout=HoldoutStats(source=f"{texts.corpus.description}: seeded holdout ({texts.corpus.holdout_segments} "
                                    f"segments, seed {options.seed}), never used for atoms",
                             text=texts.corpus.holdout_text, chars=len(texts.corpus.holdout_text),
                             tokens=int(sum(map(len, texts.holdout_chunks))), context_length=options.context_length),
        distill=DistillStats(target=options.target if is_context else None, tokens=labelled.forced.tokens,
                             seconds=labelled.forced.seconds, tokens_per_second=labelled.forced.tokens_per_second,
                             device=labelled.device, batch_tokens=options.batch_tokens),
        atoms=AtomStats(count=int(len(atoms.rows.token_ids)), before_merge=atoms.before_merge,
                        merge_radius=options.merge_radius if is_context else None, full_keys=options.full_keys),
        key_bandwidth=calibrated.keys["h"] if calibrated.keys is not None else None,
        key_calibration=calibrated.keys,
    )


def token_texts(tokenizer, vocab_size: int) -> list[str | None]:
    """Decoded text of every token id (None beyond the tokenizer's vocabulary)."""
    known = min(len(tokenizer), vocab_size)
    texts: list[str | None] = list(tokenizer.batch_decode([[i] for i in range(known)]))
    return texts + [None] * (vocab_size - known)


def ingest(conn, options: BuildOptions, loaded: Loaded, projected: Projected, atoms: Atoms,
           calibrated: Calibrated, stats: BuildStats, ui: Reporter) -> IngestReport:
    """Write the set (its row, tokens, landmarks, atoms) in one transaction; the only write."""
    fitted, positions, embeddings = projected.fitted, projected.positions, loaded.embeddings
    params = fitted.params(landmark_method=options.landmark_method if options.projection == "lmds" else None,
                           seed=options.seed,
                           landmark_token_ids=None if fitted.landmark_idx is None else fitted.landmark_idx.tolist())
    spec = AtomSetSpec(options.name, loaded.model_name, loaded.vocab_size, loaded.dim, options.projection,
                       options.kind, params, atoms.centroid.window, atoms.centroid.decay, options.kernel,
                       calibrated.bandwidth, stats, options.make_default, model_key=options.model)
    tokens = TokenRows(np.arange(loaded.vocab_size), token_texts(loaded.tokenizer, loaded.vocab_size), positions,
                       embeddings)
    landmarks = None
    if fitted.landmark_idx is not None:
        landmarks = LandmarkRows(embeddings[fitted.landmark_idx], positions[fitted.landmark_idx])
    ui.step(f"ingesting {len(atoms.rows.token_ids):,} atoms")
    report = write_atom_set(conn, spec, tokens, atoms.rows, landmarks, replace=options.replace, progress=ui.step)
    ui.step(f"ingest: {report.atoms:,} atoms in {report.total_seconds:.1f}s ({report.atoms_per_second:,.0f} atoms/s)")
    return report
