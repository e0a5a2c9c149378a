"""The baselines' predictors: the counting baselines (n-grams, the ∞-gram, each also mixed with an
in-context cache; no geometry) and full-dimensional KNN on atom keys.

The counting baselines learn from the atom set's own training text, read again from where the set
records it came from (hartonomous.corpus.origin.recorded_training_text), cut into the build's chunks, and
from the atom set's own labels there (hartonomous.compare.labels: soft top-k mass, the exact argmax
or the corpus's next token), so they answer "what would the same data and the same labels buy
without the 3D projection?"; the caches also read the context itself, as the spatial path's history
atoms do.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psycopg

from hartonomous.corpus import teacher
from hartonomous.atomset import AtomSet
from hartonomous.centroid import context_centroid
from hartonomous.compare import cache, knn, labels as labels_mod, ngram, spatial
from hartonomous.compare.infinigram import InfiniGram
from hartonomous.compare.metrics import Sparse
from hartonomous.corpus.sources import chunk_ids, tokenize
from hartonomous.corpus.origin import CorpusUnavailable, TrainingText, recorded_training_text

Predictor = Callable[[Sequence[int]], Sparse]

INFINIGRAM_PATH = "∞-gram"


@dataclass
class Distillation:
    """The report's `baselines.distillation`: which labels the counting baselines learned from, where
    their training text came from and how many tokens it had (or why there are none)."""

    available: bool
    source: str | None = None
    tokens: int = 0
    note: str = ""
    labels: str | None = None              # 'soft top-8' | 'argmax' | 'corpus'
    target: str | None = None              # 'soft' | 'argmax' | 'corpus'
    soft_k: int | None = None
    positions: int = 0                     # labelled training positions
    origin: dict | None = None             # kind, name, version, files [{path, sha256}]
    teacher_pass: dict | None = None       # tokens, cached_tokens, seconds; None: no model ran (corpus labels)
    index: dict = field(default_factory=dict)   # the ∞-gram index: seconds, bytes

    def as_dict(self) -> dict:
        return {"available": self.available, "source": self.source, "tokens": self.tokens, "note": self.note,
                "labels": self.labels, "target": self.target, "soft_k": self.soft_k, "positions": self.positions,
                "origin": self.origin, "teacher_pass": self.teacher_pass, "index": self.index or None}


CACHE_PATH = "4-gram + cache"
INFINIGRAM_CACHE_PATH = "∞-gram + cache"
CACHE_BASES = {CACHE_PATH: "4-gram", INFINIGRAM_CACHE_PATH: INFINIGRAM_PATH}   # cache path -> the path it mixes
CALIBRATION_MAX_TOKENS = 8192   # of the calibration half, for fitting the cache mixtures


@dataclass
class CacheMixture:
    """The report's `baselines.cache` ("4-gram + cache") or `baselines.infinigram_cache` ("∞-gram +
    cache") section: how the base path was mixed with the cache and where λ was fitted."""

    available: bool
    lam: float | None = None
    min_suffix: int | None = None
    fitted_on: str | None = None          # 'calibration' (the holdout's calibration half) or None
    positions: int = 0
    grid: list[dict] | None = None
    note: str = ""
    base: str = "4-gram"

    def as_dict(self) -> dict:
        return {"available": self.available, "base": self.base, "lambda": self.lam, "min_suffix": self.min_suffix,
                "fitted_on": self.fitted_on, "calibration_positions": self.positions,
                "criterion": "top-1 agreement with the exact argmax, ties by mean log-likelihood of it",
                "grid": self.grid or [], "note": self.note}


def cache_mixture(base_predict: Predictor, calibration: tuple[list[int], np.ndarray] | None, chunk: int,
                  vocab_size: int, base: str = "4-gram") -> tuple[Predictor, CacheMixture]:
    """`base` (the 4-gram or the ∞-gram) mixed with the in-context cache, λ and the minimum suffix fitted
    on the calibration tokens and their exact labels only (contexts restart every `chunk` tokens, as in
    the scored texts); without calibration text, the documented defaults."""
    if calibration is None or not calibration[0]:
        lam, min_suffix = cache.DEFAULT_LAMBDA, cache.DEFAULT_MIN_SUFFIX
        section = CacheMixture(True, lam, min_suffix, None, 0, [],
                               f"not fitted (the atom set records no calibration half of a holdout): "
                               f"defaults λ = {lam:g}, minimum suffix {min_suffix}", base)
    else:
        ids, labels = calibration
        starts = range(0, len(ids), chunk)
        fit = cache.fit_mixture(base_predict, [ids[lo:lo + chunk] for lo in starts],
                                [labels[lo:lo + chunk] for lo in starts], vocab_size)
        lam, min_suffix = fit.lam, fit.min_suffix
        section = CacheMixture(True, lam, min_suffix, "calibration", fit.positions, fit.grid,
                               f"λ and the minimum suffix fitted on {fit.positions} positions of the holdout's "
                               f"calibration half (contexts of up to {chunk} tokens), never on the scored text",
                               base)
    return cache.CachedNGram(base_predict, lam, min_suffix).predict, section


# --- the counting baselines' training text and labels ----------------------------------------

CorpusLoader = Callable[[AtomSet], TrainingText]


def recorded_corpus(info: AtomSet) -> TrainingText:
    """The set's training text, from where its stats say it came from (hartonomous.corpus.origin); raises
    CorpusUnavailable with the reason when it cannot be had exactly."""
    holdout = info.stats.holdout
    return recorded_training_text(info.stats.corpus, holdout.text if holdout is not None else None)


def build_tokens(info: AtomSet) -> int | None:
    """How many training tokens the build distilled (context sets) or would have (token sets)."""
    entry = info.stats.corpus
    if entry is None:
        return None
    value = entry.train_tokens or entry.max_tokens
    return int(value) if value else None


def context_length(info: AtomSet, default: int = 512) -> int:
    """The chunk length the builder's teacher forcing used (stats.corpus.context_length)."""
    entry = info.stats.corpus
    return int(entry.context_length) if entry is not None and entry.context_length else default


def training_target(info: AtomSet) -> tuple[str, int | None]:
    """(target, soft_k) of the labels the set's atoms store; token sets store none: the exact argmax."""
    distill = info.stats.distill
    target = distill.target if info.kind == "context" and distill is not None else None
    if target in ("soft", "mixed"):
        return target, int(distill.soft_k or 8)    # every soft build recorded soft_k; 8 was the default
    if target in ("argmax", "corpus"):
        return target, None
    return "argmax", None


LABEL_WORDS = {"soft": "the exact model's top-{k} next tokens weighing their probabilities",
               "argmax": "the exact model's argmax", "corpus": "the corpus's own next token",
               "mixed": "the exact model's top-{k} next tokens on the first training chunks, the corpus's own "
                        "next token on the rest"}


def counting_baselines(info: AtomSet, model, tokenizer, corpus_loader: CorpusLoader, distill_tokens: int | None,
                       cache_dir: Path | None, progress) -> tuple[dict[str, Predictor], Distillation]:
    """The n-grams and the ∞-gram, learned from the set's own training text and labels.

    The text is cut into the build's chunks (stats.corpus.context_length, at most the model's context)
    after `distill_tokens` tokens (None: as many as the build used); soft and argmax labels come from
    one teacher-forcing pass that the teacher-label cache answers where the build filled it, corpus
    labels from the text alone. `progress` has stage(description, total) and advance(n)."""
    try:
        corpus = corpus_loader(info)
    except CorpusUnavailable as exc:
        return {}, Distillation(False, note=f"{exc}; the counting baselines were skipped")
    target, soft_k = training_target(info)
    described = {"source": corpus.source, "origin": corpus.origin, "target": target, "soft_k": soft_k}
    if distill_tokens == 0:
        return {}, Distillation(False, note="--distill-tokens 0: the counting baselines were skipped", **described)
    limit = distill_tokens if distill_tokens is not None else build_tokens(info)
    length = min(context_length(info), teacher.max_context(model))
    train_ids = tokenize(tokenizer, corpus.text)[0][:limit]
    chunks = chunk_ids(train_ids, length)
    if not chunks:
        return {}, Distillation(False, note="the training text has fewer than 2 tokens; the counting baselines "
                                            "were skipped", **described)
    if target != "corpus":
        progress.stage(f"{'soft top-' + str(soft_k) if target in ('soft', 'mixed') else 'argmax'} labels of the training "
                       "text (teacher-label cache)", int(sum(map(len, chunks))))
    distill = info.stats.distill
    batch = int(distill.batch_tokens) if distill is not None and distill.batch_tokens else \
        teacher.DEFAULT_BATCH_TOKENS
    taught = labels_mod.teacher_chunk_count(chunks, int(distill.teacher_tokens or 0)) if target == "mixed" else 0
    labelled, ran = labels_mod.label(chunks, target, soft_k, model, batch, cache_dir, progress.advance, taught)
    distilled = info.stats.self_distill
    if distilled:                        # the atoms hold the model's own continuations too: so do the baselines
        labelled = with_self_distilled(labelled, distilled, model, train_ids, cache_dir, progress)
    progress.stage("∞-gram index (suffix array of the training text)", 1)
    start = time.perf_counter()
    index = InfiniGram(labelled)
    seconds = time.perf_counter() - start
    progress.advance()
    words = LABEL_WORDS[target].format(k=soft_k)
    whose = "the atom set's own" if info.kind == "context" else "a token set stores no labels, so the exact argmax"
    passed = ("no model ran" if ran is None else
              f"{ran.cached_tokens:,} of {ran.tokens:,} tokens' labels read from the teacher-label cache")
    note = (f"labels {labelled.describe()} ({whose}): {words}, at position 0 … n − 2 of each of the build's chunks "
            f"of n ≤ {length} tokens, as the atoms ({labelled.positions:,} positions; {passed})")
    if distilled:
        note += (f"; with the {distilled['tokens']:,} self-distilled tokens the atoms hold (the model's own "
                 "continuations, labelled at the continuation's positions"
                 + (", alone: the set has no corpus atoms" if distilled.get("only") else "") + ")")
    predictors: dict[str, Predictor] = {name: model_.predict for name, model_ in ngram.ngrams(index).items()}
    predictors[INFINIGRAM_PATH] = index.predict
    return predictors, Distillation(True, tokens=labelled.tokens, note=note, labels=labelled.describe(),
                                    positions=labelled.positions,
                                    teacher_pass=ran.as_dict() if ran is not None else None,
                                    index={"seconds": seconds, "bytes": index.nbytes}, **described)


def with_self_distilled(labelled: labels_mod.TrainingLabels, recorded: dict, model, train_ids: np.ndarray,
                        cache_dir: Path | None, progress) -> labels_mod.TrainingLabels:
    """`labelled` joined with the set's self-distilled continuations (stats.self_distill), generated
    again as the build did (same model, training tokens and seed; the build's cache answers), or
    those alone where the set keeps no corpus atoms."""
    from hartonomous.corpus.self_distill import self_distill

    progress.stage("the model's own continuations (self-distill cache)", int(recorded["tokens"]))
    distilled = self_distill(model, train_ids, int(recorded["tokens"]), seed=int(recorded["seed"]),
                             eos_token_ids=set(recorded["eos_token_ids"]), advance=progress.advance,
                             cache_dir=cache_dir, temperature=float(recorded["sample_temperature"]))
    continuations = labels_mod.from_continuations(distilled.sequences, distilled.prompt_tokens,
                                                  1 if recorded.get("only") else labelled.k)
    return continuations if recorded.get("only") else labels_mod.joined(labelled, continuations)


def knn_predictor(conn: psycopg.Connection, info: AtomSet, embeddings: np.ndarray,
                  k: int = 100) -> KeyKnn:
    """Full-dimensional KNN on the atoms' `key` column: the query key is the context centroid of
    the tokens' full-dimensional embeddings with the set's window and decay (the key definition
    of context atoms), matched by exact L2 search (pgvector's distances and order; compare.knn)."""
    return KeyKnn(conn, info, embeddings, k, knn.load_keys(conn, info.id))


class KeyKnn:
    """The KNN predictor: call it with a context; `prepare(ids)` first searches all of a text's
    prefixes in batches (fidelity.evaluate_text does), so that each call only ranks its candidates."""

    def __init__(self, conn: psycopg.Connection, info: AtomSet, embeddings: np.ndarray, k: int,
                 keys: knn.KeySearch):
        self.conn, self.info, self.embeddings, self.k, self.keys = conn, info, embeddings, k, keys
        self._candidates: dict[str, np.ndarray] = {}

    def literal(self, context: Sequence[int]) -> str:
        window = self.info.centroid_window
        recent = list(context)[-window:] if window else list(context)
        return knn.vector_literal(context_centroid(self.embeddings[np.asarray(recent)], window,
                                                   self.info.centroid_decay))

    def prepare(self, ids: Sequence[int]) -> None:
        """Search the queries of the contexts ids[:1], ids[:2], ..., ids[:-1] at once."""
        literals = [self.literal(ids[: t + 1]) for t in range(len(ids) - 1)]
        if not literals:
            return
        found = self.keys.candidates(np.stack([knn.literal_values(q) for q in literals]), self.k)
        self._candidates = dict(zip(literals, found))

    def __call__(self, context: Sequence[int]) -> Sparse:
        literal = self.literal(context)
        candidates = self._candidates.pop(literal, None)
        if candidates is None:
            candidates = self.keys.candidates(knn.literal_values(literal)[None], self.k)[0]
        rows = knn.ranked(self.conn, literal, self.info.id, candidates, self.k)
        return spatial.knn_kernel(rows, self.info.stats.key_bandwidth)[0]
