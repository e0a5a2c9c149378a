"""The exact backend: the KV-cached transformer (hartonomous.exact) behind the engine's interface."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hartonomous.backends.base import Distribution, SamplerArgs
from hartonomous.exact import ExactModel, KVCache
from hartonomous.sampling import logits_to_probs


@dataclass
class ExactState:
    ids: list[int]
    cache: KVCache | None
    logits: torch.Tensor


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

    def __init__(self, model: ExactModel):
        self.model = model
        self.tokenizer = model.tokenizer

    def eos_token_ids(self) -> set[int]:
        return self.model.eos_token_ids()

    def start(self, prompt_ids: list[int]) -> ExactState:
        ids = [int(i) for i in prompt_ids]
        if self.model.use_cache:
            cache = self.model.new_cache()
            return ExactState(ids, cache, self.model.prefill(ids, cache))
        return ExactState(ids, None, self.model.full_logits(ids))

    def distribution(self, state: ExactState, sampler: SamplerArgs) -> Distribution:
        context = torch.tensor(state.ids, dtype=torch.long, device=state.logits.device)
        probs = logits_to_probs(state.logits, context, temperature=sampler.temperature, top_k=sampler.top_k,
                                top_p=sampler.top_p, repetition_penalty=sampler.repetition_penalty)
        return ordered_distribution(probs)

    def advance(self, state: ExactState, token_id: int) -> None:
        state.ids.append(int(token_id))
        if state.cache is not None:
            state.logits = self.model.decode_one_token(token_id, state.cache)
        else:
            state.logits = self.model.full_logits(state.ids)

    def close(self) -> None:
        pass
