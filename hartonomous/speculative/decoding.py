"""Speculative decoding: the spatial path drafts, the exact model verifies (docs/design.md, "Speculative decoding").

Per round, with i the position of the next output token (0 = the first generated one):
1. the database drafts n = min(k, tokens left) tokens for positions i .. i+n-1 in one call (SQL
   `draft_tokens`), each with the draft distribution q it was drawn from;
2. the exact model scores the tokens not yet cached plus the draft in one forward, which gives p
   (the exact path's distribution) at every drafted position; a full draft's last token is not
   fed, as the next round's forward feeds it;
3. positions are decided in order. A drafted token x is kept -- greedy (T = 0): if it is the exact
   argmax; sampling (T > 0): if u < min(1, p(x) / q(x)) -- or the round ends with a replacement:
   the argmax, or a draw from normalise(max(0, p - q)) (Leviathan et al. 2023; Chen et al. 2023).
   A position the drafter had nothing for (no candidates, or it stopped after a stop token) is
   drawn from p. p and q are both after the shared sampler's warpers (repetition penalty,
   temperature, top-k, top-p), so every output token is distributed exactly as on the exact path,
   and greedy output is the exact path's token for token;
4. the KV cache is rolled back past the rejected draft tokens.
The draft length adapts. With forward costs measured at start-up (`costs`, hartonomous/speculative/draft_cost.py;
what the client and the server pass) the first round drafts `draft_tokens` and every later one
the length with the most expected tokens per second given the running acceptance and the measured
cost of feeding that many tokens (CostShapedPolicy); at T > 0 (chains only) its "plain" rounds draft one token
(a forward of one token, judged by the acceptance rule), so every output position is decided by
the same rule whatever the timings. With `learned` (a server's or a Client's DraftLearning,
hartonomous/speculative/learned.py) a run starts, its first round included, from what the last run
of its kind learned, where that cannot change the sample. Without costs (the legacy schedule):
after a full acceptance it grows by 2, after a rejection it shrinks by 1, within [1, max_draft_tokens]. When drafts rarely survive, drafting costs more than it saves: if
the acceptance rate over the last ACCEPTANCE_WINDOW judged draft tokens falls below
`min_acceptance` (the break-even, see DraftPolicy), the next `probe_every` rounds draft nothing
(a plain exact step: one token per forward, no database call), then one 1-token draft probes
again; a kept probe resumes drafting with a fresh window. A round never decides more tokens than max_new_tokens leaves; the
engine applies stop tokens, EOS and stop strings to the tokens as they come.

Randomness (T > 0), for output position i of a generation with seed S: the draft token picks at
seeded_uniform(S XOR DRAFT_SALT, i) (`draft_tokens` with first_step = i), the acceptance test uses
seeded_uniform(S, 2i), the replacement or the draw from p seeded_uniform(S, 2i + 1). A position
is drafted again only after a rejection earlier in its round, whose outcome its uniforms did not
influence, so every decision draws fresh randomness. Each output token is therefore a function
of the seed, its position and the text before it alone: the sample does not depend on the draft
length, on max_new_tokens or on stop conditions. One exception: a position decided by a plain step
(drafting paused) draws from p at seeded_uniform(S, 2i + 1) where a drafted one would have used the
acceptance rule, so pausing (a function of the run's past only) gives another sample with the
same distribution; it is still reproducible by seed, and a shorter run is still a prefix. It is a different (equally distributed) sample
than the exact path's, which draws seeded_uniform(S, i).
Trees (`max_tree_width` > 1 with measured costs): whether a round drafts a tree, a chain or
nothing depends on the timings, so at T > 0 every position of such a run is the draw from p at
seeded_uniform(S, 2i + 1) (trees, chains as 1-wide trees, and plain steps alike; a draft is kept
when it is that draw): the sample is a function of the seed, the position and the text alone on
any machine, the same as a run of plain steps.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import torch

from hartonomous import sqlcalls
from hartonomous.backends.base import Cancelled, Distribution
from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.spatial import SpatialBackend, SpatialState
from hartonomous.speculative.draft_cost import CostShapedPolicy, ForwardCosts
from hartonomous.speculative.learned import DraftLearning
from hartonomous.errors import UserError
from hartonomous.generation_config import SamplerArgs
from hartonomous.paths.options import MAX_DRAFT_TOKENS, MAX_TREE_WIDTH, PathOptions
from hartonomous.sampling import pick_index, seeded_uniform

DRAFT_SALT = 0x5EC0_DA7A_D4AF_7000          # separates the draft's uniforms from the verifier's
# Break-even acceptance for a 1-token draft, measured on SmolLM2 (CPU): a round costs ~2 ms of
# drafting plus a 2-token forward (~1.12x a 1-token one, ~40 ms) and yields 1 + a tokens, so it
# beats a plain step when a > 2/40 + 0.12 ~ 0.17; 0.2 leaves room for the round's Python overhead.
MIN_ACCEPTANCE = 0.2
ACCEPTANCE_WINDOW = 16                       # judged draft tokens the running rate looks at
MIN_JUDGED = 8                               # judged draft tokens before drafting may pause
PROBE_EVERY = 8                              # plain rounds between probes while paused


@dataclass(frozen=True)
class Draft:
    """One drafted token and the distribution q it was drawn from (after the shared sampler)."""

    token_id: int
    q: Distribution


class SpatialDrafter:
    """Drafts with SQL `draft_tokens`: n spatial steps in one database call; with `memory`, from the
    set's memory of past generations too (hartonomous/memory.py)."""

    def __init__(self, spatial: SpatialBackend, memory: bool = False):
        self.spatial = spatial
        self.memory = memory

    def draft(self, ids: list[int], n: int, sampler: SamplerArgs, seed: int, first_step: int,
              stop_token_ids: list[int]) -> list[Draft]:
        """Up to n tokens continuing `ids`; step s picks at seeded_uniform(seed, first_step + s)."""
        rows = sqlcalls.draft_tokens(self.spatial.conn, self.spatial.context_for(SpatialState(ids), sampler), n,
                                     sampler, self.spatial.spatial, self.spatial.atom_set.name, seed, first_step,
                                     stop_token_ids, self.memory)
        return [Draft(token, Distribution(ids_, probs)) for token, ids_, probs in rows]

    def draft_tree(self, ids: list[int], depth: int, width: int, sampler: SamplerArgs,
                   stop_token_ids: list[int]) -> list[list[int]]:
        """Greedy branches continuing `ids` (SQL `draft_tree`, one call): the `width` most likely first
        tokens, each continued greedily up to `depth` tokens."""
        return sqlcalls.draft_tree(self.spatial.conn, self.spatial.context_for(SpatialState(ids), sampler), depth,
                                   width, sampler, self.spatial.spatial, self.spatial.atom_set.name, stop_token_ids,
                                   self.memory)

    def sources(self, ids: list[int], tokens: list[int]) -> list[str | None]:
        """Where each of `tokens` (drafted after `ids`) came from: the source of the atom that voted
        for it most (SQL `draft_sources`, one call): corpus, self-distilled, memory or context."""
        if not tokens:
            return []
        return sqlcalls.draft_sources(self.spatial.conn, self.spatial.context_for(SpatialState(ids), None), tokens,
                                      self.spatial.spatial, self.spatial.atom_set.name, self.memory)


@dataclass
class SpeculativeStats:
    """What one speculative generation did; time is compute time, split by where it went."""

    rounds: int = 0
    drafted: int = 0            # draft tokens proposed (and verified)
    accepted: int = 0           # draft tokens kept
    tokens: int = 0             # tokens handed to the engine
    forwards: int = 0           # exact forward passes (one per round, the prompt's included)
    draft_s: float = 0.0        # database calls (draft_tokens)
    verify_s: float = 0.0       # exact forwards (the first one reads the prompt) and the sampler over them
    decide_s: float = 0.0       # the acceptance rule, residual sampling, cache rollback
    sources_s: float = 0.0      # draft_sources calls (only when the kept drafts' sources were asked for)
    draft_lengths: list[int] = field(default_factory=list)   # k asked for, per round (0: a plain exact step)
    draft_widths: list[int] = field(default_factory=list)    # branches per round (1: a chain; trees > 1)
    target: str = "exact"       # the distribution the drafts were verified against: exact | augmented
    draft_kind: str | None = None   # what carried learning files this run under (None: learned per run)
    warm_start: bool = False    # the policy started from what earlier runs of its kind learned
    carried_judged: int = 0     # judged draft tokens it started with (0: drafted blind)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_forward(self) -> float | None:
        return self.tokens / self.forwards if self.forwards else None

    def as_dict(self) -> dict:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate,
                "tokens_per_forward": self.tokens_per_forward}


class DraftPolicy:
    """How many tokens one generation drafts next round (0 = a plain exact step).

    Grows and shrinks the length with SpeculativeBackend.next_draft_length; pauses drafting
    while the running acceptance rate (kept / judged draft tokens over the last
    ACCEPTANCE_WINDOW; the tokens after a rejection are not judged) is below min_acceptance,
    and probes with one token every probe_every rounds.
    """

    def __init__(self, backend: "SpeculativeBackend"):
        self.backend = backend
        self.k = backend.draft_tokens
        self.recent: deque[bool] = deque(maxlen=ACCEPTANCE_WINDOW)
        self.plain_left = 0
        self.paused = False

    def length(self, left: int) -> int:
        """The draft length of the next round, `left` tokens still to decide."""
        if self.plain_left > 0:
            self.plain_left -= 1
            return 0
        return min(self.k, left)

    def update(self, asked: int, drafted: int, accepted: int, draft_seconds: float | None = None) -> None:
        """Account for a round that asked for `asked` tokens, got `drafted` and kept `accepted`."""
        if asked == 0:
            return
        judged = accepted + (1 if accepted < drafted else 0)
        self.recent.extend([True] * accepted + [False] * (judged - accepted))
        self.k = self.backend.next_draft_length(self.k, asked, drafted, accepted)
        backend = self.backend
        if not backend.adaptive or backend.min_acceptance <= 0:
            return
        if self.paused:                              # this round was a probe
            if drafted and accepted == drafted:
                self.paused = False
                self.recent.clear()                  # kept: draft again, judge afresh
            else:
                self.plain_left = backend.probe_every
        elif len(self.recent) >= MIN_JUDGED and sum(self.recent) < backend.min_acceptance * len(self.recent):
            self.paused, self.plain_left, self.k = True, backend.probe_every, 1

    def can_warm(self, sampler: SamplerArgs) -> bool:
        """Whether starting from learned state keeps the seed's sample: at T > 0 a pause's plain steps
        draw another sample, so a policy that may pause starts cold there."""
        backend = self.backend
        return sampler.temperature == 0 or not backend.adaptive or backend.min_acceptance <= 0

    def learned(self) -> dict:
        """What this run learned, as an immutable snapshot (hartonomous/speculative/learned.py)."""
        return {"k": self.k, "recent": tuple(self.recent), "paused": self.paused}

    def warm(self, state: dict) -> None:
        """Start from an earlier run's snapshot: its draft length, its judged window, its pause."""
        self.k = max(1, min(int(state.get("k", self.k)), self.backend.max_draft_tokens))
        self.recent.extend(state.get("recent", ()))
        if state.get("paused") and self.backend.adaptive and self.backend.min_acceptance > 0:
            self.paused, self.plain_left, self.k = True, self.backend.probe_every, 1


class SpeculativeRun:
    """One speculative generation: iterate for (token_id, probability, seconds, origin, source);
    `stats` as it goes.

    `probability` is the exact model's p(token) at that position (after the shared sampler).
    `seconds` is the round's compute time on its first token and 0.0 on the rest of the round.
    `origin` is "draft" for a drafted token the exact model kept, "exact" for the exact model's own
    (a correction after a rejection, a draw where the drafter had nothing, or a plain step).
    `source`, with `sources=True`, is where a kept draft came from: the source of the atom that
    voted for it most (corpus, self-distilled, memory or context; SQL `draft_sources`, one call per
    round that kept a draft, its time in `stats.sources_s` and in the round's seconds); else None.
    """

    def __init__(self, backend: "SpeculativeBackend", prompt_ids: list[int], max_new_tokens: int,
                 sampler: SamplerArgs, seed: int, stop_token_ids: list[int], cancel: threading.Event,
                 sources: bool = False):
        self.backend = backend
        self.prompt_ids = list(prompt_ids)
        self.max_new_tokens = max_new_tokens
        self.sampler = sampler
        self.seed = seed
        self.stop_token_ids = list(stop_token_ids)
        self.cancel = cancel
        self.sources = sources
        self.stats = SpeculativeStats(target=backend.exact.name)
        self._tokens = self._rounds()

    def __iter__(self) -> Iterator[tuple[int, float, float, str, str | None]]:
        return self._tokens

    def close(self) -> None:
        self._tokens.close()

    def _kept_sources(self, ids: list[int], kept: list[int]) -> list[str | None]:
        """The sources of a round's kept drafts (asked for), timed into stats.sources_s."""
        if not self.sources or not kept:
            return [None] * len(kept)
        t0 = time.perf_counter()
        found = self.backend.drafter.sources(ids, kept)
        self.stats.sources_s += time.perf_counter() - t0
        return found

    def _rounds(self) -> Iterator[tuple[int, float, float, str, str | None]]:
        exact, drafter, stats = self.backend.exact, self.backend.drafter, self.stats
        state = exact.begin(self.prompt_ids)
        policy = self.backend.policy(self.sampler)
        kind = self._warm(policy)
        try:
            yield from self._run_rounds(state, policy)
        finally:
            if kind is not None and stats.rounds:
                self.backend.learned.keep(kind, policy.learned(), self.prompt_ids)

    def _warm(self, policy):
        """With carried learning (backend.learned): the run's kind, and the policy started from what
        the last run of that kind learned where that cannot change the sample; else None."""
        learning = self.backend.learned
        if learning is None:
            return None
        kind = learning.kind(atom_set=self.backend.atom_set_name, target=self.backend.exact.name,
                             memory=self.backend.drafter.memory, policy=type(policy).__name__,
                             max_width=getattr(policy, "max_width", 1), sampled=self.sampler.temperature > 0,
                             prompt_ids=self.prompt_ids)
        self.stats.draft_kind = kind.describe()
        known = learning.recall(kind)
        if known is not None and policy.can_warm(self.sampler):
            policy.warm(known)
            self.stats.warm_start = True
            self.stats.carried_judged = len(known.get("recent", ()))
        return kind

    def _run_rounds(self, state, policy) -> Iterator[tuple[int, float, float, str, str | None]]:
        exact, drafter, stats = self.backend.exact, self.backend.drafter, self.stats
        # At T > 0 a policy that may draft trees decides every position by a draw from p (trees,
        # width-1 trees and plain steps alike), so the timings that pick the shape never pick the sample.
        draws = self.sampler.temperature > 0 and getattr(policy, "max_width", 1) > 1
        produced = 0
        while produced < self.max_new_tokens:
            if self.cancel.is_set():
                raise Cancelled()
            # The first round drafts draft_tokens, or what a warmed policy learned (its width stays 1:
            # that round's forward also reads the prompt).
            n = policy.length(self.max_new_tokens - produced) if stats.rounds or stats.warm_start else \
                min(self.backend.draft_tokens, self.max_new_tokens - produced)
            width = getattr(policy, "width", 1) if stats.rounds and n >= 2 else 1
            if width > 1 or (draws and n):
                yield from self._tree_round(state, policy, n, width, produced)
                produced = len(state.ids) - len(self.prompt_ids)
                continue
            t0 = time.perf_counter()
            before = list(state.ids) if self.sources else []
            drafts = drafter.draft(state.ids, n, self.sampler, self.seed ^ DRAFT_SALT, produced,
                                   self.stop_token_ids) if n else []
            self.backend.check_vocabulary(drafts)
            t1 = time.perf_counter()
            draft = [d.token_id for d in drafts]
            fed = draft[:n - 1] if n and len(draft) == n else draft   # a full draft's last token needs no forward
            probs = exact.score(state, fed, self.sampler)
            t2 = time.perf_counter()
            accepted, tokens = self._decide(drafts, probs, produced)
            exact.accept(state, fed, tokens)
            t3 = time.perf_counter()
            stats.rounds += 1
            stats.forwards += 1
            stats.drafted += len(draft)
            stats.accepted += accepted
            stats.draft_lengths.append(n)
            stats.draft_widths.append(1)
            stats.draft_s += t1 - t0
            stats.verify_s += t2 - t1
            stats.decide_s += t3 - t2
            policy.update(n, len(draft), accepted, (t1 - t0) if n else None)
            sources = self._kept_sources(before, tokens[:accepted])
            seconds = time.perf_counter() - t0
            for j, token in enumerate(tokens):
                produced += 1
                stats.tokens += 1
                yield (token, float(probs[j, token]), seconds if j == 0 else 0.0, "draft" if j < accepted else "exact",
                       sources[j] if j < accepted else None)

    def _tree_round(self, state, policy, depth: int, width: int, produced: int
                    ) -> Iterator[tuple[int, float, float, str, str | None]]:
        """One round with a tree of `width` branches of up to `depth` tokens, verified by drawing
        from p: at each position the exact model's token is drawn from its distribution p (the
        seeded inverse CDF of `_draw`; at T = 0 p is one-hot, so it is the argmax), the branch whose
        first token it is is followed while its tokens are the draws, and the first draw off the
        branch ends the round (a full branch is kept whole). Each token is a draw from p given the
        tokens before it, so the output has the exact path's distribution at any temperature (at
        T = 0 it is the exact path's output, token for token). The branches are chosen, not
        sampled (SQL draft_tree: the most likely first tokens, continued greedily), and for a
        chosen set S of candidates no exact rule keeps a draft more often than p(S), which this
        one does; SpecInfer's recursive rejection over siblings is the rule for candidates sampled
        from q."""
        exact, stats = self.backend.exact, self.stats
        t0 = time.perf_counter()
        before = list(state.ids) if self.sources else []
        branches = self.backend.drafter.draft_tree(state.ids, depth, width, self.sampler, self.stop_token_ids)
        self.backend.check_vocabulary([Draft(t, Distribution([t], [1.0])) for b in branches for t in b])
        t1 = time.perf_counter()
        fed = [b[:depth - 1] if len(b) == depth else b for b in branches]   # a full branch's last token: no forward
        root, rows = exact.score_tree(state, fed, self.sampler)
        t2 = time.perf_counter()
        first = self._draw(root, produced)
        rank = next((i for i, b in enumerate(branches) if b[0] == first), None)
        tokens, probabilities, later, accepted = [first], [float(root[first])], [], 0
        if rank is not None:
            branch, judged, accepted = branches[rank], rows[rank], 1
            for j in range(1, len(branch) + 1):
                if j - 1 >= judged.shape[0]:          # a full branch: its last token had no forward
                    break
                drawn = self._draw(judged[j - 1], produced + j)
                tokens.append(drawn)
                probabilities.append(float(judged[j - 1][drawn]))
                if j < len(branch):
                    later.append(branch[j] == drawn)
                    if branch[j] == drawn:
                        accepted += 1
                        continue
                break                                 # the correction, or the token after a short branch
        tokens = tokens[:self.max_new_tokens - produced]
        accepted = min(accepted, len(tokens))
        exact.accept(state, fed[0] if fed else [], tokens)
        t3 = time.perf_counter()
        stats.rounds += 1
        stats.forwards += 1
        stats.drafted += sum(len(b) for b in branches)
        stats.accepted += accepted
        stats.draft_lengths.append(depth)
        stats.draft_widths.append(width)
        stats.draft_s += t1 - t0
        stats.verify_s += t2 - t1
        stats.decide_s += t3 - t2
        policy.update_tree(width, None if rank is None else rank + 1, later, t1 - t0)
        sources = self._kept_sources(before, tokens[:accepted])
        seconds = time.perf_counter() - t0
        for j, token in enumerate(tokens):
            stats.tokens += 1
            yield token, probabilities[j], seconds if j == 0 else 0.0, "draft" if j < accepted else "exact", \
                sources[j] if j < accepted else None

    def _decide(self, drafts: list[Draft], probs: torch.Tensor, position: int) -> tuple[int, list[int]]:
        """(how many draft tokens are kept, the round's tokens).

        Row j of `probs` is p at position + j. Each drafted position keeps its draft token or
        ends the round with a replacement; a position the drafter had nothing for (it stopped
        early: no candidates, or after a stop token) is drawn from p.
        """
        for j, d in enumerate(drafts):
            if not self._keeps(d, probs[j], position + j):
                return j, [x.token_id for x in drafts[:j]] + [self._replacement(d, probs[j], position + j)]
        tokens = [d.token_id for d in drafts]
        if len(drafts) < probs.shape[0]:
            tokens.append(self._draw(probs[len(drafts)], position + len(drafts)))
        return len(drafts), tokens

    def _keeps(self, draft: Draft, p: torch.Tensor, position: int) -> bool:
        """Greedy: the draft is the exact argmax. Sampling: u < min(1, p(x) / q(x)), u = seeded_uniform(S, 2i)."""
        px = float(p[draft.token_id])
        if self.sampler.temperature == 0:
            return px == 1.0                   # after the greedy sampler p is one-hot at the argmax
        qx = draft.q.probabilities[draft.q.token_ids.index(draft.token_id)]
        return seeded_uniform(self.seed, 2 * position) * qx < px

    def _replacement(self, draft: Draft, p: torch.Tensor, position: int) -> int:
        """The token after a rejection: greedy, the argmax; sampling, a draw from normalise(max(0, p - q))."""
        if self.sampler.temperature == 0:
            return int(p.argmax())
        q = torch.zeros_like(p)
        q[torch.tensor(draft.q.token_ids, device=p.device)] = torch.tensor(draft.q.probabilities, dtype=p.dtype,
                                                                            device=p.device)
        residual = (p - q).clamp(min=0)
        total = float(residual.sum())
        return self._draw(residual / total if total > 0 else p, position)   # total 0: p == q up to rounding

    def _draw(self, probs: torch.Tensor, position: int) -> int:
        """The inverse-CDF pick at seeded_uniform(S, 2i + 1) (for T = 0 p is one-hot: the argmax).

        Over the support only (ascending ids, so ties still go to the lower id): the same pick as
        over the whole vocabulary, without sorting ~50,000 zeros every step."""
        u = seeded_uniform(self.seed, 2 * position + 1)
        support = torch.nonzero(probs > 0).flatten()
        if support.numel() == 0:                      # nothing positive (cannot happen after the sampler)
            return int(pick_index(probs, u))
        return int(support[0]) if support.numel() == 1 else int(support[pick_index(probs[support], u)])


class SpeculativeBackend:
    """The speculative path: a spatial drafter and an exact verifier behind one engine backend.

    The engine runs it through `stream_tokens` (several tokens per round), not the step interface.
    `memory`: the drafter reads the atom set's memory of past generations beside its atoms.
    `learned`: a DraftLearning shared with other backends (a server's, a Client's): each run starts
    from what the last run of its kind learned (hartonomous/speculative/learned.py); None: per run.
    """

    name = "speculative"

    def __init__(self, exact: ExactBackend, spatial: SpatialBackend, *,
                 draft_tokens: int = PathOptions.draft_tokens, max_draft_tokens: int = PathOptions.max_draft_tokens,
                 adaptive: bool = True, min_acceptance: float = MIN_ACCEPTANCE, probe_every: int = PROBE_EVERY,
                 costs: ForwardCosts | None = None, memory: bool = False,
                 max_tree_width: int = PathOptions.max_tree_width, learned: DraftLearning | None = None):
        if not 1 <= draft_tokens <= MAX_DRAFT_TOKENS:
            raise UserError(f"draft_tokens must be between 1 and {MAX_DRAFT_TOKENS}, got {draft_tokens}")
        if not draft_tokens <= max_draft_tokens <= MAX_DRAFT_TOKENS:
            raise UserError(f"max_draft_tokens must be between draft_tokens ({draft_tokens}) and "
                            f"{MAX_DRAFT_TOKENS}, got {max_draft_tokens}")
        if not 0 <= min_acceptance <= 1:
            raise UserError(f"min_acceptance must be between 0 and 1 (0 = never pause drafting), got {min_acceptance}")
        if probe_every < 1:
            raise UserError(f"probe_every must be at least 1, got {probe_every}")
        if not 1 <= max_tree_width <= MAX_TREE_WIDTH:
            raise UserError(f"max_tree_width must be between 1 and {MAX_TREE_WIDTH}, got {max_tree_width}")
        if max_tree_width > 1 and not getattr(exact, "supports_trees", True):
            raise UserError(f"the {exact.name} target verifies chains only: use a tree width of 1")
        if max_tree_width > 1 and not getattr(exact.model, "supports_trees", True):
            raise UserError(f"the {exact.model.runtime} runtime verifies chains only (one KV sequence): use a tree "
                            "width of 1, or --runtime int4 / torch for trees")
        vocab = exact.model.vocab_size
        if spatial.atom_set.vocab_size > vocab:
            raise UserError(f"atom set '{spatial.atom_set.name}' has {spatial.atom_set.vocab_size} tokens but the "
                            f"exact model only {vocab}; draft with an atom set built from the same model")
        self.exact = exact
        self.spatial = spatial
        self.drafter = SpatialDrafter(spatial, memory)
        self.tokenizer = exact.tokenizer
        self.draft_tokens = draft_tokens
        self.max_draft_tokens = max_draft_tokens
        self.adaptive = adaptive
        self.min_acceptance = min_acceptance
        self.probe_every = probe_every
        self.costs = costs
        self.max_tree_width = max_tree_width
        self.learned = learned

    def policy(self, sampler: SamplerArgs) -> "DraftPolicy | CostShapedPolicy":
        """One generation's draft-length policy: cost-shaped when forward costs were measured."""
        if self.adaptive and self.costs is not None:
            draws = sampler.temperature == 0 or self.max_tree_width > 1   # a plain step decides as a round would
            return CostShapedPolicy(self.costs, self.max_draft_tokens, min_draft=0 if draws else 1,
                                    max_width=self.max_tree_width)
        return DraftPolicy(self)

    @property
    def atom_set_name(self) -> str:
        """The drafting atom set (what results and the API report as the path's atom set)."""
        return self.spatial.atom_set_name

    def eos_token_ids(self) -> set[int]:
        return self.exact.eos_token_ids()

    def stream_tokens(self, prompt_ids: list[int], max_new_tokens: int, sampler: SamplerArgs, seed: int,
                      stop_token_ids: list[int], cancel: threading.Event, sources: bool = False) -> SpeculativeRun:
        """The generation as a stream of decided tokens (the engine checks stops and cancels);
        `sources`: each kept draft carries where it came from (one more database call a round)."""
        return SpeculativeRun(self, prompt_ids, max_new_tokens, sampler, seed, stop_token_ids, cancel, sources)

    def next_draft_length(self, k: int, asked: int, drafted: int, accepted: int) -> int:
        """Grow by 2 after a full acceptance of a full draft, shrink by 1 after a rejection."""
        if not self.adaptive:
            return k
        if accepted < drafted:
            return max(1, k - 1)
        if drafted == asked == k:
            return min(self.max_draft_tokens, k + 2)
        return k

    def check_vocabulary(self, drafts: list[Draft]) -> None:
        vocab = self.exact.model.vocab_size
        for d in drafts:
            if not 0 <= d.token_id < vocab:
                raise UserError(f"the drafter proposed token id {d.token_id}, outside the exact model's "
                                f"vocabulary (0..{vocab - 1}); use an atom set built from the same model")

    def close(self) -> None:
        self.exact.close()
        self.spatial.close()

