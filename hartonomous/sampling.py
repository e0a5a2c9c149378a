"""The sampler: token logits -> next-token distribution, the one definition for every path.

The paths on the exact model (exact, speculative, hybrid, augmented) run these functions on torch
tensors; the spatial path runs the SQL port in `sql/020_next_token.sql`, tested against this
module. The rules are Hugging Face transformers' (RepetitionPenalty -> Temperature -> TopK ->
TopP), with two documented differences (T = 0, top-p ties; docs/design.md "Sampler semantics"):

1. repetition penalty over each distinct context token id: logit < 0 -> * penalty, else / penalty;
2. temperature: logits / T for T > 0; T = 0 is greedy: the highest logit (lowest token id among
   equals) with probability 1 (transformers rejects T = 0; llama.cpp applies T last, we do not);
3. top-k: keep every token whose logit is >= the k-th largest (ties kept); 0 or None = off;
4. top-p: softmax, then walking by logit desc (token id asc among equals) keep a token while the
   mass before it is < p; the first is always kept; 1 or None = off. When the cut falls inside a
   group of equal probabilities we keep its lowest token ids; transformers' TopPLogitsWarper keeps
   the highest (it sorts ascending and cuts from the low end); the same number of tokens is kept
   either way. tests/test_sampling.py pins both behaviours;
5. renormalise.
Rows are ordered by probability descending, then token id ascending; sampling is the inverse
CDF in that order with a uniform u, drawn from a torch.Generator or `seeded_uniform(seed, step)`
(bit-identical to the SQL function). Computation is float64 so that Python and SQL take the same
decisions at boundaries.
"""

from __future__ import annotations

import hashlib
import math
import numbers
import struct
from collections.abc import Sequence

import torch

__all__ = [
    "validate_sampler_args", "process_logits", "logits_to_probs", "sample", "seeded_uniform",
    "pick_by_uniform", "pick_index", "next_token_rows",
]

ContextIds = torch.Tensor | Sequence[int] | Sequence[Sequence[int]] | None


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# Outside these bounds, scaling logits by 1/T or the penalty overflows or underflows float64.
SCALE_MIN, SCALE_MAX = 1e-6, 1e6


def validate_sampler_args(temperature: float, top_k: int | None, top_p: float | None,
                          repetition_penalty: float) -> None:
    """Raise ValueError naming the first bad argument and what to pass instead (as SQL's 22023)."""
    if not _is_real(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}; "
                         "use 0 for greedy decoding, 1 for the model's distribution")
    if temperature > 0 and not SCALE_MIN <= temperature <= SCALE_MAX:
        raise ValueError(f"temperature must be 0 or between 1e-06 and 1e+06, got {temperature!r}; "
                         "use 0 for greedy decoding, 1 for the model's distribution")
    if top_k is not None and (not isinstance(top_k, numbers.Integral) or isinstance(top_k, bool)
                              or top_k < 0):
        raise ValueError(f"top_k must be an integer >= 0, got {top_k!r}; use 0 or None to turn top-k off")
    if top_p is not None and (not _is_real(top_p) or math.isnan(top_p) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}; use 1 or None to turn top-p off")
    if (not _is_real(repetition_penalty) or not math.isfinite(repetition_penalty)
            or repetition_penalty <= 0):
        raise ValueError(f"repetition_penalty must be a finite number > 0, got {repetition_penalty!r}; "
                         "use 1 for no penalty, above 1 to discourage repeating context tokens")
    if not SCALE_MIN <= repetition_penalty <= SCALE_MAX:
        raise ValueError(f"repetition_penalty must be between 1e-06 and 1e+06, got {repetition_penalty!r}; "
                         "use 1 for no penalty, above 1 to discourage repeating context tokens")


def _context_mask(context_ids: ContextIds, batch: int, vocab: int, device: torch.device) -> torch.Tensor:
    """(batch, vocab) bool: which token ids occur in each row's context (ids outside [0, vocab) ignored)."""
    if isinstance(context_ids, torch.Tensor):
        ids = context_ids.to(device=device, dtype=torch.long)
        rows = [ids] if ids.dim() == 1 else list(ids)
    elif len(context_ids) == 0 or isinstance(context_ids[0], numbers.Integral):
        rows = [torch.as_tensor(list(context_ids), dtype=torch.long, device=device)]
    else:
        rows = [torch.as_tensor(list(r), dtype=torch.long, device=device) for r in context_ids]
    if len(rows) == 1 and batch > 1:
        rows = rows * batch
    if len(rows) != batch:
        raise ValueError(f"context_ids has {len(rows)} rows but logits has {batch}; "
                         "pass one context per logits row")
    mask = torch.zeros(batch, vocab + 1, dtype=torch.bool, device=device)
    for i, row in enumerate(rows):
        row = torch.where((row >= 0) & (row < vocab), row, vocab)  # out of range -> dropped column
        mask[i, row] = True
    return mask[:, :vocab]


def process_logits(logits: torch.Tensor, context_ids: ContextIds = None, *, temperature: float = 1.0,
                   top_k: int | None = None, top_p: float | None = 1.0,
                   repetition_penalty: float = 1.0) -> torch.Tensor:
    """Filtered float64 logits, -inf where removed; (V,) or (B, V). The input is not modified.

    `context_ids`: one context for all rows (ids) or one per row (a (B, n) tensor, -1 pads, or
    a list of lists). With T = 0 only the argmax keeps its (penalised) logit.
    """
    validate_sampler_args(temperature, top_k, top_p, repetition_penalty)
    squeeze = logits.dim() == 1
    x = logits.detach().to(torch.float64).reshape(-1, logits.shape[-1])
    batch, vocab = x.shape
    if repetition_penalty != 1 and context_ids is not None:
        mask = _context_mask(context_ids, batch, vocab, x.device)
        penalised = torch.where(x < 0, x * repetition_penalty, x / repetition_penalty)
        x = torch.where(mask, penalised, x)
    if temperature == 0:
        best = x.argmax(dim=-1, keepdim=True)  # the first maximum: the lowest token id
        out = torch.full_like(x, -math.inf).scatter(1, best, x.gather(1, best))
        return out[0] if squeeze else out
    x = x / temperature
    if top_k:
        kth = torch.topk(x, min(int(top_k), vocab), dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, -math.inf)
    if top_p is not None and top_p < 1:
        order = _descending_order(x, only_finite=bool(top_k))  # ties: lower id first
        sorted_probs = torch.softmax(x, dim=-1).gather(1, order)
        cumulative = sorted_probs.cumsum(dim=-1)
        before = torch.cat([torch.zeros_like(cumulative[..., :1]), cumulative[..., :-1]], dim=-1)
        drop_sorted = before >= top_p
        drop_sorted[..., 0] = False
        drop = torch.zeros(x.shape, dtype=torch.bool, device=x.device).scatter(1, order, drop_sorted)
        x = x.masked_fill(drop, -math.inf)
    return x[0] if squeeze else x


def _descending_order(x: torch.Tensor, only_finite: bool) -> torch.Tensor:
    """Indices by logit descending, lower id first among equals.

    After top-k only the survivors can matter, so they alone are sorted (the rest are -inf and
    come after them in any order); that is what keeps sampled decoding at transformers' speed.
    """
    if only_finite:
        survivors = int(torch.isfinite(x).sum(dim=-1).max())
        if 0 < survivors < x.shape[-1]:
            candidates = torch.topk(x, survivors, dim=-1).indices.sort(dim=-1).values  # ids ascending
            local = torch.sort(x.gather(1, candidates), dim=-1, descending=True, stable=True).indices
            return candidates.gather(1, local)
    return torch.sort(x, dim=-1, descending=True, stable=True).indices


def logits_to_probs(logits: torch.Tensor, context_ids: ContextIds = None, *, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = 1.0,
                    repetition_penalty: float = 1.0) -> torch.Tensor:
    """The renormalised float64 distribution after the sampler; 0 for removed tokens."""
    filtered = process_logits(logits, context_ids, temperature=temperature, top_k=top_k, top_p=top_p,
                              repetition_penalty=repetition_penalty)
    return torch.softmax(filtered, dim=-1)


def pick_index(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse CDF per row: order by probability desc, index asc; the first with cumulative > u,
    else (rounding) the last with probability > 0. probs (B, V) or (V,), u (B,) or scalar."""
    squeeze = probs.dim() == 1
    p = probs.to(torch.float64).reshape(-1, probs.shape[-1])
    u = torch.as_tensor(u, dtype=torch.float64, device=p.device).reshape(-1, 1)
    sorted_probs, order = torch.sort(p, dim=-1, descending=True, stable=True)
    cumulative = sorted_probs.cumsum(dim=-1)
    position = (cumulative <= u).sum(dim=-1)
    last_positive = (sorted_probs > 0).sum(dim=-1) - 1
    position = torch.minimum(position, last_positive.clamp(min=0))
    picked = order.gather(1, position[:, None])[:, 0]
    return picked[0] if squeeze else picked


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per row (LongTensor of shape probs.shape[:-1]) with u ~ U[0, 1) from `generator`."""
    batch = 1 if probs.dim() == 1 else probs.shape[0]
    u = torch.rand(batch, generator=generator, device=probs.device, dtype=torch.float64)
    return pick_index(probs, u if probs.dim() > 1 else u[0])


def seeded_uniform(seed: int, step: int) -> float:
    """u in [0, 1): (first 8 bytes of SHA-256(seed int64 BE || step int32 BE) >> 11) / 2**53.

    Bit-identical to SQL `seeded_uniform(seed, step)`; generation step s draws with it.
    """
    if not -2**63 <= seed < 2**63 or not -2**31 <= step < 2**31:
        raise ValueError(f"seed must fit in int64 and step in int32, got seed={seed}, step={step}")
    digest = hashlib.sha256(struct.pack(">qi", seed, step)).digest()
    return (int.from_bytes(digest[:8], "big") >> 11) / float(2**53)


def pick_by_uniform(token_ids: Sequence[int], probs: Sequence[float], u: float) -> int:
    """The token at u on the CDF in the documented order, as SQL `sample_next_token` picks it."""
    rows = sorted(zip((int(t) for t in token_ids), (float(p) for p in probs)), key=lambda r: (-r[1], r[0]))
    if not rows:
        raise ValueError("token_ids is empty; there is no candidate to pick")
    cumulative = 0.0
    last_positive = rows[0][0]
    for token, p in rows:
        cumulative += p
        if p > 0:
            last_positive = token
        if cumulative > u:
            return token
    return last_positive


def next_token_rows(logits: torch.Tensor, context_ids: ContextIds = None, *, temperature: float = 1.0,
                    top_k: int | None = None, top_p: float | None = 1.0,
                    repetition_penalty: float = 1.0) -> list[tuple[int, float, float]]:
    """SQL next_token's rows for a (V,) logits vector: (token_id, probability, cumulative), ordered
    by probability desc, token id asc, over the tokens the sampler keeps (finite filtered logits)."""
    if logits.dim() != 1:
        raise ValueError(f"logits must be one (V,) vector, got shape {tuple(logits.shape)}")
    filtered = process_logits(logits, context_ids, temperature=temperature, top_k=top_k, top_p=top_p,
                              repetition_penalty=repetition_penalty)
    probs = torch.softmax(filtered, dim=-1).cpu()
    kept = torch.isfinite(filtered).cpu()
    rows = sorted(((int(i), float(probs[i])) for i in torch.nonzero(kept).flatten().tolist()),
                  key=lambda r: (-r[1], r[0]))
    out, cumulative = [], 0.0
    for token, p in rows:
        cumulative += p
        out.append((token, p, cumulative))
    return out
