"""Exact match, edit similarity, and their intervals over files.

EM: the completed line equals the real one, trailing whitespace stripped from both (indentation
counts). ES: rapidfuzz's normalised Levenshtein similarity, 1 − distance / max(len), on the same
strings (1 for two empty strings). Lines of one file are correlated, so the bootstrap resamples
whole files (hartonomous.compare.intervals with one group per file); paired tests between two
systems resample the files' per-line differences the same way.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np
from rapidfuzz.distance import Levenshtein

from hartonomous.compare.intervals import bootstrap_interval, paired_test


def exact_match(predicted: str, target: str) -> float:
    return float(predicted.rstrip() == target.rstrip())


def edit_similarity(predicted: str, target: str) -> float:
    return float(Levenshtein.normalized_similarity(predicted.rstrip(), target.rstrip()))


def file_groups(files: Sequence[str]) -> np.ndarray:
    """One integer group per distinct file (in order of first appearance)."""
    index: dict[str, int] = {}
    return np.array([index.setdefault(f, len(index)) for f in files], dtype=np.int64)


def interval(values: Sequence[float], files: Sequence[str]) -> dict:
    """The mean with its 95 % bootstrap interval, resampling files."""
    i = bootstrap_interval(np.asarray(values, dtype=np.float64), file_groups(files))
    return {"estimate": i.estimate, "ci95": [i.low, i.high], "lines": i.n, "files": i.blocks}


def paired(a: Sequence[float], b: Sequence[float], files: Sequence[str], metric: str,
           names: tuple[str, str]) -> dict:
    """Mean(a − b) over the same lines, its interval resampling files, p and the verdict."""
    test = paired_test(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64), file_groups(files),
                       metric=metric, names=names, higher_is_better=True)
    return {"a": names[0], "b": names[1], "metric": metric, "difference": test.difference,
            "ci95": [test.low, test.high], "p": test.p_value, "verdict": test.verdict, "lines": test.n,
            "files": test.blocks}


def median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None
