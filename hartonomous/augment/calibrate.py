"""Walk a text with both distributions: what fitting a gate and scoring the augmented path need.

At position t of a window x_0..x_n the context is x_0..x_t and the target is the real x_{t+1}. The
exact model's distribution comes from one teacher-forced pass (T = 1, hartonomous.corpus.teacher),
the store's from store_distribution (64 positions per call). Per position the walk keeps what
any λ needs, so a gate can be fitted and the mixture scored without the full vocabulary rows:
p_exact and p_store of the target, the gate's features, the exact argmax and its probability, and
the store's support with the exact probabilities there (the mixture's argmax is the exact argmax
or one of those).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from hartonomous import sqlcalls
from hartonomous.augment.gate import FEATURES, Gate, feature_row, fit_gate, mixture_loss

WINDOW = 1024                     # tokens per teacher-forced window (the context restarts at each)
BATCH = 64                        # store_distribution's positions per call


@dataclass
class Walk:
    """Per-position arrays of one or more texts (see the module docstring)."""

    targets: list[int] = field(default_factory=list)
    p_exact: list[float] = field(default_factory=list)
    p_store: list[float] = field(default_factory=list)
    features: list[np.ndarray] = field(default_factory=list)
    exact_top: list[int] = field(default_factory=list)
    exact_top_p: list[float] = field(default_factory=list)
    store_ids: list[np.ndarray] = field(default_factory=list)
    store_probs: list[np.ndarray] = field(default_factory=list)
    exact_at_store: list[np.ndarray] = field(default_factory=list)
    text_index: list[int] = field(default_factory=list)
    position: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.targets)

    def matrix(self) -> np.ndarray:
        return np.stack(self.features) if self.features else np.empty((0, len(FEATURES)))

    def fit(self, split: str = "calibration") -> Gate:
        return fit_gate(self.matrix(), np.asarray(self.p_exact), np.asarray(self.p_store), split=split)

    def scores(self, lam: np.ndarray) -> dict[str, np.ndarray]:
        """Per position, for the mixture at the given λ (n,): nll of the target, whether the
        mixture's argmax is the target, and the mixture's top probability (for calibration)."""
        lam = np.asarray(lam, dtype=np.float64)
        nll = mixture_loss(lam, np.asarray(self.p_exact), np.asarray(self.p_store))
        top1, confidence = np.empty(len(self)), np.empty(len(self))
        for i in range(len(self)):
            best, best_p = self.exact_top[i], (1 - lam[i]) * self.exact_top_p[i]
            ids = self.store_ids[i]
            if len(ids):
                mixed = (1 - lam[i]) * self.exact_at_store[i] + lam[i] * self.store_probs[i]
                j = int(np.argmax(mixed))
                in_store = ids == best
                if in_store.any():
                    best_p = float(mixed[in_store][0])
                if mixed[j] > best_p or (mixed[j] == best_p and ids[j] < best):
                    best, best_p = int(ids[j]), float(mixed[j])
            top1[i] = float(best == self.targets[i])
            confidence[i] = best_p
        return {"nll": nll, "top1": top1, "confidence": confidence}


def walk_text(conn, model, windows: Sequence[Sequence[int]], atom_set: str, *, max_neighbors: int = 100,
              history_weight: float | None = None, history_window: int | None = None, memory: bool = False,
              walk: Walk | None = None, text_index: int = 0,
              on_positions: Callable[[int], None] | None = None) -> Walk:
    """Both distributions at every position of `windows` (token ids; each restarts the context)."""
    from hartonomous.corpus import teacher

    walk = walk if walk is not None else Walk()
    windows = [np.asarray(w, dtype=np.int64) for w in windows if len(w) >= 2]
    if not windows:
        return walk
    forced = teacher.teacher_force(model, windows, log_probs=True)
    for ids, log_probs in zip(windows, forced.log_probs):
        ids = [int(t) for t in ids]
        rows = np.asarray(log_probs, dtype=np.float64)
        n = len(ids) - 1                                       # positions 0 .. n-1 predict ids[1 .. n]
        for first in range(0, n, BATCH):
            last = min(first + BATCH, n)
            steps = sqlcalls.store_distribution(conn, ids[:last], atom_set=atom_set, max_neighbors=max_neighbors,
                                                history_weight=history_weight, history_window=history_window,
                                                memory=memory, positions=last - first)
            for t, step in zip(range(first, last), steps):
                probs = np.exp(rows[t])
                probs /= probs.sum()
                target = ids[t + 1]
                s_ids = np.asarray(step.token_ids, dtype=np.int64)
                s_p = np.asarray(step.probabilities, dtype=np.float64)
                hit = np.nonzero(s_ids == target)[0]
                top = int(np.argmax(probs))
                walk.targets.append(target)
                walk.p_exact.append(float(probs[target]))
                walk.p_store.append(float(s_p[hit[0]]) if len(hit) else 0.0)
                walk.features.append(feature_row(step, probs))
                walk.exact_top.append(top)
                walk.exact_top_p.append(float(probs[top]))
                walk.store_ids.append(s_ids)
                walk.store_probs.append(s_p)
                walk.exact_at_store.append(probs[s_ids] if len(s_ids) else np.empty(0))
                walk.text_index.append(text_index)
                walk.position.append(t)
            if on_positions:
                on_positions(last - first)
    return walk
