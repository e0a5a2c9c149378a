"""Which split a file of an indexed set is in, from a hash of its path alone; duplicate files.

A file's split comes from the sha256 of its path relative to the root: the first 8 bytes as a
fraction u in [0, 1); u < CALIBRATION_SHARE calibrates (bandwidth, history weight, risk model,
gate), the next TEST_SHARE is held out for `compare` and the benchmarks, the rest trains (gives
atoms). So adding, changing or removing a file moves no other file, and the same path is in the
same split in every index of every repository.

Files with the same content are stored once: the one with the smallest path (in code-point order)
is kept, whatever order the walk met them in, and the others are counted as duplicates. When the
kept one goes, the next smallest takes its place on the next run.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TypeVar

SPLITS = ("train", "calibration", "test")
CALIBRATION_SHARE = 0.05
TEST_SHARE = 0.05

F = TypeVar("F")


def path_fraction(path: str) -> float:
    """The path's place in [0, 1): the first 8 bytes of sha256(path, UTF-8) over 2^64."""
    return int.from_bytes(hashlib.sha256(path.encode("utf-8")).digest()[:8], "big") / 2.0 ** 64


def file_split(path: str) -> str:
    """'calibration', 'test' or 'train' for a path relative to the root (POSIX separators)."""
    u = path_fraction(path)
    if u < CALIBRATION_SHARE:
        return "calibration"
    if u < CALIBRATION_SHARE + TEST_SHARE:
        return "test"
    return "train"


def unique_contents(files: Iterable[F]) -> tuple[list[F], int]:
    """(the files kept, sorted by path: for each content hash the smallest path; how many duplicates
    were left out). Files have `.path` and `.sha256`; the result does not depend on their order."""
    kept: dict[bytes, F] = {}
    count = 0
    for f in files:
        count += 1
        best = kept.get(f.sha256)
        if best is None or f.path < best.path:
            kept[f.sha256] = f
    chosen = sorted(kept.values(), key=lambda f: f.path)
    return chosen, count - len(chosen)
