"""A file's tokens, its line starts and its atoms: what an indexed set stores of each file on its own.

Text is chunked per file: a file's tokens are cut into chunks of the set's context length
(hartonomous.corpus.sources.chunk_ids, as `build` cuts its corpus), and no chunk crosses a file
boundary, so a file's atoms depend on that file alone. Its atoms are the corpus-labelled context
atoms of those chunks (hartonomous.atomset.context.context_atoms: key = the context centroid, value = the next
token), merged at radius 0: one atom per (token, key) whose weight is how many times the file has
it. At radius 0 merging sums integer counts, so adding or subtracting a file's atoms from a set
is exact, and the set's atoms are the sum of its training files' atoms in any order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hartonomous.atomset import AtomRows
from hartonomous.atomset.context import context_atoms, merge_atoms
from hartonomous.corpus.sources import chunk_ids

# The key of an atom in a delta: (token id, x, y, z) with exact float64 coordinates.
Key = tuple[int, float, float, float]


@dataclass(frozen=True)
class FileTokens:
    """A file's token ids as the store ingests them and where each line starts among them."""

    token_ids: np.ndarray    # int64, the file's text tokenized alone, without special tokens
    line_starts: np.ndarray  # int64, line i (0-based here) -> index of the token holding its first character


def file_tokens(tokenizer, text: str) -> FileTokens:
    """Tokenize one file alone; line i starts at the first token whose span ends after the line's
    first character (a token spanning a line break belongs to the line it starts in, and a line
    that starts inside it points at it). An empty file has no lines."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is not None and hasattr(backend, "encode"):     # a `tokenizers` Tokenizer: transformers' or FastTokenizer's
        enc = backend.encode(text, add_special_tokens=False)
        ids, offsets = enc.ids, enc.offsets
    else:
        enc = tokenizer(text, add_special_tokens=False, verbose=False, return_offsets_mapping=True)
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
    ids = np.asarray(ids, dtype=np.int64)
    ends = np.asarray([end for _start, end in offsets], dtype=np.int64)
    if not text:
        return FileTokens(ids, np.zeros(0, dtype=np.int64))
    starts = np.concatenate([[0], np.flatnonzero(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) == 10) + 1])
    starts = starts[starts < len(text)] if text.endswith("\n") else starts
    # The first token whose end lies beyond the line's first character (ends ascend).
    line_starts = np.searchsorted(np.maximum.accumulate(ends) if len(ends) else ends, starts, side="right")
    return FileTokens(ids, np.minimum(line_starts, max(len(ids) - 1, 0)).astype(np.int64))


def file_chunks(token_ids: np.ndarray, context_length: int) -> list[np.ndarray]:
    """The file's chunks: consecutive runs of at most `context_length` of its own tokens."""
    return chunk_ids(np.asarray(token_ids, dtype=np.int64), context_length)


def merged_file_atoms(chunks: list[np.ndarray], positions: np.ndarray, window: int | None, decay: float) -> AtomRows:
    """The corpus-labelled context atoms of `chunks` merged at radius 0 (weights: counts)."""
    if not chunks:
        return AtomRows(np.zeros(0, dtype=np.int64), np.zeros((0, 3)), np.zeros(0))
    rows = context_atoms(chunks, None, positions, window, decay, "corpus")
    merged = merge_atoms(rows, 0.0)
    weights = np.ones(len(merged.token_ids)) if merged.weights is None else np.asarray(merged.weights, dtype=np.float64)
    return AtomRows(np.asarray(merged.token_ids, dtype=np.int64), np.asarray(merged.positions, dtype=np.float64),
                    weights)


def add_counts(delta: dict[Key, float], atoms: AtomRows, sign: float) -> None:
    """Add `sign` x each atom's count to `delta` (keyed by token and exact position)."""
    weights = np.ones(len(atoms.token_ids)) if atoms.weights is None else atoms.weights
    for token, (x, y, z), w in zip(np.asarray(atoms.token_ids).tolist(), np.asarray(atoms.positions).tolist(),
                                   np.asarray(weights).tolist()):
        key = (token, x, y, z)
        delta[key] = delta.get(key, 0.0) + sign * w
