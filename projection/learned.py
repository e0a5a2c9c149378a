"""Learned token positions (`build --positions learned`): gradient descent on every token's 3D position.

Without history atoms, `next_token` over merged atoms is a kernel mixture: for a query whose K
nearest stored contexts are n_1..n_K (each context = one atom key carrying its atoms),

    q(j) = sum_i alpha_i r_{n_i}(j),    alpha_i ∝ s_{n_i} exp(-|key - key_{n_i}|^2 / h^2)

where key is the context centroid (hartonomous.centroid: window W, decay), r_n the normalised
weights of context n's atoms and s_n their total (the per-token log-sum-exp of the Gaussian
kernel followed by the softmax is exactly this mixture). Training minimises, averaged over the
DISTINCT training contexts (their last W token ids), KL(y_c || (1 - ε) q_c + ε / V), with y_c the
exact model's soft labels of c (summed over its occurrences, its `targets` largest kept) and q_c
predicted from c's K nearest OTHER contexts: leave-one-context-out, so the only way to lower the
loss is to put contexts with similar continuations near each other, which is what a context never
seen in training needs. Averaging over distinct contexts rather than positions weighs rare
contexts, which resemble unseen ones, like frequent ones.

Parameters: the token positions (initialised from the projection), the kernel bandwidth (its
log), and optionally the centroid decay: per-lag weights decay^k, the only per-lag weights SQL's
`context_centroid` can represent, so the set keeps working unchanged. The KNN is recomputed with a
KD-tree (scipy cKDTree) at the start of every epoch; within an epoch the neighbours are fixed and
the gradient flows through the kernel weights alpha (both the query's and the neighbours' keys
move). An L2 penalty holds the positions near their start (in units of the initial spread). Every
epoch is validated on the calibration half exactly as the build calibrates (projection.calibrate:
the `max_neighbors` nearest stored atoms, the bandwidth re-fitted; with a history window the
history weight and h chosen as projection.history does, by --calibrate-by), and the best epoch is
kept; epoch 0 is the starting point, so training that does not help returns the
projection unchanged. Training stops after `patience` epochs without improvement.

Tokens no training context contains get no gradient; each of them is moved by the mean
displacement of its nearest trained tokens in the embedding space (before every validation and at
the end), so a context of unseen tokens (off-domain text) lands where its embedding neighbours went.

Pure NumPy/torch, no database: tests/test_learned_positions.py runs it on synthetic corpora.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from scipy.spatial import cKDTree

from hartonomous.errors import UserError
from hartonomous.threads import fixed_threads
from projection import calibrate as cal
from hartonomous.atomset import AtomRows
from projection.atoms import context_keys, merge_atoms
from projection.history import HISTORY_GRID, choose_history_weight, history_pairs

SMOOTHING = cal.SMOOTHING
DEFAULT_EPOCHS = 30
DEFAULT_LEARNING_RATE = 0.01   # Adam step, in units of the initial positions' spread
NEIGHBOUR_CONTEXTS = 16        # K nearest other contexts per training context
TARGETS_PER_CONTEXT = 16       # the largest soft labels of a context kept in the loss
REGULARISATION = 0.01          # weight of the mean squared displacement (units of spread^2)
PATIENCE = 5                   # epochs without a better calibration score before stopping
BATCH_CONTEXTS = 4096
MIN_STEPS = 20                 # optimiser steps per epoch (small sets: several passes)
CARRY_NEIGHBOURS = 8           # trained tokens whose displacement an untrained token takes
MAX_WINDOW = 64


@dataclass(frozen=True)
class Contexts:
    """The distinct contexts of the training positions and their merged atoms.

    ids[c] are context c's last W token ids, oldest first, -1 in front when the context is
    shorter than W (the first positions of a chunk). Atoms (pair_*) are sorted by (context,
    token); one atom per distinct (context, token) with the summed weight, exactly the build's
    merged atoms (merge_radius 0). targets/target_probs: the context's largest atoms, normalised.
    """

    ids: np.ndarray
    pair_context: np.ndarray
    pair_token: np.ndarray
    pair_weight: np.ndarray
    mass: np.ndarray
    targets: np.ndarray
    target_probs: np.ndarray
    vocab_size: int

    @property
    def count(self) -> int:
        return int(len(self.ids))

    @property
    def window(self) -> int:
        return int(self.ids.shape[1])


def distinct_contexts(chunks: list[np.ndarray], label_ids: list[np.ndarray], label_probs: list[np.ndarray] | None,
                      window: int, vocab_size: int, targets: int = TARGETS_PER_CONTEXT) -> Contexts:
    """Contexts of positions t = 0..n-2 of every chunk; label_ids[i][t] (k,) or (,) are the labels
    after token t (label_probs the matching weights; None: weight 1 each, as argmax atoms)."""
    if window is None or not 1 <= window <= MAX_WINDOW:
        raise UserError(f"--positions learned needs a finite centroid window of 1-{MAX_WINDOW} tokens, got {window}")
    rows, ids, probs = [], [], []
    for i, chunk in enumerate(chunks):
        chunk = np.asarray(chunk, dtype=np.int64)
        padded = np.concatenate([np.full(window - 1, -1, dtype=np.int64), chunk])
        rows.append(np.lib.stride_tricks.sliding_window_view(padded, window)[:len(chunk) - 1])
        lab = np.asarray(label_ids[i], dtype=np.int64).reshape(len(chunk), -1)[:-1]
        ids.append(lab)
        probs.append(np.ones(lab.shape) if label_probs is None
                     else np.asarray(label_probs[i], dtype=np.float64).reshape(lab.shape[0] + 1, -1)[:-1])
    if not rows:
        raise UserError("--positions learned needs training text")
    unique, inverse = np.unique(np.concatenate(rows), axis=0, return_inverse=True)
    lab_ids, lab_probs = np.concatenate(ids), np.concatenate(probs)
    context = np.repeat(inverse.reshape(-1), lab_ids.shape[1])
    keep = lab_probs.ravel() > 0
    key = context[keep] * vocab_size + lab_ids.ravel()[keep]
    pair_key, pair_of = np.unique(key, return_inverse=True)
    weight = np.bincount(pair_of.reshape(-1), weights=lab_probs.ravel()[keep])
    pair_context, pair_token = pair_key // vocab_size, pair_key % vocab_size
    mass = np.bincount(pair_context, weights=weight, minlength=len(unique))
    # the largest `targets` atoms of every context, normalised
    order = np.lexsort((-weight, pair_context))
    starts = np.searchsorted(pair_context[order], np.arange(len(unique)))
    rank = np.arange(len(order)) - starts[pair_context[order]]
    kept = order[rank < targets]
    t_ids = np.zeros((len(unique), targets), dtype=np.int64)
    t_probs = np.zeros((len(unique), targets))
    t_ids[pair_context[kept], rank[rank < targets]] = pair_token[kept]
    t_probs[pair_context[kept], rank[rank < targets]] = weight[kept]
    t_probs /= t_probs.sum(1, keepdims=True)
    return Contexts(unique, pair_context, pair_token, weight, mass, t_ids, t_probs, vocab_size)


@dataclass(frozen=True)
class Validation:
    """The calibration half as the build scores it: its chunks and the exact argmax at every atom
    position (stacked like context_keys), and how the build calibrates."""

    chunks: list[np.ndarray]
    targets: np.ndarray
    kernel: str = "gaussian"
    max_neighbors: int = 100
    objective: str = "log-likelihood"   # how epochs are ranked (and h fitted without history atoms)
    history_window: int = 0             # > 0: score with history atoms, as calibrate_history does
    history_weight: float | None = None  # None: the weight chosen on HISTORY_GRID; else this one
    criterion: str = "loglik"           # --calibrate-by, with history atoms
    bandwidth_objective: str = "log-likelihood"
    atoms: Callable[[np.ndarray, float], AtomRows] | None = None  # the build's atoms for (positions, decay)


KEEP_EPOCH = ("best", "last")


def check_training(epochs: int, learning_rate: float, keep: str = "best") -> None:
    """The checks on --epochs, --learning-rate and --keep-epoch."""
    if keep not in KEEP_EPOCH:
        raise UserError(f"--keep-epoch must be one of {', '.join(KEEP_EPOCH)}, got '{keep}'")
    if epochs < 0:
        raise UserError(f"--epochs must be >= 0, got {epochs}")
    if not (learning_rate > 0 and math.isfinite(learning_rate)):
        raise UserError(f"--learning-rate must be a positive number, got {learning_rate}")


@dataclass(frozen=True)
class Settings:
    window: int
    decay: float
    epochs: int = DEFAULT_EPOCHS
    learning_rate: float = DEFAULT_LEARNING_RATE
    learn_decay: bool = False
    learn_bandwidth: bool = True
    neighbours: int = NEIGHBOUR_CONTEXTS
    regularisation: float = REGULARISATION
    patience: int = PATIENCE
    batch_contexts: int = BATCH_CONTEXTS
    seed: int = 0
    keep: str = "best"  # best: the best epoch on the calibration half; last: the last epoch run (a diagnostic)

    def check(self) -> None:
        check_training(self.epochs, self.learning_rate, self.keep)


@dataclass
class Learned:
    """The best epoch's positions, decay and trained bandwidth, and the record of the run."""

    positions: np.ndarray
    decay: float
    bandwidth: float
    best_epoch: int
    stopped_early: bool
    seconds: float
    curve: list[dict] = field(default_factory=list)
    contexts: int = 0
    trained_tokens: int = 0
    carried_tokens: int = 0
    displacement: dict = field(default_factory=dict)


def _keys(torch, positions, ids, log_decay_weights):
    """Context centroids of `ids` (..., W) with per-lag log weights (W,), oldest first (torch)."""
    valid = ids >= 0
    w = torch.exp(log_decay_weights) * valid
    p = positions[ids.clamp(min=0)]
    return (w.unsqueeze(-1) * p).sum(-2) / w.sum(-1, keepdim=True)


def _neighbours(keys: np.ndarray, k: int) -> np.ndarray:
    """The k nearest OTHER contexts of every context (C, k), by a KD-tree."""
    n = len(keys)
    k = min(k, n - 1)
    _, idx = cKDTree(keys).query(keys, k=k + 1)
    idx = idx.reshape(n, k + 1)
    is_self = idx == np.arange(n)[:, None]
    drop = is_self.copy()
    drop[~is_self.any(1), -1] = True  # self tied out of the k + 1: drop the farthest instead
    return idx[~drop].reshape(n, k)


def _lookup(contexts: Contexts, neighbours: np.ndarray) -> np.ndarray:
    """R[c, i, s] = r_{neighbour i of c}(target token s of c): the neighbour's normalised atom weight."""
    table = contexts.pair_context * contexts.vocab_size + contexts.pair_token
    share = contexts.pair_weight / contexts.mass[contexts.pair_context]
    out = np.zeros(neighbours.shape + (contexts.targets.shape[1],))
    for lo in range(0, len(neighbours), 8192):  # bounded temporaries
        want = neighbours[lo:lo + 8192, :, None] * contexts.vocab_size + contexts.targets[lo:lo + 8192, None, :]
        at = np.minimum(np.searchsorted(table, want), len(table) - 1)
        out[lo:lo + 8192] = np.where(table[at] == want, share[at], 0.0)
    return out * (contexts.target_probs[:, None, :] > 0)


def validate(positions: np.ndarray, decay: float, window: int, contexts: Contexts, validation: Validation,
             keys: np.ndarray | None = None) -> dict:
    """The build's calibration of these positions on the calibration half: h re-fitted, scores; with
    a history window, the history weight and h chosen as projection.stages.calibrate_history does."""
    if keys is None:
        keys = context_centroids(positions, contexts.ids, decay)
    queries = context_keys(validation.chunks, positions, window, decay)
    # the build's own atoms when given (its keys, its merge, its order: the same KD-tree ties as the
    # set's calibration); else the contexts' atoms merged the build's way
    if validation.atoms is not None:
        atoms = validation.atoms(positions, decay)
    else:
        atoms = merge_atoms(AtomRows(contexts.pair_token, keys[contexts.pair_context], contexts.pair_weight, None),
                            0.0)
    nb = cal.nearest_atoms(atoms.positions, atoms.token_ids, atoms.weights, queries, validation.max_neighbors)
    if validation.history_window <= 0 or validation.history_weight == 0:
        return cal.calibrate_bandwidth(nb, validation.targets, validation.kernel, contexts.vocab_size,
                                       validation.objective)
    stored = cal.calibrate_bandwidth(nb, validation.targets, validation.kernel, contexts.vocab_size,
                                     validation.bandwidth_objective)
    pairs = history_pairs(validation.chunks, positions, window, decay, validation.history_window)
    fixed = validation.history_weight
    grid, only = ((0.0, fixed), fixed) if fixed is not None else (HISTORY_GRID, None)
    return choose_history_weight(nb, stored, pairs, validation.targets, validation.kernel, contexts.vocab_size,
                                 validation.bandwidth_objective, grid=grid, criterion=validation.criterion,
                                 only=only).final


def context_centroids(positions: np.ndarray, ids: np.ndarray, decay: float) -> np.ndarray:
    """NumPy keys of contexts `ids` (C, W), as hartonomous.centroid defines them."""
    w = float(decay) ** np.arange(ids.shape[1] - 1, -1, -1, dtype=np.float64)
    wm = w * (ids >= 0)
    return np.einsum("cw,cwd->cd", wm, np.asarray(positions, dtype=np.float64)[np.maximum(ids, 0)]) / wm.sum(1)[:, None]


def _rank(row: dict, objective: str) -> tuple[float, float]:
    """A curve row's calibration score, best highest (ties: the other metric)."""
    ll, top1 = row["calibration_log_likelihood"], row["calibration_top1"]
    return (top1, ll) if objective == "top1" else (ll, top1)


def carrier(trained: np.ndarray, embeddings: np.ndarray | None,
            k: int = CARRY_NEIGHBOURS) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """carry(initial, learned): every untrained token moved by the mean displacement of its k nearest
    trained tokens in the embedding space (found once); no embeddings: untrained tokens stay."""
    untrained, source = np.flatnonzero(~trained), np.flatnonzero(trained)
    if embeddings is None or len(untrained) == 0 or len(source) == 0:
        return lambda initial, learned: learned
    _, idx = cal.knn(np.asarray(embeddings[source], dtype=np.float32), np.asarray(embeddings[untrained], np.float32),
                     min(k, len(source)))

    def carry(initial: np.ndarray, learned: np.ndarray) -> np.ndarray:
        out = learned.copy()
        out[untrained] = initial[untrained] + (learned[source] - initial[source])[idx].mean(axis=1)
        return out

    return carry


def learn(initial: np.ndarray, contexts: Contexts, validation: Validation, settings: Settings,
          embeddings: np.ndarray | None = None, advance: Callable[[int], None] | None = None,
          log: Callable[[str], None] | None = None) -> Learned:
    """Train the positions (and bandwidth, optionally the decay); the best epoch by the calibration
    objective is returned (epoch 0 = `initial` as given). Gradients are enabled for the duration
    (hartonomous.model.load_model turns them off process-wide), on a fixed number of threads
    (hartonomous.threads: the same run gives the same positions)."""
    import torch

    with torch.enable_grad(), fixed_threads():
        return _learn(torch, initial, contexts, validation, settings, embeddings, advance, log)


def _learn(torch, initial: np.ndarray, contexts: Contexts, validation: Validation, settings: Settings,
           embeddings: np.ndarray | None, advance: Callable[[int], None] | None,
           log: Callable[[str], None] | None) -> Learned:
    settings.check()
    started = time.perf_counter()
    torch.manual_seed(settings.seed)
    rng = np.random.default_rng(settings.seed)
    initial = np.asarray(initial, dtype=np.float64)
    V, W = len(initial), contexts.window
    if W != settings.window:
        raise ValueError(f"contexts have window {W}, settings say {settings.window}")
    if contexts.count < 2:
        raise UserError("--positions learned needs at least two distinct training contexts")
    centre = initial.mean(0)
    spread = float(np.sqrt(((initial - centre) ** 2).sum(1).mean())) or 1.0
    start = torch.tensor((initial - centre) / spread)
    pos = start.clone().requires_grad_(True)
    decay0 = min(max(settings.decay, 1e-6), 1 - 1e-6)
    decay_logit = torch.tensor(math.log(decay0 / (1 - decay0)), dtype=torch.float64,
                               requires_grad=settings.learn_decay)
    lags = torch.arange(W - 1, -1, -1, dtype=torch.float64)
    ids = torch.from_numpy(contexts.ids)
    used = np.unique(contexts.ids[contexts.ids >= 0])
    trained = np.zeros(V, dtype=bool)
    trained[used] = True
    used_t = torch.from_numpy(used)
    y = torch.from_numpy(contexts.target_probs)
    entropy = -(y * torch.log(torch.where(y > 0, y, torch.ones_like(y)))).sum(1)
    eps_v = SMOOTHING / contexts.vocab_size

    def decay_now():
        return torch.sigmoid(decay_logit) if settings.learn_decay else torch.tensor(settings.decay, dtype=torch.float64)

    def log_lag_weights():
        return lags * torch.log(decay_now())

    carry = carrier(trained, embeddings)

    def current() -> tuple[np.ndarray, float]:
        with torch.no_grad():
            return carry(initial, pos.numpy() * spread + centre), float(decay_now())

    def losses(batch, nb_t, log_mass, R, log_h) -> "torch.Tensor":
        lw = log_lag_weights()
        kq = _keys(torch, pos, ids[batch], lw)
        kn = _keys(torch, pos, ids[nb_t[batch]], lw)
        d2 = ((kq.unsqueeze(1) - kn) ** 2).sum(-1)
        alpha = torch.softmax(log_mass[batch] - d2 * torch.exp(-2 * log_h), dim=1)
        q = (alpha.unsqueeze(-1) * R[batch]).sum(1)
        ce = -(y[batch] * torch.log((1 - SMOOTHING) * q + eps_v)).sum(1)
        return ce - entropy[batch]

    def epoch_data():
        with torch.no_grad():
            keys = _keys(torch, pos, ids, log_lag_weights()).numpy()
        nb = _neighbours(keys, settings.neighbours)
        return (torch.from_numpy(nb), torch.from_numpy(np.log(contexts.mass[nb])),
                torch.from_numpy(_lookup(contexts, nb)), keys)

    everyone = torch.arange(contexts.count)
    nb_t, log_mass, R, keys = epoch_data()
    # the trained bandwidth starts at the best point of a geometric grid for the training loss
    d_med = float(np.median(np.linalg.norm(keys[nb_t.numpy()[:, 0]] - keys, axis=1))) or 1.0
    grid = [math.log(d_med) + math.log(2.0) * s / 2 for s in range(-12, 9)]
    with torch.no_grad():
        log_h0 = min(grid, key=lambda g: float(losses(everyone, nb_t, log_mass, R, torch.tensor(g)).mean()))
    log_h = torch.tensor(log_h0, dtype=torch.float64, requires_grad=settings.learn_bandwidth)
    params = [pos] + ([log_h] if settings.learn_bandwidth else []) + ([decay_logit] if settings.learn_decay else [])
    optimiser = torch.optim.Adam(params, lr=settings.learning_rate)

    def train_loss() -> float:
        with torch.no_grad():
            return float(losses(everyone, nb_t, log_mass, R, log_h).mean())

    def record(epoch: int, train_kl: float, seconds: float) -> dict:
        positions, decay = current() if epoch else (initial, settings.decay)
        v = validate(positions, decay, W, contexts, validation)
        with torch.no_grad():
            moved = float(((pos[used_t] - start[used_t]) ** 2).sum(1).mean().sqrt())
        return {"epoch": epoch, "train_kl": train_kl, "calibration_log_likelihood": v["log_likelihood"],
                "calibration_top1": v["top1"], "calibration_h": v["h"],
                "trained_h": float(torch.exp(log_h.detach())) * spread, "decay": decay, "rms_displacement": moved,
                "seconds": seconds}

    curve = [record(0, train_loss(), time.perf_counter() - started)]
    best_score = _rank(curve[0], validation.objective)
    best = (0, initial.copy(), settings.decay, float(torch.exp(log_h.detach())) * spread)
    if log:
        log(_describe(curve[0]))
    stale = 0
    stopped_early = False
    for epoch in range(1, settings.epochs + 1):
        if epoch > 1:
            nb_t, log_mass, R, _ = epoch_data()
        total = 0.0
        batches = _batches(rng, contexts.count, settings.batch_contexts)
        for batch in batches:
            kl = losses(batch, nb_t, log_mass, R, log_h)
            penalty = ((pos[used_t] - start[used_t]) ** 2).sum(1).mean()
            loss = kl.mean() + settings.regularisation * penalty
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += float(kl.detach().sum())
        row = record(epoch, total / sum(map(len, batches)), time.perf_counter() - started)
        curve.append(row)
        if log:
            log(_describe(row))
        if advance:
            advance(1)
        improved = _rank(row, validation.objective) > best_score
        if improved:
            best_score, stale = _rank(row, validation.objective), 0
        else:
            stale += 1
        if improved or settings.keep == "last":
            best = (epoch, *current(), float(torch.exp(log_h.detach())) * spread)
        if settings.keep == "best" and stale >= settings.patience:
            stopped_early = epoch < settings.epochs
            break
    best_epoch, positions, decay, bandwidth = best
    shift = np.linalg.norm(positions - initial, axis=1)
    return Learned(positions, decay, bandwidth, best_epoch, stopped_early, time.perf_counter() - started, curve,
                   contexts.count, int(trained.sum()), int((~trained).sum()) if embeddings is not None else 0,
                   {"spread": spread, "trained_mean": float(shift[trained].mean()),
                    "trained_max": float(shift[trained].max()),
                    "untrained_mean": float(shift[~trained].mean()) if (~trained).any() else 0.0,
                    "bounds_min": positions.min(0).tolist(), "bounds_max": positions.max(0).tolist()})


def _batches(rng: np.random.Generator, n: int, size: int) -> list:
    """One epoch's mini-batches: shuffled passes over the n contexts, at least MIN_STEPS of them."""
    import torch

    out: list = []
    while len(out) < MIN_STEPS:
        order = torch.from_numpy(rng.permutation(n))
        out += [order[lo:lo + size] for lo in range(0, n, size)]
    return out


def _describe(row: dict) -> str:
    return (f"epoch {row['epoch']}: train KL {row['train_kl']:.4f}, calibration top-1 {row['calibration_top1']:.3f}, "
            f"log-likelihood {row['calibration_log_likelihood']:.3f} (h={row['calibration_h']:.4g})")
