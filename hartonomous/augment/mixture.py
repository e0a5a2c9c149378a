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


def mixed_probs(exact_logits: torch.Tensor, store_ids: Sequence[int], store_probs: Sequence[float], lam: float,
                context: Sequence[int], sampler: SamplerArgs) -> torch.Tensor:
    """The augmented path's next-token distribution (V,) float64 after the shared sampler."""
    if not 0.0 <= lam <= 1.0 or math.isnan(lam):
        raise ValueError(f"λ must lie in [0, 1], got {lam}")
    penalty = sampler.repetition_penalty
    if lam == 0.0 or not store_ids:
        return logits_to_probs(exact_logits, list(context), temperature=sampler.temperature, top_k=sampler.top_k,
                               top_p=sampler.top_p, repetition_penalty=penalty)
    vocab = exact_logits.shape[-1]
    ctx = list(context)
    p_exact = torch.softmax(process_logits(exact_logits, ctx, repetition_penalty=penalty), -1)
    p_store = torch.softmax(process_logits(store_log_probs(store_ids, store_probs, vocab, exact_logits.device),
                                           ctx, repetition_penalty=penalty), -1)
    mixed = torch.log((1.0 - lam) * p_exact + lam * p_store)
    return logits_to_probs(mixed, None, temperature=sampler.temperature, top_k=sampler.top_k, top_p=sampler.top_p)
