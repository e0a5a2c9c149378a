"""The build's corpus tokens: tokenize, cut into teacher-forcing chunks, distil with the exact model.

Text is tokenized once and cut into chunks of `context_length` tokens; each chunk is one
context (the model and the atom keys see the same tokens). The forward pass itself is
hartonomous.teacher (batched, shared with `hartonomous compare`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from hartonomous.errors import UserError
from hartonomous.teacher import DEFAULT_BATCH_TOKENS, Forced, teacher_force, windows


def tokenize(tokenizer, text: str, max_tokens: int | None = None) -> tuple[np.ndarray, str]:
    """(token ids of text without special tokens, cut at max_tokens; the text those ids cover)."""
    if max_tokens is None or not getattr(tokenizer, "is_fast", False):
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"][:max_tokens]
        covered = text if max_tokens is None or len(ids) < max_tokens else tokenizer.decode(ids)
        return np.asarray(ids, dtype=np.int64), covered
    enc = tokenizer(text, add_special_tokens=False, verbose=False, return_offsets_mapping=True)
    ids = enc["input_ids"][:max_tokens]
    end = enc["offset_mapping"][len(ids) - 1][1] if ids else 0
    return np.asarray(ids, dtype=np.int64), text[:end]


def chunk_ids(ids: np.ndarray, context_length: int) -> list[np.ndarray]:
    """Consecutive chunks of at most context_length tokens; a last chunk of 1 token is dropped."""
    if context_length < 2:
        raise UserError(f"--context-length must be at least 2, got {context_length}")
    return [c for c in windows(ids, context_length) if len(c) >= 2]


def distill(model, chunks: list[np.ndarray], batch_tokens: int = DEFAULT_BATCH_TOKENS,
            advance: Callable[[int], None] | None = None, top_k: int = 0,
            cache_dir: Path | None = None) -> Forced:
    """Run the model over every chunk (teacher forcing) and keep the argmax (and the top-k
    probabilities when top_k > 0) at each position; chunks in the teacher-label cache at
    `cache_dir` (hartonomous.teacher) are read from it instead."""
    if not chunks:
        raise UserError("the corpus has no text to distill; pass a longer --corpus or raise --max-tokens")
    return teacher_force(model, chunks, batch_tokens, top_k=top_k, advance=advance, cache_dir=cache_dir)
