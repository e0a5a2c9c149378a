"""Walk a text with both distributions: what fitting a gate and scoring the augmented path need.

At position t of a window x_0..x_n the context is x_0..x_t and the target is the real x_{t+1}. The
exact model's distribution comes from one teacher-forced pass (T = 1, hartonomous.corpus.teacher),
the store's from store_distribution (64 positions per call). Per position the walk keeps what
any λ needs, so a gate can be fitted and the mixture scored without the full vocabulary rows:
p_exact and p_store of the target, the gate's features, the exact argmax and its probability, and
the store's support with the exact probabilities there (the mixture's argmax is the exact argmax
or one of those). `fit_set_gate` walks a set's calibration split (never its test split) and stores
the fitted gate beside the set. Fit time only: the augmented path itself never imports this module.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import psycopg

from hartonomous import sqlcalls
from hartonomous.atomset import load_atom_set, model_name_for
from hartonomous.augment.gate import FEATURES, MIN_POSITIONS, Gate, feature_row, fit_gate, mixture_loss
from hartonomous.augment.gates import check_corpus_labels, save_gate
from hartonomous.errors import UserError

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

    def add(self, exact_probs: np.ndarray, target: int, ids, probs, features: np.ndarray, text_index: int,
            position: int) -> None:
        """One position: the exact distribution (V,), the real next token, the second distribution
        (`ids` ascending, `probs`: the store's, or another model's in its place) and the features."""
        ids = np.asarray(ids, dtype=np.int64)
        probs = np.asarray(probs, dtype=np.float64)
        hit = np.nonzero(ids == target)[0]
        top = int(np.argmax(exact_probs))
        self.targets.append(int(target))
        self.p_exact.append(float(exact_probs[target]))
        self.p_store.append(float(probs[hit[0]]) if len(hit) else 0.0)
        self.features.append(features)
        self.exact_top.append(top)
        self.exact_top_p.append(float(exact_probs[top]))
        self.store_ids.append(ids)
        self.store_probs.append(probs)
        self.exact_at_store.append(exact_probs[ids] if len(ids) else np.empty(0))
        self.text_index.append(int(text_index))
        self.position.append(int(position))

    def matrix(self) -> np.ndarray:
        return np.stack(self.features) if self.features else np.empty((0, len(FEATURES)))

    def has_store(self) -> np.ndarray:
        """Where the store had a distribution (elsewhere the path is the exact model's: λ = 0)."""
        return np.array([len(ids) > 0 for ids in self.store_ids], dtype=bool)

    def fit(self, split: str = "calibration") -> Gate:
        """The gate fitted on the positions where the store had a distribution (only they inform λ)."""
        keep = self.has_store()
        return fit_gate(self.matrix()[keep], np.asarray(self.p_exact)[keep], np.asarray(self.p_store)[keep],
                        split=split)

    def scores(self, lam: np.ndarray) -> dict[str, np.ndarray]:
        """Per position, for the mixture at the given λ (n,): nll of the target, whether the
        mixture's argmax is the target, and the mixture's top probability (for calibration).
        λ is 0 where the store had nothing, as on the path."""
        lam = np.where(self.has_store(), np.asarray(lam, dtype=np.float64), 0.0)
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
              on_positions: Callable[[int], None] | None = None,
              log_probs: Sequence[np.ndarray] | None = None) -> Walk:
    """Both distributions at every position of `windows` (token ids; each restarts the context).

    `log_probs`, one array per window with a row per position (len(window) − 1 rows or more, V
    columns), is the exact model's teacher-forced pass where the caller already has it (compare);
    None: the pass is run here."""
    from hartonomous.corpus import teacher

    walk = walk if walk is not None else Walk()
    if log_probs is not None and len(log_probs) != len(windows):
        raise ValueError(f"log_probs needs one array per window: {len(log_probs)} for {len(windows)} windows")
    pairs = [(np.asarray(w, dtype=np.int64), lp) for w, lp in zip(windows, [None] * len(windows) if log_probs is None else log_probs)
             if len(w) >= 2]
    if not pairs:
        return walk
    if log_probs is None:
        forced = teacher.teacher_force(model, [w for w, _ in pairs], log_probs=True)
        pairs = [(w, lp) for (w, _), lp in zip(pairs, forced.log_probs)]
    offset = 0                                                 # positions count on across windows
    for ids, log_p in pairs:
        ids = [int(t) for t in ids]
        rows = np.asarray(log_p, dtype=np.float64)
        n = len(ids) - 1                                       # positions 0 .. n-1 predict ids[1 .. n]
        for first in range(0, n, BATCH):
            last = min(first + BATCH, n)
            steps = sqlcalls.store_distribution(conn, ids[:last], atom_set=atom_set, max_neighbors=max_neighbors,
                                                history_weight=history_weight, history_window=history_window,
                                                memory=memory, positions=last - first)
            for t, step in zip(range(first, last), steps):
                probs = np.exp(rows[t])
                probs /= probs.sum()
                walk.add(probs, ids[t + 1], step.token_ids, step.probabilities, feature_row(step, probs),
                         text_index, offset + t)
            if on_positions:
                on_positions(last - first)
        offset += n
    return walk


def calibration_windows(text: str, tokenizer, max_positions: int | None = None) -> list:
    """The calibration text's token ids in the walk's windows (each restarts the context)."""
    from hartonomous.corpus import teacher

    ids = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    if max_positions is not None:
        ids = ids[:max_positions + 1]
    return teacher.windows(ids, WINDOW)


def positions_in(windows) -> int:
    """How many positions a walk of these windows scores."""
    return sum(max(len(w) - 1, 0) for w in windows)


def fit_set_gate(conn: psycopg.Connection, atom_set: str, *, model=None, tokenizer=None,
                 max_positions: int | None = None, max_neighbors: int = 100,
                 on_positions: Callable[[int], None] | None = None,
                 on_total: Callable[[int], None] | None = None) -> Gate:
    """Fit the set's gate on its calibration split and save it; returns it."""
    from hartonomous.compare.atomset import holdout_text

    info = load_atom_set(conn, atom_set)
    check_corpus_labels(info)
    text = holdout_text(info, "calibration").text
    if model is None or tokenizer is None:
        from hartonomous.model import load_model, load_tokenizer

        name = model_name_for(info)
        model, tokenizer = load_model(name, "cpu"), load_tokenizer(name)
    if int(model.config.vocab_size) < info.vocab_size:
        raise UserError(f"the model has {model.config.vocab_size} tokens but atom set '{info.name}' has "
                        f"{info.vocab_size}; use the model the set was built from")
    windows = calibration_windows(text, tokenizer, max_positions)
    if positions_in(windows) < MIN_POSITIONS:
        raise UserError(f"atom set '{info.name}' has {positions_in(windows)} calibration positions; a gate needs at "
                        f"least {MIN_POSITIONS} (build from a larger corpus, or a larger --holdout-chars)")
    if on_total:
        on_total(positions_in(windows))
    start = time.perf_counter()
    walk = walk_text(conn, model, windows, info.name, max_neighbors=max_neighbors, on_positions=on_positions)
    gate = walk.fit()
    gate = Gate(gate.features, gate.means, gate.scales, gate.coefficients, gate.intercept, gate.calibration_loss,
                gate.exact_loss, gate.positions, gate.split, gate.version,
                {"max_neighbors": max_neighbors, "window": WINDOW, "seconds": round(time.perf_counter() - start, 1),
                 "model": info.model_key or info.model})
    save_gate(conn, info.name, gate)
    return gate
