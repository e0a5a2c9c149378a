"""The augmented distribution: (1 − λ) p_exact + λ p_store, then the shared sampler.

The repetition penalty's rule depends on a logit's sign (hartonomous.sampling), so it cannot be
applied to the mixture's log-probabilities without changing what λ = 0 means. It is applied to
each component before mixing instead: p_exact = softmax(penalised exact logits), and p_store =
softmax(penalised ln p_store) (every ln p ≤ 0, so a seen token's store probability is raised to
the power of the penalty). Then temperature, top-k and top-p apply to ln p of the mixture. So
λ = 0 is the exact path at every penalty (the mixture is skipped: bit for bit), and λ = 1 is the
store's distribution under the same sampler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from hartonomous.generation_config import SamplerArgs
from hartonomous.sampling import logits_to_probs, process_logits


def store_log_probs(token_ids: Sequence[int], probabilities: Sequence[float], vocab: int,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """ln p_store as a dense (V,) float64 vector: −inf outside the store's support."""
    out = torch.full((vocab,), -math.inf, dtype=torch.float64, device=device)
    if token_ids:
        ids = torch.as_tensor(list(token_ids), dtype=torch.long, device=device)
        p = torch.as_tensor(list(probabilities), dtype=torch.float64, device=device)
        out[ids] = torch.log(p)
    return out


def penalised_store(store_ids: Sequence[int], store_probs: Sequence[float], context: Sequence[int], penalty: float,
                    device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, p) of the store's component on its support: softmax(penalised ln p_store) there (the
    dense vector is −inf elsewhere, so the softmax over the support is the same)."""
    ids = torch.as_tensor(list(store_ids), dtype=torch.long, device=device)
    ln_p = torch.log(torch.as_tensor(list(store_probs), dtype=torch.float64, device=device))
    if penalty != 1 and len(context):
        seen = torch.isin(ids, torch.as_tensor(list(set(context)), dtype=torch.long, device=device))
        ln_p = torch.where(seen, torch.where(ln_p < 0, ln_p * penalty, ln_p / penalty), ln_p)
    return ids, torch.softmax(ln_p, -1)


def mixed_probs(exact_logits: torch.Tensor, store_ids: Sequence[int], store_probs: Sequence[float], lam: float,
                context: Sequence[int], sampler: SamplerArgs, exact_probs: torch.Tensor | None = None) -> torch.Tensor:
    """The augmented path's next-token distribution (V,) float64 after the shared sampler.
    `exact_probs`: softmax(exact_logits) in float64 when the caller has it (used at penalty 1)."""
    if not 0.0 <= lam <= 1.0 or math.isnan(lam):
        raise ValueError(f"λ must lie in [0, 1], got {lam}")
    penalty = sampler.repetition_penalty
    if lam == 0.0 or not store_ids:
        return logits_to_probs(exact_logits, list(context), temperature=sampler.temperature, top_k=sampler.top_k,
                               top_p=sampler.top_p, repetition_penalty=penalty)
    ctx = list(context)
    if penalty == 1 and exact_probs is not None:
        p_exact = exact_probs
    else:
        p_exact = torch.softmax(process_logits(exact_logits, ctx, repetition_penalty=penalty), -1)
    ids, p_store = penalised_store(store_ids, store_probs, ctx, penalty, exact_logits.device)
    mixed = (1.0 - lam) * p_exact
    mixed[ids] += lam * p_store
    return logits_to_probs(torch.log(mixed), None, temperature=sampler.temperature, top_k=sampler.top_k,
                           top_p=sampler.top_p)
