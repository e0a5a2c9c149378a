"""`hartonomous build`: model -> 3D projection -> token or context atoms -> bandwidth -> ingest.

Nothing is written to the database until the last step, which is one transaction
(hartonomous.atomset.write), so an interrupted build leaves nothing behind.
"""

from __future__ import annotations

import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hartonomous.centroid import validate as validate_centroid
from hartonomous.errors import UserError
from projection.atoms import context_atoms, context_keys, context_values, merge_atoms, token_atoms
from projection.calibrate import OBJECTIVES, calibrate_bandwidth, nearest_atoms, score
from hartonomous.corpus import Corpus, load_corpus
from projection.distill import chunk_ids, distill, tokenize
from hartonomous.atomset import (AtomRows, AtomSetSpec, BuildStats, LandmarkRows, TokenRows, atom_set_exists,
                                 write_atom_set)
from projection.progress import Reporter
from projection.project import fit_projection
from projection.quality import projection_quality
from projection.sweep import CANDIDATES, evaluate, sweep

# Chosen by centroid sweeps on SmolLM2 + the default corpus (docs/atoms.md): window 3 / decay
# 0.01 was at the top of held-out top-1 at both 20K and 100K training tokens ((2|4, 0.01) within
# 0.01); uniform or long windows were far worse.
DEFAULT_CONTEXT_WINDOW: int | None = 3
DEFAULT_CONTEXT_DECAY = 0.01
# Token atoms keep the original design's centroid: every context token, uniform weights.
DEFAULT_TOKEN_WINDOW: int | None = None
DEFAULT_TOKEN_DECAY = 1.0
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
KEEP = object()
KEY_CALIBRATION_QUERIES = 1000


@dataclass
class BuildOptions:
    """Everything `hartonomous build` takes; validated by `check`."""

    name: str
    kind: str = "context"
    model: str = "smollm2"
    corpus: list[Path] = field(default_factory=list)
    max_tokens: int = 100_000
    projection: str = "lmds"
    landmarks: int = 512
    landmark_method: str = "kmeans++"
    metric: str = "euclidean"
    window: int | None | object = KEEP  # KEEP = the kind's default; None = every token
    decay: float | None = None  # None = the kind's default
    target: str = "argmax"
    merge_radius: float = 0.0
    full_keys: bool = False
    kernel: str = "gaussian"
    bandwidth: float | None = None  # None = calibrate on the holdout
    bandwidth_objective: str = "log-likelihood"
    max_neighbors: int = 100
    sweep: bool = False
    context_length: int = 512
    batch_tokens: int = 4096
    holdout_chars: int | None = None
    seed: int = 0
    device: str = "cpu"
    replace: bool = False
    make_default: bool = False

    def resolved_window(self) -> int | None:
        if self.window is KEEP:
            return DEFAULT_CONTEXT_WINDOW if self.kind == "context" else DEFAULT_TOKEN_WINDOW
        return self.window  # type: ignore[return-value]

    def resolved_decay(self) -> float:
        if self.decay is None:
            return DEFAULT_CONTEXT_DECAY if self.kind == "context" else DEFAULT_TOKEN_DECAY
        return self.decay

    def check(self) -> None:
        if not NAME_PATTERN.match(self.name or ""):
            raise UserError(f"--name must be 1-63 letters, digits, '.', '_' or '-' (starting with a letter "
                            f"or digit), got '{self.name}'")
        if self.kind not in ("token", "context"):
            raise UserError(f"--kind must be 'token' or 'context', got '{self.kind}'")
        if self.max_tokens < 2:
            raise UserError(f"--max-tokens must be at least 2, got {self.max_tokens}")
        if self.target not in ("argmax", "corpus"):
            raise UserError(f"--target must be 'argmax' or 'corpus', got '{self.target}'")
        if self.kernel not in ("gaussian", "exponential"):
            raise UserError(f"--kernel must be 'gaussian' or 'exponential', got '{self.kernel}'")
        if self.bandwidth is not None and not (self.bandwidth > 0 and np.isfinite(self.bandwidth)):
            raise UserError(f"--bandwidth must be a positive number, got {self.bandwidth}")
        if self.bandwidth_objective not in OBJECTIVES:
            raise UserError(f"--bandwidth-objective must be one of {', '.join(OBJECTIVES)}, "
                            f"got '{self.bandwidth_objective}'")
        if not 1 <= self.max_neighbors <= 100_000:
            raise UserError(f"--max-neighbors must be between 1 and 100000, got {self.max_neighbors}")
        if self.merge_radius < 0 or not np.isfinite(self.merge_radius):
            raise UserError(f"--merge-radius must be >= 0, got {self.merge_radius}")
        if self.batch_tokens < 1:
            raise UserError(f"--batch-tokens must be positive, got {self.batch_tokens}")
        if self.holdout_chars is not None and self.holdout_chars < 1:
            raise UserError(f"--holdout-chars must be positive, got {self.holdout_chars}")
        for path in self.corpus:
            if not Path(path).is_file():
                raise UserError(f"corpus file '{path}' does not exist")
        try:
            validate_centroid(self.resolved_window(), self.resolved_decay())
        except ValueError as exc:
            raise UserError(f"--window/--decay: {exc}") from None


@dataclass
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
    stats: dict
    seconds: float


def token_texts(tokenizer, vocab_size: int) -> list[str | None]:
    """Decoded text of every token id (None beyond the tokenizer's vocabulary)."""
    known = min(len(tokenizer), vocab_size)
    texts: list[str | None] = list(tokenizer.batch_decode([[i] for i in range(known)]))
    return texts + [None] * (vocab_size - known)


@dataclass
class Texts:
    """The tokenized corpus of a build: training chunks (context sets only) and held-out chunks."""

    corpus: Corpus
    train_ids: np.ndarray
    train_text: str
    train_chunks: list[np.ndarray]
    holdout_chunks: list[np.ndarray]


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


def key_bandwidth(atoms: AtomRows, texts: Texts, embeddings: np.ndarray, window: int | None, decay: float,
                  targets: np.ndarray, options: BuildOptions) -> dict:
    """Calibrate h for KNN on the full-dimensional keys (the pgvector baseline), on a seeded
    sample of at most KEY_CALIBRATION_QUERIES held-out positions."""
    queries = context_keys(texts.holdout_chunks, embeddings, window, decay, np.float32)
    rng = np.random.default_rng(options.seed)
    pick = np.sort(rng.choice(len(queries), size=min(KEY_CALIBRATION_QUERIES, len(queries)), replace=False))
    nb = nearest_atoms(atoms.keys, atoms.token_ids, atoms.weights, queries[pick], options.max_neighbors)
    return calibrate_bandwidth(nb, targets[pick], options.kernel, len(embeddings), options.bandwidth_objective)


def build(conn, options: BuildOptions, model=None, tokenizer=None, reporter: Reporter | None = None) -> BuildResult:
    """Run a whole build; `model`/`tokenizer` default to loading `options.model`."""
    ui = reporter or Reporter()
    options.check()
    started = time.perf_counter()
    if not options.replace and atom_set_exists(conn, options.name):
        raise UserError(f"atom set '{options.name}' already exists; pass --replace or run "
                        f"`hartonomous atom-sets drop {options.name}`")
    conn.rollback()  # write_atom_set needs an idle connection: it runs its own transaction
    if model is None or tokenizer is None:
        from hartonomous.model import load_model, load_tokenizer, pick_device

        ui.step(f"loading model {options.model}")
        model = load_model(options.model, pick_device(options.device))
        tokenizer = load_tokenizer(options.model)
    model_name = getattr(model.config, "name_or_path", None) or options.model
    embeddings = model.get_input_embeddings().weight.detach().float().cpu().numpy()
    vocab_size, dim = embeddings.shape
    is_context = options.kind == "context"

    texts = load_texts(options, tokenizer)  # before the slow steps: bad --corpus fails fast
    ui.step(f"projecting {vocab_size} x {dim} embeddings to 3D ({options.projection}"
            + (f", {options.landmarks} {options.landmark_method} landmarks" if options.projection == "lmds" else "")
            + f", {options.metric})")
    fitted = fit_projection(embeddings, options.projection, options.landmarks, options.landmark_method,
                            options.metric, options.seed)
    quality = projection_quality(embeddings, fitted.positions, options.metric, seed=options.seed)
    quality["seconds"] = fitted.seconds
    ui.step(f"projection: trustworthiness {quality['trustworthiness']:.3f}, "
            f"recall@10 {quality['recall_at_10']:.3f} ({fitted.seconds:.1f}s)")

    train_chunks = texts.train_chunks if is_context else []
    label_chunks = (train_chunks if options.target == "argmax" else []) + texts.holdout_chunks
    ui.step(f"corpus: {texts.corpus.description}; {sum(map(len, train_chunks))} training tokens, "
            f"{sum(map(len, texts.holdout_chunks))} held-out tokens")
    with ui.bar("teacher forcing", int(sum(map(len, label_chunks))), "tok") as advance:
        labels = distill(model, label_chunks, options.batch_tokens, advance)
    ui.step(f"forward pass: {labels.tokens} tokens in {labels.seconds:.1f}s "
            f"({labels.tokens_per_second:,.0f} tokens/s)")
    holdout_argmax = labels.argmax[len(label_chunks) - len(texts.holdout_chunks):]
    train_argmax = labels.argmax[:len(train_chunks)] if options.target == "argmax" else None

    positions = fitted.positions
    full = embeddings if options.full_keys else None

    def make_atoms(window: int | None, decay: float) -> AtomRows:
        if not is_context:
            return token_atoms(positions, full)
        raw = context_atoms(train_chunks, train_argmax, positions, window, decay, options.target, full)
        return merge_atoms(raw, options.merge_radius)

    def make_queries(window: int | None, decay: float) -> np.ndarray:
        return context_keys(texts.holdout_chunks, positions, window, decay)

    targets = context_values(texts.holdout_chunks, holdout_argmax, "argmax")
    sweep_rows = None
    if options.sweep:
        with ui.bar("centroid sweep", len(CANDIDATES), "cand") as advance:
            chosen, sweep_rows = sweep(CANDIDATES, make_atoms, make_queries, targets, options.kernel,
                                       options.max_neighbors, vocab_size, advance, options.bandwidth_objective)
        ui.step(f"sweep chose window={chosen.window or 'all'}, decay={chosen.decay} "
                f"(held-out top-1 {chosen.calibration['top1']:.3f})")
    else:
        ui.step(f"building {options.kind} atoms (window={options.resolved_window() or 'all'}, "
                f"decay={options.resolved_decay()}) and calibrating the bandwidth")
        chosen = evaluate(options.resolved_window(), options.resolved_decay(), make_atoms, make_queries, targets,
                          options.kernel, options.max_neighbors, vocab_size, options.bandwidth_objective)
    window, decay, atoms, calibration = chosen.window, chosen.decay, chosen.atoms, chosen.calibration
    if options.bandwidth is not None:  # keep the calibration curve, score the given bandwidth
        given = score(chosen.neighbours, targets, options.bandwidth, options.kernel, vocab_size)
        calibration = {**calibration, "calibrated_h": calibration["h"], "h": options.bandwidth, "given": True,
                       "log_likelihood": given.log_likelihood, "top1": given.top1}
    bandwidth = float(calibration["h"])
    ui.step(f"bandwidth h={bandwidth:.4g}: held-out top-1 {calibration['top1']:.3f}, "
            f"log-likelihood {calibration['log_likelihood']:.3f}, coverage {calibration['coverage']:.3f}")
    stats = {
        "projection": quality,
        "bandwidth": calibration,
        "centroid_sweep": sweep_rows,
        "corpus": {"source": texts.corpus.description, "text": texts.train_text if is_context else None,
                   "files": [str(p) for p in options.corpus], "train_tokens": int(sum(map(len, train_chunks))),
                   "train_segments": texts.corpus.train_segments, "max_tokens": options.max_tokens,
                   "context_length": options.context_length, "seed": options.seed,
                   "python": platform.python_version()},
        "holdout": {"source": f"{texts.corpus.description}: seeded holdout ({texts.corpus.holdout_segments} "
                              f"segments, seed {options.seed}), never used for atoms",
                    "text": texts.corpus.holdout_text, "chars": len(texts.corpus.holdout_text),
                    "tokens": int(sum(map(len, texts.holdout_chunks))), "context_length": options.context_length},
        "distill": {"target": options.target if is_context else None, "tokens": labels.tokens,
                    "seconds": labels.seconds, "tokens_per_second": labels.tokens_per_second,
                    "device": str(next(model.parameters()).device), "batch_tokens": options.batch_tokens},
        "atoms": {"count": int(len(atoms.token_ids)),
                  "before_merge": int(sum(len(c) - 1 for c in train_chunks)) if is_context else vocab_size,
                  "merge_radius": options.merge_radius if is_context else None, "full_keys": options.full_keys},
    }
    if options.full_keys:
        ui.step("calibrating the bandwidth of the full-dimensional keys (pgvector baseline)")
        keys = key_bandwidth(atoms, texts, embeddings, window, decay, targets, options)
        stats["key_bandwidth"], stats["key_calibration"] = keys["h"], keys
    params = fitted.params(landmark_method=options.landmark_method if options.projection == "lmds" else None,
                           seed=options.seed,
                           landmark_token_ids=None if fitted.landmark_idx is None else fitted.landmark_idx.tolist())
    spec = AtomSetSpec(options.name, model_name, vocab_size, dim, options.projection, options.kind, params,
                       window, decay, options.kernel, bandwidth, BuildStats.from_json(stats), options.make_default,
                       model_key=options.model)
    tokens = TokenRows(np.arange(vocab_size), token_texts(tokenizer, vocab_size), positions, embeddings)
    landmarks = None
    if fitted.landmark_idx is not None:
        landmarks = LandmarkRows(embeddings[fitted.landmark_idx], positions[fitted.landmark_idx])
    ui.step(f"ingesting {len(atoms.token_ids):,} atoms")
    report = write_atom_set(conn, spec, tokens, atoms, landmarks, replace=options.replace, progress=ui.step)
    ui.step(f"ingest: {report.atoms:,} atoms in {report.total_seconds:.1f}s ({report.atoms_per_second:,.0f} atoms/s)")
    stats["ingest"] = report.as_dict()
    return BuildResult(report.atom_set_id, options.name, options.kind, report.atoms, vocab_size, window, decay,
                       bandwidth, stats, time.perf_counter() - started)
