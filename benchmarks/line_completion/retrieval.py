"""In-context retrieval, RepoCoder's single-iteration baseline: the chunks of the repository's
other files most similar to the code before the cursor, prepended to the prompt as comments.

Chunks: sliding windows of WINDOW lines every STRIDE lines over each file the store was built
from (the same files the store holds: the held-out files are never among them). Query: the
prompt's last WINDOW lines. Similarity: BM25 (bm25s) over code tokens (identifiers split on
underscores and case, numbers, lower-cased). The best chunks are taken in score order while
their comment block stays within the retrieval budget (a chunk overlapping one already taken
from the same file is skipped), then written best last, closest to the code, each as

    # the below code fragment can be found in:
    # path/to/file.py
    # <the chunk's lines, each behind "# ">

followed by a newline and the in-file prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

WINDOW = 20
STRIDE = 10
CANDIDATES = 50         # the best-ranked chunks considered for the budget
HEADER = "# the below code fragment can be found in:"
_WORD = re.compile(r"[A-Za-z]+|\d+")


def code_tokens(text: str) -> list[str]:
    """Lower-cased words of code: identifiers split at underscores and case changes, and numbers."""
    words = []
    for ident in re.findall(r"[A-Za-z_][A-Za-z0-9_]*|\d+", text):
        for part in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", ident):
            words.append(part.lower())
    return words


@dataclass(frozen=True)
class Chunk:
    path: str
    first: int             # 0-based first line
    text: str


def chunks_of(path: str, text: str, window: int = WINDOW, stride: int = STRIDE) -> list[Chunk]:
    """Windows of `window` lines every `stride` lines (the last one reaching the file's end)."""
    lines = text.split("\n")
    starts = list(range(0, max(len(lines) - window, 0) + 1, stride))
    if starts[-1] + window < len(lines):
        starts.append(len(lines) - window)
    return [Chunk(path, s, "\n".join(lines[s:s + window])) for s in starts
            if "\n".join(lines[s:s + window]).strip()]


def as_comment(chunk: Chunk) -> str:
    body = "\n".join(("# " + line).rstrip() for line in chunk.text.split("\n"))
    return f"{HEADER}\n# {chunk.path}\n{body}\n"


class Retriever:
    """BM25 over the windows of a repository's files."""

    def __init__(self, files: Sequence[tuple[str, str]], window: int = WINDOW, stride: int = STRIDE):
        import bm25s

        self.window = window
        self.chunks = [c for path, text in files for c in chunks_of(path, text, window, stride)]
        if not self.chunks:
            raise ValueError("no chunks to retrieve from: the files are empty")
        self.index = bm25s.BM25()
        self.index.index([code_tokens(c.text) or ["<empty>"] for c in self.chunks], show_progress=False)

    def ranked(self, query: str) -> list[tuple[Chunk, float]]:
        """Every chunk with a positive score for the query's last `window` lines, best first."""
        words = code_tokens("\n".join(query.split("\n")[-self.window:]))
        if not words:
            return []
        scores = np.asarray(self.index.get_scores(words), dtype=np.float64)
        order = np.argsort(-scores, kind="stable")
        return [(self.chunks[i], float(scores[i])) for i in order if scores[i] > 0]

    def block(self, query: str, tokenizer, budget: int, exclude_path: str | None = None) -> tuple[str, list[Chunk]]:
        """The comment block of the best chunks within `budget` tokens (best last) and the chunks."""
        taken: list[Chunk] = []
        used = 0
        for chunk, _ in self.ranked(query)[:CANDIDATES]:
            if chunk.path == exclude_path or any(c.path == chunk.path and abs(c.first - chunk.first) < self.window
                                                 for c in taken):
                continue
            cost = len(tokenizer(as_comment(chunk) + "\n", add_special_tokens=False)["input_ids"])
            if used + cost > budget:
                continue
            taken.append(chunk)
            used += cost
        return "".join(as_comment(c) + "\n" for c in reversed(taken)), taken


def with_retrieval(tokenizer, block: str, in_file_ids: list[int]) -> list[int]:
    """The retrieval block's tokens, then the in-file prompt's."""
    if not block:
        return list(in_file_ids)
    return [int(t) for t in tokenizer(block, add_special_tokens=False)["input_ids"]] + list(in_file_ids)
