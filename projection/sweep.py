"""Choose the centroid window and decay on the holdout: build, calibrate, score each candidate.

Each candidate (window, decay) gets its own atoms (context atoms are keyed with it), its own
held-out queries, and its own calibrated bandwidth; the best has the highest held-out top-1
agreement with the exact model's argmax (ties: higher log-likelihood).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from projection.calibrate import Neighbours, calibrate_bandwidth, nearest_atoms
from hartonomous.atomset import AtomRows

Candidate = tuple[int | None, float]
CANDIDATES: list[Candidate] = [(1, 1.0), (2, 1.0), (2, 0.25), (2, 0.05), (2, 0.01), (3, 0.25), (3, 0.05),
                               (3, 0.01), (4, 0.01), (8, 0.1), (None, 0.5), (None, 1.0)]


@dataclass
class Evaluated:
    window: int | None
    decay: float
    atoms: AtomRows
    neighbours: Neighbours
    calibration: dict

    def summary(self) -> dict:
        c = self.calibration
        return {"window": self.window, "decay": self.decay, "atoms": int(len(self.atoms.token_ids)),
                "h": c["h"], "top1": c["top1"], "log_likelihood": c["log_likelihood"], "coverage": c["coverage"],
                "best_top1": c["best_top1"]}


def evaluate(window: int | None, decay: float, make_atoms: Callable[[int | None, float], AtomRows],
             make_queries: Callable[[int | None, float], np.ndarray], targets: np.ndarray, kernel: str,
             max_neighbors: int, vocab_size: int, objective: str = "log-likelihood") -> Evaluated:
    """Atoms, held-out queries and calibrated bandwidth for one (window, decay)."""
    atoms = make_atoms(window, decay)
    nb = nearest_atoms(atoms.positions, atoms.token_ids, atoms.weights, make_queries(window, decay), max_neighbors)
    return Evaluated(window, decay, atoms, nb, calibrate_bandwidth(nb, targets, kernel, vocab_size, objective))


def sweep(candidates: list[Candidate], make_atoms, make_queries, targets: np.ndarray, kernel: str,
          max_neighbors: int, vocab_size: int, advance: Callable[[int], None] | None = None,
          objective: str = "log-likelihood") -> tuple[Evaluated, list[dict]]:
    """The best candidate (with its atoms) and every candidate's summary, in order."""
    best: Evaluated | None = None
    rows = []
    for window, decay in candidates:
        result = evaluate(window, decay, make_atoms, make_queries, targets, kernel, max_neighbors, vocab_size,
                          objective)
        rows.append(result.summary())
        rank = (result.calibration["top1"], result.calibration["log_likelihood"])
        if best is None or rank > (best.calibration["top1"], best.calibration["log_likelihood"]):
            best = result
        if advance:
            advance(1)
    assert best is not None
    return best, rows
