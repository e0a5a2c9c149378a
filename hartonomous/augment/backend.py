"""The augmented path: the exact model and the atom store, mixed by the set's gate at every step.

Per step: the exact runtime's logits (KV cache, as the exact path), the store's distribution with
its features (SQL store_distribution, one call, asked for on the store's own thread while the exact
model runs its forward), λ from the gate, then `mixture.mixed_probs`. For
speculative decoding with the augmented distribution as the target, `score` verifies a draft: one
exact forward and one store call for all k + 1 positions (store_distribution's `positions`).
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch

from hartonomous import sqlcalls
from hartonomous.augment.gate import Gate, feature_row
from hartonomous.augment.mixture import mixed_probs
from hartonomous.backends.base import Distribution
from hartonomous.backends.exact import ExactBackend, ExactState, ordered_distribution
from hartonomous.errors import InvalidArgument, UserError
from hartonomous.generation_config import SamplerArgs

MAX_POSITIONS = 64          # store_distribution's bound on positions per call (sql/090_store.sql)


@dataclass
class AugmentedState:
    exact: ExactState
    weight: float | None = None        # this step's λ (after `distribution`)
    store_top: int | None = None       # this step's most probable store token (None: the store had none)
    stats: "AugmentedStats" = field(default_factory=lambda: AugmentedStats())
    # The store's rows for the next step, asked for while the exact model runs its forward: (ids, future)
    pending: tuple[list[int], Future] | None = field(default=None, repr=False)

    @property
    def ids(self) -> list[int]:
        return self.exact.ids


@dataclass
class AugmentedStats:
    """How much the store weighed in over a generation."""

    steps: int = 0
    weight_sum: float = 0.0
    store_top_picked: int = 0
    store_tops: list = field(default_factory=list, repr=False)   # per step: the store's top token (or None)
    picked: int = field(default=0, repr=False)                    # steps whose pick was counted

    @property
    def mean_weight(self) -> float | None:
        return self.weight_sum / self.steps if self.steps else None

    def record(self, weight: float, store_top: int | None) -> None:
        """A step's λ and the store's top token, as its distribution is made."""
        self.steps += 1
        self.weight_sum += weight
        self.store_tops.append(store_top)

    def pick(self, token_id: int) -> None:
        """The token picked at the next uncounted step (fed back through `advance`)."""
        if self.picked < len(self.store_tops):
            self.store_top_picked += int(self.store_tops[self.picked] == token_id)
            self.picked += 1

    def settle(self, token_ids: list[int]) -> None:
        """Count the picks from a finished generation's tokens: the engine never feeds its last pick
        back through `advance` (hartonomous.client does this for every augmented result)."""
        for token_id in token_ids[self.picked:]:
            self.pick(token_id)

    def as_dict(self) -> dict:
        return {"steps": self.steps, "mean_weight": self.mean_weight, "store_top_picked": self.store_top_picked}


class AugmentedBackend:
    """(1 − λ) p_exact + λ p_store with λ from the atom set's gate (`weight` overrides it: experiments)."""

    name = "augmented"
    supports_trees = False         # as a speculative target: chains only (see `score`)

    def __init__(self, exact: ExactBackend, conn, atom_set, gate: Gate, *, max_neighbors: int = 100,
                 history_weight: float | None = None, history_window: int | None = None, memory: bool = False,
                 weight: float | None = None):
        if weight is not None and not (isinstance(weight, (int, float)) and 0.0 <= weight <= 1.0):
            raise InvalidArgument("weight", f"weight (λ) must lie in [0, 1], got {weight}")
        self.exact, self.conn, self.atom_set, self.gate = exact, conn, atom_set, gate
        self.tokenizer = exact.tokenizer
        self.max_neighbors, self.history_weight, self.history_window = max_neighbors, history_weight, history_window
        self.memory, self.fixed_weight = bool(memory), weight
        self.model = exact.model
        # store_distribution's C step keeps per-session state for a growing context (rows layout, no memory)
        self.native = sqlcalls.kernel(conn) == "native" and atom_set.layout != "tiles" and not self.memory
        # Every store call runs on this one thread, so the connection is never used by two at once.
        self._store_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="augmented-store")

    @property
    def atom_set_name(self) -> str:
        return self.atom_set.name

    def eos_token_ids(self) -> set[int]:
        return self.exact.eos_token_ids()

    # -- one step at a time ----------------------------------------------------------------

    def start(self, prompt_ids: list[int]) -> AugmentedState:
        ids = [int(i) for i in prompt_ids]
        pending = self._ask_store(ids)                 # the database works while the prompt is prefilled
        try:
            state = AugmentedState(self.exact.start(ids))
        except BaseException:
            pending[1].cancel()
            raise
        state.pending = pending
        return state

    def distribution(self, state: AugmentedState, sampler: SamplerArgs) -> Distribution:
        if state.exact.logits is None:
            state.exact.logits = self.exact.score_logits(state.exact, [])[0]
        steps = None
        if state.pending is not None:
            asked, future = state.pending
            state.pending = None
            steps = future.result() if asked == state.ids else None
        probs = self._mix(state.exact.logits[None], state.ids, [], sampler, state, steps)[0]
        if state.weight is not None and not math.isnan(state.weight):
            state.stats.record(state.weight, state.store_top)
        return ordered_distribution(probs)

    def advance(self, state: AugmentedState, token_id: int) -> None:
        """Append a token: the store's next rows are asked for on the store's own thread while the
        exact model runs its forward on this one (the two depend only on the token), so a step costs
        about the larger of the two, not their sum."""
        state.stats.pick(int(token_id))
        if state.pending is not None:                   # a step whose distribution was never asked for
            state.pending[1].cancel()
        state.pending = self._ask_store(state.ids + [int(token_id)])
        self.exact.advance(state.exact, token_id)

    def close(self) -> None:
        self._store_thread.shutdown(wait=True)
        self.exact.close()

    def _ask_store(self, ids: list[int]) -> tuple[list[int], Future]:
        return list(ids), self._store_thread.submit(self.store_steps, list(ids), 1)

    # -- speculative verification (the target distribution is the augmented one) -------------

    def begin(self, prompt_ids: list[int]) -> AugmentedState:
        return AugmentedState(self.exact.begin(prompt_ids))

    def score(self, state: AugmentedState, draft: list[int], sampler: SamplerArgs) -> torch.Tensor:
        """(k + 1, V): row j is the augmented distribution after ids + draft[:j]."""
        logits = self.exact.score_logits(state.exact, draft)
        return self._mix(logits, state.ids, draft, sampler, None)

    def accept(self, state: AugmentedState, fed: list[int], tokens: list[int]) -> None:
        self.exact.accept(state.exact, fed, tokens)

    # -- helpers ---------------------------------------------------------------------------

    def store_context(self, ids: list[int], positions: int = 1) -> list[int]:
        """The ids the store reads for the last `positions` prefixes of ids. On the native kernel with
        the rows layout, all of them: its C step keeps the keys of the contexts it served per
        session and computes only the new tokens' (as next_token's; hartonomous.backends.spatial).
        Elsewhere the key window plus the history window before each prefix (earlier ids change nothing)."""
        if self.native:
            return ids
        window = self.atom_set.centroid_window
        reach = self.atom_set.history_window if self.history_window is None else self.history_window
        return ids if window is None else ids[-(window + reach + positions):]

    def store_steps(self, ids: list[int], positions: int):
        """The store's distributions for the last `positions` prefixes of ids, oldest first (one
        call per MAX_POSITIONS of them)."""
        steps, n = [], len(ids)
        for first in range(n - positions + 1, n + 1, MAX_POSITIONS):       # prefix lengths
            last = min(first + MAX_POSITIONS - 1, n)
            take = last - first + 1
            steps += sqlcalls.store_distribution(self.conn, self.store_context(ids[:last], take),
                                                 atom_set=self.atom_set.name, max_neighbors=self.max_neighbors,
                                                 history_weight=self.history_weight,
                                                 history_window=self.history_window, memory=self.memory,
                                                 positions=take)
        return steps

    def weights(self, steps, exact_probs: torch.Tensor, entropies: torch.Tensor | None = None) -> np.ndarray:
        """λ per row: the override, else the gate on each step's features (exact_probs: (rows, V)
        float64, the exact model's distribution at T = 1; entropies: theirs, if known)."""
        if self.fixed_weight is not None:
            return np.where([bool(s.token_ids) for s in steps], float(self.fixed_weight), 0.0)
        h = [None] * len(steps) if entropies is None else entropies.tolist()
        rows = np.stack([feature_row(s, p, e) for s, p, e in zip(steps, exact_probs.cpu().numpy(), h)])
        return np.where([bool(s.token_ids) for s in steps], self.gate.weights(rows), 0.0)   # no store: exact

    def _mix(self, logits: torch.Tensor, ids: list[int], draft: list[int], sampler: SamplerArgs,
             state: AugmentedState | None, steps: list | None = None) -> torch.Tensor:
        if steps is None:
            steps = self._store_thread.submit(self.store_steps, ids + draft, len(draft) + 1).result()
        l64 = logits.detach().to(torch.float64)
        lse = torch.logsumexp(l64, -1, keepdim=True)
        exact_probs = torch.exp(l64 - lse)                         # softmax, and H = lse − Σ p l below
        entropies = lse[:, 0] - (exact_probs * l64).sum(-1)       # finite logits: no 0 · −inf terms
        lams = self.weights(steps, exact_probs, entropies)
        rows = []
        for j, (step, lam) in enumerate(zip(steps, lams)):
            rows.append(mixed_probs(logits[j], step.token_ids, step.probabilities, float(lam),
                                    ids + draft[:j], sampler, exact_probs=exact_probs[j]))
        if state is not None:
            step = steps[-1]
            state.weight = float(lams[-1])
            state.store_top = (int(step.token_ids[int(np.argmax(step.probabilities))]) if step.token_ids else None)
        return torch.stack(rows)


def check_compatible(atom_set, model) -> None:
    """The store must predict over the exact model's tokens: same model, same vocabulary."""
    vocab = int(getattr(model, "vocab_size", 0) or model.config.vocab_size)   # runtimes' vocab_size; HF's config
    if atom_set.vocab_size > vocab:
        raise UserError(f"atom set '{atom_set.name}' has {atom_set.vocab_size} tokens but the exact model has {vocab}; "
                        "use a set built from this model")
