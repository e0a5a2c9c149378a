"""The labels the counting baselines learn from: the atom set's own, at its training positions.

A context set records what its atoms store (stats.distill.target):

    soft    the exact model's top-k next tokens, each weighing its probability (k = stats.distill.soft_k)
    argmax  the exact model's argmax, weight 1
    corpus  the corpus's own next token, weight 1
    mixed   soft on the training chunks holding the first stats.distill.teacher_tokens tokens, corpus
            on the rest (a corpus label is a row of k with one id of weight 1)

at position t = 0 .. n-2 of every training chunk of n tokens (the positions that became atoms; the
chunk's last token has no next token in it). The baselines count exactly these labels, so that a
baseline and the atom set it is compared with learn from the same information. A token set stores
no labels; its baselines learn the exact argmax.

The soft and argmax labels come from one teacher-forcing pass (hartonomous.corpus.teacher) over the build's
own chunks, so the teacher-label cache that the build filled answers it and the labels are the
build's; corpus labels need no model at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hartonomous.corpus import teacher

TARGETS = ("soft", "argmax", "corpus", "mixed")


@dataclass(frozen=True)
class TrainingLabels:
    """Training chunks and the label mass after each labelled position.

    ids[i][t] (k ids) and mass[i][t] (their weights) label the context chunks[i][: t + 1], for
    t < len(ids[i]) (at most len(chunks[i])); weights are >= 0 (0: no label there).
    """

    chunks: list[np.ndarray]
    ids: list[np.ndarray]       # (m_i, k) int64
    mass: list[np.ndarray]      # (m_i, k) float (soft: float32 as the teacher gives them)
    target: str                 # 'soft' | 'argmax' | 'corpus' (or 'given', hand-made labels)

    @property
    def k(self) -> int:
        return int(self.ids[0].shape[1]) if self.ids else 1

    @property
    def tokens(self) -> int:
        return int(sum(len(c) for c in self.chunks))

    @property
    def positions(self) -> int:
        return int(sum(len(i) for i in self.ids))

    def describe(self) -> str:
        """'soft top-8', 'argmax', 'corpus' (what the report's distillation section calls them)."""
        if self.target == "mixed":
            return f"mixed (soft top-{self.k}, then corpus)"
        return f"soft top-{self.k}" if self.target == "soft" else self.target


def _chunks(chunks: Sequence[Sequence[int]]) -> list[np.ndarray]:
    return [np.asarray(c, dtype=np.int64) for c in chunks]


def from_corpus(chunks: Sequence[Sequence[int]]) -> TrainingLabels:
    """The corpus's own next token at t = 0 .. n-2 of each chunk (no model involved)."""
    chunks = _chunks(chunks)
    return TrainingLabels(chunks, [c[1:, None] for c in chunks], [np.ones((len(c) - 1, 1)) for c in chunks],
                          "corpus")


def from_argmax(chunks: Sequence[Sequence[int]], argmax: Sequence[np.ndarray]) -> TrainingLabels:
    """The exact argmax after each chunk's tokens 0..t, at t = 0 .. n-2 (the atom positions)."""
    chunks = _chunks(chunks)
    ids = [np.asarray(a, dtype=np.int64)[: len(c) - 1, None] for c, a in zip(chunks, argmax, strict=True)]
    return TrainingLabels(chunks, ids, [np.ones(i.shape) for i in ids], "argmax")


def from_soft(chunks: Sequence[Sequence[int]], top_ids: Sequence[np.ndarray],
              top_probs: Sequence[np.ndarray]) -> TrainingLabels:
    """The exact top-k ids weighing their probabilities, at t = 0 .. n-2 (the atom positions)."""
    chunks = _chunks(chunks)
    ids = [np.asarray(i, dtype=np.int64)[: len(c) - 1] for c, i in zip(chunks, top_ids, strict=True)]
    mass = [np.asarray(p, dtype=np.float32)[: len(c) - 1] for c, p in zip(chunks, top_probs, strict=True)]
    if any(i.shape != p.shape or i.ndim != 2 for i, p in zip(ids, mass)):
        raise ValueError("top_ids and top_probs must be (n, k) arrays of the same shape per chunk")
    return TrainingLabels(chunks, ids, mass, "soft")


def from_continuations(sequences: Sequence[Sequence[int]], prompt_tokens: int, k: int = 1) -> TrainingLabels:
    """Self-distilled text (hartonomous.corpus.self_distill): the next token at the continuation's positions
    t >= prompt_tokens - 1, weight 1; the prompt's positions are unlabelled (weight 0), as they hold no
    atom. `k` columns, to join labels of k columns (weight 0 beyond the first)."""
    chunks = _chunks(sequences)
    ids = [np.pad(c[1:, None], ((0, 0), (0, k - 1))) for c in chunks]
    mass = []
    for c in chunks:
        m = np.zeros((len(c) - 1, k), dtype=np.float32)
        m[prompt_tokens - 1:, 0] = 1.0
        mass.append(m)
    return TrainingLabels(chunks, ids, mass, "self-distilled")


def joined(first: TrainingLabels, then: TrainingLabels) -> TrainingLabels:
    """Two label sets of the same k, one after the other (the target is the first's)."""
    if first.k != then.k:
        raise ValueError(f"joined labels need the same k, got {first.k} and {then.k}")
    return TrainingLabels(first.chunks + then.chunks, first.ids + then.ids,
                          [np.asarray(m, dtype=np.float32) for m in first.mass + then.mass], first.target)


def teacher_chunk_count(chunks: Sequence[Sequence[int]], teacher_tokens: int) -> int:
    """--target mixed: how many leading training chunks get the exact model's labels (the fewest that
    hold teacher_tokens tokens, or all of them); the build and the baselines cut at the same chunk."""
    total = np.cumsum([len(c) for c in chunks])
    return int(min(len(chunks), np.searchsorted(total, teacher_tokens) + 1)) if teacher_tokens > 0 else 0


def mixed(taught: TrainingLabels, rest: TrainingLabels) -> TrainingLabels:
    """Soft labels of the first chunks, then corpus labels padded to k columns (weight 0 beyond the first)."""
    k = taught.k
    pad_ids = [np.pad(i, ((0, 0), (0, k - 1))) for i in rest.ids]
    pad_mass = [np.pad(np.asarray(m, dtype=np.float32), ((0, 0), (0, k - 1))) for m in rest.mass]
    return TrainingLabels(taught.chunks + rest.chunks, taught.ids + pad_ids, taught.mass + pad_mass, "mixed")


def from_sequences(sequences: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]) -> TrainingLabels:
    """Hand-made labels: labels[i][t] is the one label after sequences[i][: t + 1] (weight 1); a label
    sequence may be shorter than its tokens (the positions after it are unlabelled), never longer."""
    chunks = _chunks(sequences)
    ids = [np.asarray(lab, dtype=np.int64).reshape(-1, 1) for lab in labels]
    if len(ids) != len(chunks) or any(len(i) > len(c) for i, c in zip(ids, chunks)):
        raise ValueError("each label sequence must be at most as long as its token sequence")
    return TrainingLabels(chunks, ids, [np.ones(i.shape) for i in ids], "given")


@dataclass(frozen=True)
class TeacherPass:
    """The teacher-forcing pass behind soft or argmax labels: tokens, how many came from the label cache."""

    tokens: int
    cached_tokens: int
    seconds: float

    def as_dict(self) -> dict:
        return {"tokens": self.tokens, "cached_tokens": self.cached_tokens, "seconds": self.seconds}


def label(chunks: list[np.ndarray], target: str, soft_k: int | None, model=None,
          batch_tokens: int = teacher.DEFAULT_BATCH_TOKENS, cache_dir: Path | None = None,
          advance: Callable[[int], None] | None = None, taught_chunks: int = 0
          ) -> tuple[TrainingLabels, TeacherPass | None]:
    """The `target` labels of `chunks`: corpus labels without the model; soft (top-`soft_k`) and argmax
    labels from one teacher-forcing pass, read from the teacher-label cache where the build left them;
    mixed: soft on the first `taught_chunks` chunks, corpus on the rest."""
    if target not in TARGETS:
        raise ValueError(f"target must be one of {', '.join(TARGETS)}, got {target!r}")
    if target == "corpus" or (target == "mixed" and taught_chunks == 0):
        return from_corpus(chunks), None
    if target == "mixed":
        taught, ran = label(chunks[:taught_chunks], "soft", soft_k, model, batch_tokens, cache_dir, advance)
        return mixed(taught, from_corpus(chunks[taught_chunks:])), ran
    if target == "soft" and not (soft_k and soft_k >= 1):
        raise ValueError(f"soft labels need soft_k >= 1, got {soft_k}")
    top_k = int(soft_k) if target == "soft" else 0
    forced = teacher.teacher_force(model, chunks, batch_tokens, top_k=top_k, advance=advance, cache_dir=cache_dir)
    done = TeacherPass(forced.tokens, forced.cached_tokens, forced.seconds)
    if target == "soft":
        return from_soft(forced.chunks, forced.top_ids, forced.top_probs), done
    return from_argmax(forced.chunks, forced.argmax), done
