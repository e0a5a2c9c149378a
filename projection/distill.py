"""The build's corpus tokens: tokenize, cut into teacher-forcing chunks, distil with the exact model.

Text is tokenized once and cut into chunks of `context_length` tokens (hartonomous.corpus.sources.tokenize
and chunk_ids, shared with `compare`'s baselines); each chunk is one context (the model and the atom
keys see the same tokens). The forward pass itself is
hartonomous.corpus.teacher (batched, shared with `hartonomous compare`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from hartonomous.corpus.sources import chunk_ids, tokenize  # noqa: F401 - their home is hartonomous.corpus.sources (compare uses them)
from hartonomous.errors import UserError
from hartonomous.corpus.teacher import DEFAULT_BATCH_TOKENS, Forced, teacher_force


def distill(model, chunks: list[np.ndarray], batch_tokens: int = DEFAULT_BATCH_TOKENS,
            advance: Callable[[int], None] | None = None, top_k: int = 0,
            cache_dir: Path | None = None) -> Forced:
    """Run the model over every chunk (teacher forcing) and keep the argmax (and the top-k
    probabilities when top_k > 0) at each position; chunks in the teacher-label cache at
    `cache_dir` (hartonomous.corpus.teacher) are read from it instead."""
    if not chunks:
        raise UserError("the corpus has no text to distill; pass a longer --corpus or raise --max-tokens")
    return teacher_force(model, chunks, batch_tokens, top_k=top_k, advance=advance, cache_dir=cache_dir)
