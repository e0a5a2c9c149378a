"""The stages of a build, each a function from the earlier stages' frozen results to its own.

    load -> project -> label [-> self_distill] -> choose_centroid [-> learn_positions] -> make_atoms -> calibrate
         -> calibrate_history
         [-> random_positions] -> (stats) -> ingest [control first, then the set]

load       the model, its input embeddings, and the tokenized corpus: training chunks, and the
           holdout split in halves (hartonomous.splits): calibration chunks, test chunks
project    the embeddings to 3D (LMDS or PCA) and the projection's quality
label      teacher forcing: the exact model's argmax (and top-k for --target soft) at every
           training and calibration position (the test half is left to `compare`)
self_distill  with --self-distill N: the exact model continues prompts cut from the training
           tokens until it has written N tokens (hartonomous/corpus/self_distill.py); atoms on its words
choose_centroid  the centroid window/decay: the options' own, or the best of a calibration sweep
learn_positions  with --positions learned: the token positions (and the bandwidth, with --learn-decay
           the decay) trained from the projection's (projection/learned.py), validated on the calibration half
make_atoms token or context atoms (merged), the calibration queries, full-dimensional keys if asked
calibrate  the kernel bandwidth on the calibration half (or score a given one); the keys' too
calibrate_history  the history weight (projection/history.py) with h re-fitted, or a given one
random_positions   with --controls: the same atoms keyed with a seeded permutation of the token
           positions, calibrated the same way (its own h and history weight)
ingest     the database writes (hartonomous.atomset.write): one transaction per set

Everything the build tunes is tuned on the calibration half; the test half is only counted.
Nothing touches the database before `ingest`.
"""

from __future__ import annotations

import platform
from contextlib import nullcontext
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hartonomous.compare.labels import teacher_chunk_count
from hartonomous.errors import UserError
from hartonomous.corpus.teacher import Forced
from projection import calibrate as cal
from hartonomous.atomset.write import SELF_DISTILLED
from projection.atoms import (concat_atoms, context_atoms, context_keys, context_values, continuation_atoms,
                              merge_atoms, soft_context_atoms, token_atoms)
from hartonomous.corpus.sources import Corpus, load_corpus
from hartonomous.corpus.origin import origin_stats
from projection.distill import chunk_ids, distill, tokenize
from hartonomous.atomset import (AtomRows, AtomSetSpec, AtomStats, BuildStats, ControlStats, CorpusStats,
                                 DistillStats, HoldoutStats, IngestReport, LandmarkRows, SplitStats, TokenRows,
                                 drop_atom_set, write_atom_set)
from projection import learned as learning
from projection.lattice import Lattice, lattice_positions
from hartonomous.atomset.record import LearnedPositionsStats
from projection.history import (CRITERION_DEFINITIONS, HISTORY_GRID, TOP1_TOLERANCE, choose_history_weight,
                                history_pairs)
from projection.options import BuildOptions
from projection.progress import Reporter
from projection.project import FittedProjection, fit_projection
from projection.quality import projection_quality
from projection.reproducibility import reproducibility
from hartonomous.corpus.self_distill import Distilled, self_distill as run_self_distill
from projection.sweep import CANDIDATES, Evaluated, sweep

KEY_CALIBRATION_QUERIES = 1000


# --- load ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Texts:
    """The tokenized corpus of a build: training chunks (context sets only) and the holdout's
    halves, each cut into chunks (hartonomous.splits: calibration tunes, test is for `compare`)."""

    corpus: Corpus
    train_ids: np.ndarray
    train_text: str
    train_chunks: list[np.ndarray]
    calibration_text: str
    calibration_chunks: list[np.ndarray]
    test_text: str
    test_chunks: list[np.ndarray]


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


def load_texts(options: BuildOptions, tokenizer, ui: Reporter | None = None) -> Texts:
    """The corpus (hartonomous.corpus.sources: --corpus, --include, --exclude) tokenized: the holdout's
    calibration and test halves as the corpus gives them (one line says how many files --exclude left
    out), and for context sets the training tokens cut at --max-tokens (a streamed corpus's documents
    are read and tokenized only as they are taken, under a progress bar in tokens), each cut into
    chunks of --context-length. A streamed corpus keeps no training text, so `train_text` is then empty
    (stats.corpus records where the text came from)."""
    from hartonomous.corpus.sources import TrainingTokens, training_tokens

    is_context = options.kind == "context"
    corpus = load_corpus(options.corpus, options.max_tokens, options.holdout_chars, options.seed, train=is_context,
                         include=options.include, exclude=options.exclude)
    if options.exclude and corpus.stream is not None:
        (ui or Reporter()).step(f"--exclude {' '.join(options.exclude)}: {corpus.stream.excluded:,} files left out "
                                f"of the corpus, {corpus.stream.listed:,} listed")
    calibration_chunks = chunk_ids(tokenize(tokenizer, corpus.calibration_text)[0], options.context_length)
    test_chunks = chunk_ids(tokenize(tokenizer, corpus.test_text)[0], options.context_length)
    train = TrainingTokens(np.zeros(0, dtype=np.int64), "")
    if is_context:
        with (ui or Reporter()).bar("training tokens", options.max_tokens, "tok") as advance:
            train = training_tokens(corpus, tokenizer, options.max_tokens, advance)
    train_chunks = chunk_ids(train.ids, options.context_length)
    if is_context and not train_chunks:
        raise UserError("the corpus left no training text after the holdout; pass more text with --corpus")
    if not calibration_chunks or not test_chunks:
        raise UserError("the holdout is too short to split into calibration and test halves; pass more text "
                        "with --corpus or raise --holdout-chars")
    return Texts(corpus, train.ids, train.text or "", train_chunks, corpus.calibration_text, calibration_chunks,
                 corpus.test_text, test_chunks)


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
    return Loaded(model, tokenizer, model_name, embeddings, load_texts(options, tokenizer, ui))


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
    """The chunks the atoms and the calibration use, with the exact model's labels at each position.

    train_chunks is empty for token sets; train_argmax is set for --target argmax, train_top_ids
    and train_top_probs (the exact top-k) for --target soft. `forced` is the teacher-forcing pass.
    """

    train_chunks: list[np.ndarray]
    calibration_chunks: list[np.ndarray]
    train_argmax: list[np.ndarray] | None
    train_top_ids: list[np.ndarray] | None
    train_top_probs: list[np.ndarray] | None
    calibration_argmax: list[np.ndarray]
    forced: Forced
    device: str
    distilled: Distilled | None = None   # --self-distill: the model's own continuations

    @property
    def calibration_targets(self) -> np.ndarray:
        """The exact argmax at every calibration atom position: what the calibration predicts."""
        return context_values(self.calibration_chunks, self.calibration_argmax, "argmax")


def label(options: BuildOptions, loaded: Loaded, ui: Reporter) -> Labelled:
    texts = loaded.texts
    train_chunks = texts.train_chunks if options.kind == "context" else []
    train_labelled = train_chunks if options.target in ("argmax", "soft") else []
    if options.target == "mixed":
        train_labelled = train_chunks[:teacher_chunk_count(train_chunks, options.teacher_tokens)]
    label_chunks = train_labelled + texts.calibration_chunks
    top_k = options.soft_k if options.target in ("soft", "mixed") and train_labelled else 0
    ui.step(f"corpus: {texts.corpus.description}; {sum(map(len, train_chunks))} training tokens, "
            f"{sum(map(len, texts.calibration_chunks))} calibration + {sum(map(len, texts.test_chunks))} "
            "test held-out tokens")
    with ui.bar("teacher forcing", int(sum(map(len, label_chunks))), "tok") as advance:
        forced = distill(loaded.model, label_chunks, options.batch_tokens, advance, top_k=top_k,
                         cache_dir=options.teacher_cache)
    rate = forced.tokens_per_second
    ui.step(f"forward pass: {forced.tokens} tokens in {forced.seconds:.1f}s ("
            + (f"{rate:,.0f} tokens/s over {forced.tokens - forced.cached_tokens} run" if rate is not None else
               "none run")
            + (f"; {forced.cached_tokens} from the teacher-label cache" if forced.cached_tokens else "") + ")")
    n = len(train_labelled)
    return Labelled(train_chunks, texts.calibration_chunks,
                    forced.argmax[:n] if options.target == "argmax" else None,
                    forced.top_ids[:n] if top_k else None, forced.top_probs[:n] if top_k else None,
                    forced.argmax[n:], forced, str(next(loaded.model.parameters()).device))


def self_distill(options: BuildOptions, loaded: Loaded, labelled: Labelled, ui: Reporter) -> Labelled:
    """`labelled` with the model's own continuations (--self-distill N), or as it is."""
    if not options.self_distill:
        return labelled
    eos = {int(t) for t in (loaded.tokenizer.eos_token_id, loaded.model.generation_config.eos_token_id)
           if isinstance(t, int)}
    with ui.bar("self-distilling (the model writes)", options.self_distill, "tok") as advance:
        distilled = run_self_distill(loaded.model, loaded.texts.train_ids, options.self_distill, seed=options.seed,
                                     eos_token_ids=eos, advance=advance, cache_dir=options.teacher_cache,
                                     temperature=options.self_distill_temperature)
    stats = distilled.stats()
    ui.step(f"self-distilled: {stats['tokens']:,} tokens in {stats['sequences']} continuations "
            f"({stats['greedy_sequences']} greedy, {stats['sampled_sequences']} sampled) in {distilled.seconds:.1f}s"
            + (f"; {distilled.cached_batches} batches from the cache" if distilled.cached_batches else ""))
    return replace(labelled, distilled=distilled)


# --- choose_centroid -----------------------------------------------------------------------

@dataclass(frozen=True)
class Centroid:
    """The context-centroid window and decay of the set; the sweep's rows when one chose them."""

    window: int | None
    decay: float
    sweep: list[dict] | None


def atom_rows(options: BuildOptions, labelled: Labelled, positions: np.ndarray, window: int | None,
              decay: float, full: np.ndarray | None = None, advance: Callable[[int], None] | None = None) -> AtomRows:
    """The set's atoms for one (window, decay); full-dimensional keys from `full` when given;
    `advance(1)` after each chunk keyed (atom_chunks counts them)."""
    if options.kind != "context":
        return token_atoms(positions, full)
    parts = [] if options.self_distill_only else [corpus_atom_rows(options, labelled, positions, window, decay, full,
                                                                         advance)]
    if labelled.distilled is not None:
        parts.append(continuation_atoms(labelled.distilled.sequences, labelled.distilled.prompt_tokens, positions,
                                        window, decay, full, advance))
    return merge_atoms(parts[0] if len(parts) == 1 else concat_atoms(parts), options.merge_radius)


def corpus_atom_rows(options: BuildOptions, labelled: Labelled, positions: np.ndarray, window: int | None,
                     decay: float, full: np.ndarray | None = None,
                     advance: Callable[[int], None] | None = None) -> AtomRows:
    """The context atoms of the training chunks by --target (before merging)."""
    if options.target == "soft":
        raw = soft_context_atoms(labelled.train_chunks, labelled.train_top_ids, labelled.train_top_probs, positions,
                                 window, decay, full, advance)
    elif options.target == "mixed":   # soft atoms on the teacher's chunks, corpus atoms on the rest
        n = len(labelled.train_top_ids or [])
        parts = [soft_context_atoms(labelled.train_chunks[:n], labelled.train_top_ids, labelled.train_top_probs,
                                    positions, window, decay, full, advance)] if n else []
        if n < len(labelled.train_chunks):
            parts.append(context_atoms(labelled.train_chunks[n:], None, positions, window, decay, "corpus", full,
                                       advance))
        raw = concat_atoms(parts)
    else:
        raw = context_atoms(labelled.train_chunks, labelled.train_argmax, positions, window, decay, options.target,
                            full, advance)
    return raw


def atom_chunks(options: BuildOptions, labelled: Labelled) -> int:
    """How many chunks (training chunks and self-distilled sequences) atom_rows keys."""
    corpus = 0 if options.self_distill_only or options.kind != "context" else len(labelled.train_chunks)
    return corpus + (len(labelled.distilled.sequences) if labelled.distilled is not None else 0)


def calibration_queries(labelled: Labelled, vectors: np.ndarray, window: int | None, decay: float,
                        dtype=np.float64) -> np.ndarray:
    """The context centroid of every calibration atom position (row i predicts calibration_targets[i])."""
    return context_keys(labelled.calibration_chunks, vectors, window, decay, dtype)


def fit_3d(options: BuildOptions, atoms: AtomRows, queries: np.ndarray, labelled: Labelled,
           vocab_size: int, decay: float) -> cal.Fit:
    return cal.fit(atoms.positions, atoms.token_ids, atoms.weights, queries, labelled.calibration_targets,
                   options.kernel, options.max_neighbors, vocab_size, options.bandwidth_objective, decay=decay)


def choose_centroid(options: BuildOptions, loaded: Loaded, projected: Projected, labelled: Labelled,
                    ui: Reporter) -> Centroid:
    """The options' window and decay, or with --sweep the candidate with the best calibration top-1
    (each candidate's 3D atoms and calibrated bandwidth are made and dropped in turn)."""
    if not options.sweep:
        return Centroid(options.resolved_window(), options.resolved_decay(loaded.vocab_size), None)

    def evaluate(window: int | None, decay: float) -> Evaluated:
        atoms = atom_rows(options, labelled, projected.positions, window, decay)
        queries = calibration_queries(labelled, projected.positions, window, decay)
        fitted = fit_3d(options, atoms, queries, labelled, loaded.vocab_size, decay)
        return Evaluated(window, decay, int(len(atoms.token_ids)), fitted.calibration)

    with ui.bar("centroid sweep", len(CANDIDATES), "cand") as advance:
        best, rows = sweep(CANDIDATES, evaluate, advance)
    ui.step(f"sweep chose window={best.window or 'all'}, decay={best.decay} "
            f"(calibration top-1 {best.calibration['top1']:.3f})")
    return Centroid(best.window, best.decay, rows)


# --- place_on_lattice ----------------------------------------------------------------------

def place_on_lattice(options: BuildOptions, loaded: Loaded, projected: Projected, ui: Reporter) -> Lattice:
    """With --positions lattice: one lattice cell per token, along Hilbert curves through the projection
    (projection/lattice.py), for deep keys whose distance order is longest-suffix order."""
    lattice = lattice_positions(projected.positions)
    ui.step(f"lattice positions: {loaded.vocab_size:,} tokens on a {lattice.side}^3 lattice, contraction "
            f"{lattice.decay:g} per token back")
    return lattice


# --- learn_positions -----------------------------------------------------------------------

@dataclass(frozen=True)
class LearnedPositions:
    """The trained token positions and the centroid they go with (the decay may be learned)."""

    positions: np.ndarray
    centroid: Centroid
    stats: LearnedPositionsStats


def learn_positions(options: BuildOptions, loaded: Loaded, projected: Projected, labelled: Labelled,
                    centroid: Centroid, ui: Reporter) -> LearnedPositions:
    """Train every token's position from the projection's against the exact model's labels
    (projection/learned.py); validated and early-stopped on the calibration half."""
    if options.target == "soft":
        ids, probs = labelled.train_top_ids, labelled.train_top_probs
    elif options.target == "argmax":
        ids, probs = labelled.train_argmax, None
    else:
        ids, probs = [np.r_[c[1:], 0] for c in labelled.train_chunks], None
    contexts = learning.distinct_contexts(labelled.train_chunks, ids, probs, centroid.window, loaded.vocab_size)
    # early stopping ranks epochs the way the build chooses its final (history weight, h): --calibrate-by
    objective = "top1" if options.calibrate_by == "top1" else options.bandwidth_objective
    validation = learning.Validation(labelled.calibration_chunks, labelled.calibration_targets, options.kernel,
                                     options.max_neighbors, objective, history_window=options.history_window,
                                     history_weight=options.history_weight, criterion=options.calibrate_by,
                                     bandwidth_objective=options.bandwidth_objective,
                                     atoms=lambda p, d: atom_rows(options, labelled, p, centroid.window, d))
    settings = learning.Settings(centroid.window, centroid.decay, options.epochs, options.learning_rate,
                                 learn_decay=options.learn_decay, seed=options.seed, keep=options.keep_epoch)
    ui.step(f"learning positions: {contexts.count:,} distinct training contexts, up to {options.epochs} epochs "
            f"(learning rate {options.learning_rate:g}{', decay learned' if options.learn_decay else ''})")
    with ui.bar("learning positions", options.epochs, "epoch") as advance:
        result = learning.learn(projected.positions, contexts, validation, settings, loaded.embeddings, advance,
                                ui.step)
    ui.step(f"kept epoch {result.best_epoch} of {len(result.curve) - 1} ({result.seconds:.1f}s"
            + (", stopped early" if result.stopped_early else "") + f"); decay {result.decay:.4g}")
    stats = LearnedPositionsStats(
        epochs=options.epochs, learning_rate=options.learning_rate, best_epoch=result.best_epoch,
        stopped_early=result.stopped_early, seconds=result.seconds, split="calibration", contexts=result.contexts,
        curve=result.curve, displacement=result.displacement, objective=objective,
        learn_decay=options.learn_decay, initial_decay=centroid.decay, decay=result.decay,
        trained_bandwidth=result.bandwidth, trained_tokens=result.trained_tokens,
        carried_tokens=result.carried_tokens, neighbours=settings.neighbours,
        regularisation=settings.regularisation, patience=settings.patience, initialised_from=options.projection,
        keep_epoch=options.keep_epoch)
    return LearnedPositions(result.positions, Centroid(centroid.window, result.decay, centroid.sweep), stats)


# --- make_atoms ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Atoms:
    """The atoms to ingest, their calibration 3D queries, and how many atoms they came from
    before merging (positions x k for soft atoms)."""

    centroid: Centroid
    rows: AtomRows
    queries: np.ndarray
    before_merge: int


def make_atoms(options: BuildOptions, loaded: Loaded, positions: np.ndarray, labelled: Labelled,
               centroid: Centroid, ui: Reporter, full_keys: bool | None = None) -> Atoms:
    """The set's atoms keyed with `positions` (the projection's, or a control's); full keys with
    --full-keys unless `full_keys` says otherwise."""
    window, decay = centroid.window, centroid.decay
    full_keys = options.full_keys if full_keys is None else full_keys
    ui.step(f"building {options.kind} atoms (target={options.target if options.kind == 'context' else 'token'}, "
            f"window={window or 'all'}, decay={decay})")
    chunks = atom_chunks(options, labelled)      # 0 for token sets: one atom per token, nothing to key
    with (ui.bar("keying atoms", chunks, "chunk") if chunks else nullcontext(lambda _n=1: None)) as advance:
        rows = atom_rows(options, labelled, positions, window, decay, loaded.embeddings if full_keys else None,
                         advance)
    if options.kind != "context":
        before = loaded.vocab_size
    elif options.target in ("soft", "mixed"):
        taught = len(labelled.train_top_ids or [])
        before = sum(int((p[:-1] > 0).sum()) for p in labelled.train_top_probs or []) + \
            sum(len(c) - 1 for c in labelled.train_chunks[taught:])
    else:
        before = sum(len(c) - 1 for c in labelled.train_chunks)
    if options.self_distill_only:
        before = 0
    if labelled.distilled is not None:
        before += labelled.distilled.generated
    return Atoms(centroid, rows, calibration_queries(labelled, positions, window, decay), int(before))


# --- calibrate -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Calibrated:
    """The stored atoms' bandwidth calibration on the calibration half (no history atoms), the
    neighbours it used, and with full keys the keys' own calibration."""

    calibration: dict
    keys: dict | None
    neighbours: cal.Neighbours

    @property
    def bandwidth(self) -> float:
        return float(self.calibration["h"])


def key_calibration(options: BuildOptions, loaded: Loaded, labelled: Labelled, atoms: Atoms) -> dict:
    """Calibrate h for KNN on the full-dimensional keys (the pgvector baseline), on a seeded
    sample of at most KEY_CALIBRATION_QUERIES calibration positions."""
    queries = calibration_queries(labelled, loaded.embeddings, atoms.centroid.window, atoms.centroid.decay, np.float32)
    rng = np.random.default_rng(options.seed)
    pick = np.sort(rng.choice(len(queries), size=min(KEY_CALIBRATION_QUERIES, len(queries)), replace=False))
    return cal.fit(atoms.rows.keys, atoms.rows.token_ids, atoms.rows.weights, queries[pick],
                   labelled.calibration_targets[pick], options.kernel, options.max_neighbors, loaded.vocab_size,
                   options.bandwidth_objective).calibration


def calibrate(options: BuildOptions, loaded: Loaded, labelled: Labelled, atoms: Atoms, ui: Reporter) -> Calibrated:
    """The bandwidth that best predicts the calibration half's exact argmax from the stored atoms
    (--bandwidth: keep the curve, score the given h), and with --full-keys the bandwidth of the
    full-dimensional keys."""
    fitted = fit_3d(options, atoms.rows, atoms.queries, labelled, loaded.vocab_size, atoms.centroid.decay)
    calibration = fitted.calibration
    if options.bandwidth is not None:
        calibration = cal.with_given_bandwidth(fitted, labelled.calibration_targets, options.bandwidth,
                                               options.kernel, loaded.vocab_size)
    ui.step(f"bandwidth h={float(calibration['h']):.4g} (stored atoms): calibration top-1 {calibration['top1']:.3f}, "
            f"log-likelihood {calibration['log_likelihood']:.3f}, coverage {calibration['coverage']:.3f}")
    keys = None
    if options.full_keys and atoms.rows.keys is not None:
        ui.step("calibrating the bandwidth of the full-dimensional keys (pgvector baseline)")
        keys = key_calibration(options, loaded, labelled, atoms)
    return Calibrated(calibration, keys, fitted.neighbours)


# --- calibrate_history ---------------------------------------------------------------------

@dataclass(frozen=True)
class History:
    """The set's history weight and window, its bandwidth with them, and stats['history'].

    `calibration` is the record of the set's final (h, history weight): what stats['bandwidth']
    holds; with weight 0 it is the stored-only calibration.
    """

    weight: float
    window: int
    calibration: dict
    record: dict

    @property
    def bandwidth(self) -> float:
        return float(self.calibration["h"])


def calibrate_history(options: BuildOptions, loaded: Loaded, positions: np.ndarray, labelled: Labelled,
                      atoms: Atoms, calibrated: Calibrated, ui: Reporter) -> History:
    """Choose the history weight and its bandwidth on the calibration half (projection/history.py,
    by --calibrate-by): the grid with h re-fitted at each weight, or --history-weight's value
    scored (the criterion then picks its h); off (0) for token sets unless --history-weight is
    given, and whenever --history-window is 0."""
    window = options.history_window
    fixed = options.history_weight
    criterion = options.calibrate_by
    if fixed is None and options.kind != "context":
        fixed = 0.0
    off = window == 0 or fixed == 0
    if off and (criterion == "loglik" or options.bandwidth is not None):
        record = {"weight": 0.0, "window": window, "calibrated": False, "split": "calibration",
                  "criterion": criterion}
        return History(0.0, window, {**calibrated.calibration, "history_weight": 0.0}, record)
    if off:
        pairs, grid, only = None, (0.0,), 0.0
        ui.step("history atoms off; choosing the stored atoms' h by calibration top-1")
    else:
        pairs = history_pairs(labelled.calibration_chunks, positions, atoms.centroid.window, atoms.centroid.decay,
                              window)
        grid, only = ((0.0, fixed), fixed) if fixed is not None else (HISTORY_GRID, None)
        ui.step(f"history atoms: {len(pairs.query):,} (position, history atom) pairs on the calibration half; "
                + (f"scoring --history-weight {fixed}" if fixed is not None else "choosing the history weight")
                + f" (criterion: {criterion})")
    with ui.bar("history weight grid (h re-fitted at each)", len(grid), "weight") as advance:
        choice = choose_history_weight(calibrated.neighbours, calibrated.calibration, pairs,
                                       labelled.calibration_targets, options.kernel, loaded.vocab_size,
                                       options.bandwidth_objective, grid=grid, bandwidth=options.bandwidth,
                                       criterion=criterion, only=only, advance=advance)
    final = choice.final
    for row in choice.grid:
        ui.step(f"  history weight {row['history_weight']:g}: h={row['h']:.4g}, top-1 {row['top1']:.3f}, "
                f"log-likelihood {row['log_likelihood']:.3f}")
    ui.step(f"history weight {choice.weight:g} (window {window}), h={float(final['h']):.4g}: calibration top-1 "
            f"{final['top1']:.3f}, log-likelihood {final['log_likelihood']:.3f}")
    record = {"weight": choice.weight, "window": window, "calibrated": fixed is None, "split": "calibration",
              "criterion": criterion, "criterion_definition": CRITERION_DEFINITIONS[criterion],
              "objective": options.bandwidth_objective, "pairs": int(len(pairs.query)) if pairs else 0,
              "grid": choice.grid,
              "bandwidth_refit": "given --bandwidth" if options.bandwidth is not None else
              "re-calibrated at every weight (grid of 2^(k/4), k = -16..16, around the stored-only h, refined)"}
    if criterion == "top1":
        record["top1_tolerance"] = TOP1_TOLERANCE
        record["candidates"] = choice.candidates
    return History(choice.weight, window, final, record)


# --- random_positions (the control) --------------------------------------------------------

@dataclass(frozen=True)
class Control:
    """The random-positions control: the same labels keyed with permuted token positions, and
    calibrated the same way (its own bandwidth and history weight)."""

    name: str
    positions: np.ndarray
    permutation_seed: int
    atoms: Atoms
    calibrated: Calibrated
    history: History


def random_token_positions(positions: np.ndarray, seed: int) -> np.ndarray:
    """A seeded permutation of the token positions: the same 3D point cloud (so the same scale,
    density and kernel geometry), with every token sent to another token's point."""
    return np.asarray(positions)[np.random.default_rng(seed).permutation(len(positions))]


def random_positions(options: BuildOptions, loaded: Loaded, projected: Projected, labelled: Labelled,
                     centroid: Centroid, ui: Reporter, placed: np.ndarray | None = None) -> Control:
    """The control set `<name>.random-positions`: does the projection carry information? The
    projection's positions are permuted, or `placed` ones (the lattice's cells) when given."""
    ui.step(f"control '{options.random_positions_name}': the same atoms at randomly permuted token positions")
    seed = options.seed + 1  # not the projection's own seed, so the permutation is not tied to its landmarks
    positions = random_token_positions(projected.positions if placed is None else placed, seed)
    atoms = make_atoms(options, loaded, positions, labelled, centroid, ui, full_keys=False)
    calibrated = calibrate(options, loaded, labelled, atoms, ui)
    history = calibrate_history(options, loaded, positions, labelled, atoms, calibrated, ui)
    return Control(options.random_positions_name, positions, seed, atoms, calibrated, history)


# --- stats and ingest ----------------------------------------------------------------------

def split_stats(chunks: list[np.ndarray], text: str) -> SplitStats:
    """A holdout half: characters, tokens, and atom positions (predictions) in its chunks."""
    return SplitStats(chars=len(text), tokens=int(sum(map(len, chunks))), positions=int(sum(len(c) - 1 for c in chunks)))


def collect_stats(options: BuildOptions, loaded: Loaded, projected: Projected, labelled: Labelled,
                  atoms: Atoms, calibrated: Calibrated, history: History, control: Control | None = None,
                  learned: LearnedPositions | None = None) -> BuildStats:
    """atom_sets.stats of the build (the ingest adds its own timings under `ingest`)."""
    texts, is_context = loaded.texts, options.kind == "context"
    train_tokens = int(sum(map(len, labelled.train_chunks)))
    origin = origin_stats(options.corpus, texts.corpus)
    pieces = "documents" if origin.get("split") == "documents" else "segments"
    return BuildStats(
        projection=projected.quality,
        bandwidth=history.calibration,
        centroid_sweep=atoms.centroid.sweep,
        corpus=CorpusStats(source=texts.corpus.description, **origin,
                           train_tokens=train_tokens, train_segments=texts.corpus.train_segments,
                           max_tokens=options.max_tokens, holdout_chars=options.holdout_chars,
                           context_length=options.context_length, seed=options.seed,
                           python=platform.python_version()),
        holdout=HoldoutStats(source=f"{texts.corpus.description}: seeded holdout ({texts.corpus.holdout_segments} "
                                    f"{pieces}, seed {options.seed}), never used for atoms",
                             text=texts.corpus.holdout_text, chars=len(texts.corpus.holdout_text),
                             tokens=int(sum(map(len, texts.calibration_chunks + texts.test_chunks))),
                             context_length=options.context_length),
        distill=DistillStats(target=options.target if is_context else None, tokens=labelled.forced.tokens,
                             seconds=labelled.forced.seconds, tokens_per_second=labelled.forced.tokens_per_second,
                             device=labelled.device, batch_tokens=options.batch_tokens,
                             cached_tokens=labelled.forced.cached_tokens,
                             soft_k=options.soft_k if is_context and options.target in ("soft", "mixed") else None,
                             teacher_tokens=(int(sum(map(len, labelled.train_chunks[:len(labelled.train_top_ids or [])])))
                                             if is_context and options.target == "mixed" else None)),
        atoms=AtomStats(count=int(len(atoms.rows.token_ids)), before_merge=atoms.before_merge,
                        merge_radius=options.merge_radius if is_context else None,
                        full_keys=atoms.rows.keys is not None),
        key_bandwidth=calibrated.keys["h"] if calibrated.keys is not None else None,
        key_calibration=calibrated.keys,
        calibration_split=split_stats(texts.calibration_chunks, texts.calibration_text),
        test_split=split_stats(texts.test_chunks, texts.test_text),
        history=history.record,
        controls=ControlStats(random_positions=control.name) if control is not None else None,
        learned_positions=learned.stats if learned is not None else None,
        reproducibility=reproducibility(labelled.forced, atoms.rows),
        self_distill=None if labelled.distilled is None else
        {**labelled.distilled.stats(), "only": options.self_distill_only,
         "atoms": None if atoms.rows.sources is None else int((atoms.rows.sources == SELF_DISTILLED).sum())},
    )


def control_stats(options: BuildOptions, loaded: Loaded, projected: Projected, labelled: Labelled,
                  control: Control) -> BuildStats:
    """The control's stats: its own atoms, bandwidth and history; what it is a control of."""
    stats = collect_stats(options, loaded, projected, labelled, control.atoms, control.calibrated, control.history)
    return stats.model_copy(update={"projection": None, "control_of": {
        "atom_set": options.name, "kind": "random_positions", "permutation_seed": control.permutation_seed,
        "positions": "a seeded permutation of the projected token positions"}})


def token_texts(tokenizer, vocab_size: int) -> list[str | None]:
    """Decoded text of every token id (None beyond the tokenizer's vocabulary)."""
    known = min(len(tokenizer), vocab_size)
    texts: list[str | None] = list(tokenizer.batch_decode([[i] for i in range(known)]))
    return texts + [None] * (vocab_size - known)


def _write(conn, options: BuildOptions, loaded: Loaded, spec: AtomSetSpec, positions: np.ndarray,
           landmarks: LandmarkRows | None, rows: AtomRows, ui: Reporter) -> IngestReport:
    tokens = TokenRows(np.arange(loaded.vocab_size), token_texts(loaded.tokenizer, loaded.vocab_size), positions,
                       loaded.embeddings)
    ui.step(f"ingesting {len(rows.token_ids):,} atoms into '{spec.name}'")
    report = write_atom_set(conn, spec, tokens, rows, landmarks, replace=options.replace, progress=ui.step,
                            bar=ui.bar)
    ui.step(f"ingest: {report.atoms:,} atoms in {report.total_seconds:.1f}s ({report.atoms_per_second:,.0f} atoms/s)")
    return report


def ingest(conn, options: BuildOptions, loaded: Loaded, projected: Projected, atoms: Atoms,
           history: History, stats: BuildStats, ui: Reporter,
           learned: LearnedPositions | None = None, risk_model=None, lattice: Lattice | None = None) -> IngestReport:
    """Write the set (its row, tokens, landmarks, atoms and risk predictor) in one transaction;
    learned and lattice positions are stored as projection 'learned' / 'lattice' without landmarks
    (they are no projection of the embeddings)."""
    fitted, positions, embeddings = projected.fitted, projected.positions, loaded.embeddings
    params = fitted.params(landmark_method=options.landmark_method if options.projection == "lmds" else None,
                           seed=options.seed,
                           landmark_token_ids=None if fitted.landmark_idx is None else fitted.landmark_idx.tolist())
    projection = options.projection
    if learned is not None:
        positions, projection, params = learned.positions, "learned", {**params, "initialised_from": projection}
    if lattice is not None:
        positions, projection = lattice.positions, "lattice"
        params = {**params, "placed_from": options.projection, "side": lattice.side,
                  "contraction": lattice.decay, "assignment": "Hilbert order of the projection -> Hilbert order of "
                  "the lattice's cells"}
    spec = AtomSetSpec(options.name, loaded.model_name, loaded.vocab_size, loaded.dim, projection,
                       options.kind, params, atoms.centroid.window, atoms.centroid.decay, options.kernel,
                       history.bandwidth, stats, options.make_default, model_key=options.model,
                       history_weight=history.weight, history_window=history.window, layout=options.layout,
                       risk_model=None if risk_model is None else risk_model.model_dump(mode="json"))
    landmarks = None
    if fitted.landmark_idx is not None and learned is None and lattice is None:
        landmarks = LandmarkRows(embeddings[fitted.landmark_idx], positions[fitted.landmark_idx])
    return _write(conn, options, loaded, spec, positions, landmarks, atoms.rows, ui)


def ingest_control(conn, options: BuildOptions, loaded: Loaded, control: Control, stats: BuildStats,
                   ui: Reporter) -> IngestReport:
    """Write the control set in its own transaction; never the default, no landmarks (its positions
    are not a projection of the embeddings)."""
    spec = AtomSetSpec(control.name, loaded.model_name, loaded.vocab_size, loaded.dim, "random-positions",
                       options.kind, {"control_of": options.name, "of_projection": options.projection,
                                      "permutation_seed": control.permutation_seed},
                       control.atoms.centroid.window, control.atoms.centroid.decay, options.kernel,
                       control.history.bandwidth, stats, False, model_key=options.model,
                       history_weight=control.history.weight, history_window=control.history.window,
                       layout=options.layout)
    return _write(conn, options, loaded, spec, control.positions, None, control.atoms.rows, ui)


def drop_control(conn, control: Control) -> None:
    """Remove a control whose main set failed to write (best effort: the main error is what matters)."""
    try:
        conn.rollback()
        drop_atom_set(conn, control.name)
    except Exception:  # noqa: BLE001 - the caller re-raises the original failure
        pass
