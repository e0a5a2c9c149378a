"""stats['reproducibility']: what a build's numbers depend on besides its command, and digests of them.

The same command on the same machine gives the same set, bit for bit (docs/atoms.md,
Determinism). On another machine the last bits may differ: other CPU kernels, another thread
count, other library versions. The build records those, with sha256 digests of the teacher
labels it used and of the atoms it wrote, so that two sets (or a set and its rebuild) can be
compared from their stats alone.
"""

from __future__ import annotations

import hashlib
import platform
from importlib import metadata

import numpy as np

from hartonomous.atomset import AtomRows
from hartonomous.corpus.teacher import Forced
from hartonomous.threads import machine_threads

PACKAGES = ("numpy", "scipy", "scikit-learn", "torch", "transformers")


def digest(arrays: list[np.ndarray | None]) -> str:
    """sha256 over the arrays' dtypes, shapes and bytes, in order (None counts as a marker)."""
    h = hashlib.sha256()
    for a in arrays:
        if a is None:
            h.update(b"none|")
            continue
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def labels_digest(forced: Forced) -> str:
    """The teacher labels of every chunk: argmax, and top-k ids and probabilities when kept."""
    parts: list[np.ndarray | None] = []
    for i in range(len(forced.chunks)):
        parts += [forced.chunks[i], forced.argmax[i], forced.top_ids[i] if forced.top_ids else None,
                  forced.top_probs[i] if forced.top_probs else None]
    return digest(parts)


def atoms_digest(rows: AtomRows) -> str:
    """The atoms as written: token ids, positions, weights, full keys and (where recorded) sources,
    in atom id order; a set without sources digests as before they were recorded."""
    parts = [np.asarray(rows.token_ids, dtype=np.int64), np.asarray(rows.positions, dtype=np.float64),
             None if rows.weights is None else np.asarray(rows.weights, dtype=np.float64),
             None if rows.keys is None else np.asarray(rows.keys, dtype=np.float32)]
    if rows.sources is not None:
        parts.append(np.asarray(rows.sources, dtype=np.int16))
    return digest(parts)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def reproducibility(forced: Forced, rows: AtomRows) -> dict:
    """The record: threads, versions, machine, and the digests of the labels and the atoms."""
    return {"threads": machine_threads(), "machine": platform.machine(), "python": platform.python_version(),
            "versions": {p: _version(p) for p in PACKAGES},
            "labels_sha256": labels_digest(forced), "atoms_sha256": atoms_digest(rows)}
