"""Choose the centroid window and decay on the holdout: the candidates and how they are ranked.

Each candidate (window, decay) gets its own atoms (context atoms are keyed with it), its own
held-out queries, and its own calibrated bandwidth (projection.stages builds and calibrates
them); the best has the highest held-out top-1 agreement with the exact model's argmax (ties:
higher log-likelihood).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Candidate = tuple[int | None, float]
CANDIDATES: list[Candidate] = [(1, 1.0), (2, 1.0), (2, 0.25), (2, 0.05), (2, 0.01), (3, 0.25), (3, 0.05),
                               (3, 0.01), (4, 0.01), (8, 0.1), (None, 0.5), (None, 1.0)]


@dataclass(frozen=True)
class Evaluated:
    """One candidate's outcome: how many atoms it made and its calibration record."""

    window: int | None
    decay: float
    atoms: int
    calibration: dict

    def rank(self) -> tuple[float, float]:
        return self.calibration["top1"], self.calibration["log_likelihood"]

    def summary(self) -> dict:
        c = self.calibration
        return {"window": self.window, "decay": self.decay, "atoms": self.atoms,
                "h": c["h"], "top1": c["top1"], "log_likelihood": c["log_likelihood"], "coverage": c["coverage"],
                "best_top1": c["best_top1"]}


def sweep(candidates: list[Candidate], evaluate: Callable[[int | None, float], Evaluated],
          advance: Callable[[int], None] | None = None) -> tuple[Evaluated, list[dict]]:
    """The best candidate and every candidate's summary, in order (one candidate's atoms at a time)."""
    best: Evaluated | None = None
    rows = []
    for window, decay in candidates:
        result = evaluate(window, decay)
        rows.append(result.summary())
        if best is None or result.rank() > best.rank():
            best = result
        if advance:
            advance(1)
    if best is None:
        raise ValueError("the sweep needs at least one candidate")
    return best, rows
