"""The exact backend: the KV-cached transformer (hartonomous.runtimes.reference) behind the engine's interface.

Besides the engine's step interface (`start` / `distribution` / `advance`) it verifies drafts for
speculative decoding: `score` runs the tokens not yet cached plus a draft through one forward and
returns the next-token distribution after every draft prefix; `accept` appends the tokens a round
decided, rolls the KV cache back past the rejected draft tokens and leaves the last token to be fed
by the following forward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from hartonomous.backends.base import Distribution
from hartonomous.runtimes.reference import ExactModel, KVCache
from hartonomous.generation_config import SamplerArgs
from hartonomous.sampling import logits_to_probs
from hartonomous.signals import StepSignals, distribution_signals


@dataclass
class ExactState:
    ids: list[int]
    cache: KVCache | None
    logits: torch.Tensor | None   # next-token logits after ids; None while ids[cache.length:] wait to be fed


SMALL_SUPPORT = 4096


def ordered_distribution(probs: torch.Tensor) -> Distribution:
    """The non-zero entries of a (V,) probability vector, by probability desc, then token id asc."""
    probs = probs.detach().to(torch.float64)
    support = int((probs > 0).sum())
    if support <= SMALL_SUPPORT:       # top-k / greedy: gather the few candidates where they are
        values, ids = torch.topk(probs, support)
        rows = sorted(zip(ids.tolist(), values.tolist()), key=lambda r: (-r[1], r[0]))
        return Distribution([r[0] for r in rows], [r[1] for r in rows])
    probs = probs.cpu()
    ids = torch.nonzero(probs > 0).flatten()          # ascending ids
    kept = probs[ids]
    order = torch.sort(kept, descending=True, stable=True).indices  # stable keeps ties by id asc
    return Distribution(ids[order].tolist(), kept[order].tolist())


class ExactBackend:
    """Prefill once in `start`, one `decode_one_token` per `advance`; logits through the shared sampler."""

    name = "exact"
    atom_set_name = None            # the exact path reads no atom set

    def __init__(self, model: ExactModel, risk_source: Callable[[list[int]], StepSignals] | None = None):
        self.model = model
        self.tokenizer = model.tokenizer
        self.risk_source = risk_source      # context ids -> the spatial path's signals (for their risk)

    def eos_token_ids(self) -> set[int]:
        return self.model.eos_token_ids()

    def start(self, prompt_ids: list[int]) -> ExactState:
        ids = [int(i) for i in prompt_ids]
        if self.model.use_cache:
            cache = self.model.new_cache()
            return ExactState(ids, cache, self.model.prefill(ids, cache))
        return ExactState(ids, None, self.model.full_logits(ids))

    def distribution(self, state: ExactState, sampler: SamplerArgs) -> Distribution:
        if state.logits is None:
            state.logits = self.score_logits(state, [])[0]
        context = torch.tensor(state.ids, dtype=torch.long, device=state.logits.device)
        probs = logits_to_probs(state.logits, context, temperature=sampler.temperature, top_k=sampler.top_k,
                                top_p=sampler.top_p, repetition_penalty=sampler.repetition_penalty)
        return ordered_distribution(probs)

    def signals(self, state: ExactState) -> StepSignals:
        """The exact distribution's own H, H2, varentropy, R and top probability (temperature 1, no
        warpers); no geometric signals; the risk is the atom set's predictor on the spatial signals of
        the same context when a risk source is attached (else None)."""
        if state.logits is None:
            state.logits = self.score_logits(state, [])[0]
        probs = torch.softmax(state.logits.detach().to(torch.float64), -1).cpu().numpy()
        risk = self.risk_source(state.ids).risk if self.risk_source is not None else None
        return StepSignals(**distribution_signals(probs), nearest_bandwidths=None, history_share=None,
                           distinct_tokens=None, risk=risk)

    def advance(self, state: ExactState, token_id: int) -> None:
        state.ids.append(int(token_id))
        if state.logits is None:          # already behind (after `begin` or `accept`): stay lazy
            return
        if state.cache is not None:
            state.logits = self.model.decode_one_token(token_id, state.cache)
        else:
            state.logits = self.model.full_logits(state.ids)

    # -- speculative decoding: verify a draft in one forward -------------------------------

    def begin(self, prompt_ids: list[int]) -> ExactState:
        """A state with nothing computed yet: the first `score` feeds the prompt with the draft."""
        ids = [int(i) for i in prompt_ids]
        self.model._check(ids)
        return ExactState(ids, self.model.new_cache() if self.model.use_cache else None, None)

    def _prefill_prompt(self, state: ExactState) -> list[int]:
        """The ids not yet cached, after prefilling the prompt if nothing is cached yet: the speculative
        path's first forward prefills exactly as `start` does (a runtime may batch a prompt's rows,
        never a decoded or drafted token's), so both paths read the same cache."""
        if state.cache.length == 0 and state.logits is None:
            state.logits = self.model.prefill(state.ids, state.cache)
        return state.ids[state.cache.length:]

    def score_logits(self, state: ExactState, draft: list[int]) -> torch.Tensor:
        """Raw logits (k+1, V): row j is the next-token logits after ids + draft[:j], k = len(draft).

        One forward over the ids not yet cached plus the draft; the draft stays in the cache
        until `accept` crops what was rejected.
        """
        k = len(draft)
        if state.cache is None:
            return self.model.full_logits_many(state.ids + draft, k + 1)
        pending = self._prefill_prompt(state)
        if not pending:                    # everything cached: the logits after ids are known
            if state.logits is None:
                raise RuntimeError("exact state has its ids cached but no logits; this is a bug")
            if k == 0:
                return state.logits[None]
            return torch.cat([state.logits[None], self.model.extend(draft, state.cache, k)])
        return self.model.extend(pending + draft, state.cache, k + 1)

    def score(self, state: ExactState, draft: list[int], sampler: SamplerArgs) -> torch.Tensor:
        """Probabilities (k+1, V), float64, after the shared sampler: row j is the exact path's
        next-token distribution after ids + draft[:j] (its repetition penalty sees that context)."""
        logits = self.score_logits(state, draft)
        contexts = [state.ids + draft[:j] for j in range(len(draft) + 1)]
        return logits_to_probs(logits, contexts, temperature=sampler.temperature, top_k=sampler.top_k,
                               top_p=sampler.top_p, repetition_penalty=sampler.repetition_penalty)

    def score_tree(self, state: ExactState, branches: list[list[int]], sampler: SamplerArgs
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Greedy tree verification in one forward (ExactModel.extend_tree): the probabilities (V,)
        after ids, and per branch (len(branch), V) whose row j is the distribution after
        ids + branch[:j + 1], all after the shared sampler. The first branch's tokens sit in the
        cache right after the ids (so `accept` with it as `fed` keeps what agrees); the others'
        are cropped by `accept`."""
        if state.cache is None:                     # no cache: each branch from scratch
            root = self.model.full_logits_many(state.ids, 1)[0]
            rows = [self.model.full_logits_many(state.ids + b, len(b)) if b else root[:0] for b in branches]
        else:
            pending = self._prefill_prompt(state)
            if not pending and state.logits is None:
                raise RuntimeError("exact state has its ids cached but no logits; this is a bug")
            flat = self.model.extend_tree(pending, branches, state.cache) if pending or any(branches) else None
            root = flat[len(pending) - 1] if pending else state.logits
            rows, at = [], len(pending)
            for b in branches:
                rows.append(flat[at:at + len(b)] if b else root[None][:0])
                at += len(b)
        p_root = logits_to_probs(root[None], [state.ids], temperature=sampler.temperature, top_k=sampler.top_k,
                                 top_p=sampler.top_p, repetition_penalty=sampler.repetition_penalty)[0]
        probs = [logits_to_probs(r, [state.ids + b[:j + 1] for j in range(len(b))], temperature=sampler.temperature,
                                 top_k=sampler.top_k, top_p=sampler.top_p, repetition_penalty=sampler.repetition_penalty)
                 if len(b) else r for r, b in zip(rows, branches)]
        return p_root, probs

    def accept(self, state: ExactState, fed: list[int], tokens: list[int]) -> None:
        """After `score(state, fed)`: append the round's `tokens` to the context. The cache keeps
        the fed tokens that agree with them and is rolled back past the rest; at least the last
        token waits to be fed by the next forward (so the next `score` has a position to read)."""
        if not tokens:
            raise ValueError("accept needs at least one token")
        keep = 0
        while keep < min(len(fed), len(tokens) - 1) and fed[keep] == tokens[keep]:
            keep += 1
        if state.cache is not None:
            state.cache.crop(len(state.ids) + keep)
        state.ids.extend(int(t) for t in tokens)
        state.logits = None

    def close(self) -> None:
        pass
