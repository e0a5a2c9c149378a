"""Which lines of a held-out file are completed: chosen by a seed among the lines worth completing."""

from __future__ import annotations

import random

SKIP_FIRST = 20          # a line in the first 20 has little file before it (imports, the module docstring)


def candidate(line: str) -> bool:
    """A line worth completing: not blank and not only a comment."""
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def select_lines(text: str, count: int, seed: int, skip_first: int = SKIP_FIRST) -> list[int]:
    """Up to `count` 0-based line numbers of `text`, past its first `skip_first` lines, each a
    `candidate`, drawn by `seed` (the same text and seed give the same lines), in file order."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    lines = text.split("\n")
    pool = [i for i in range(skip_first, len(lines)) if candidate(lines[i])]
    chosen = random.Random(seed).sample(pool, min(count, len(pool)))
    return sorted(chosen)
