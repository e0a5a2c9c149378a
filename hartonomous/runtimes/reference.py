"""The exact path: the transformer itself, prefilled once, then fed one token per step.

gpt-fast's split: `prefill` runs the prompt through the model and fills the KV cache,
`decode_one_token` feeds one token against the cache. Both return the float32 logits of the
last position only (`logits_to_keep=1`, as transformers' `generate` does), so greedy output
matches `generate(do_sample=False)` token for token. The sampling itself is not here: the
engine sends these logits through `hartonomous.sampling`, the one sampler of every path.
Speculative decoding adds `extend` (several tokens in one cached forward, the logits after each)
and `KVCache.crop` (forget the rejected draft tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hartonomous.runtimes.base import RuntimeModel


class KVCache:
    """Keys and values of every layer for one sequence (transformers' DynamicCache underneath)."""

    def __init__(self, config):
        from transformers import DynamicCache

        self._config = config
        self.layers = DynamicCache(config=config)

    @property
    def length(self) -> int:
        """Number of tokens whose keys/values are cached."""
        return self.layers.get_seq_length()

    def reset(self) -> None:
        from transformers import DynamicCache

        self.layers = DynamicCache(config=self._config)

    def crop(self, length: int) -> None:
        """Forget every token after the first `length` (speculative decoding's rollback).

        DynamicCache.crop takes a negative count of tokens to remove in every transformers
        version we support (newer ones reject a positive absolute length).
        """
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        if length < self.length:
            self.layers.crop(length - self.length)


class ExactModel(RuntimeModel):
    """A causal LM and its tokenizer on one device, stepped with a KV cache: the float32 reference
    runtime ('torch'), the oracle the fast runtimes (hartonomous.runtimes) are measured against."""

    runtime = "torch"

    def __init__(self, model, tokenizer, *, use_cache: bool = True):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.use_cache = use_cache
        self.device = next(model.parameters()).device
        self.vocab_size = int(model.config.vocab_size)

    @classmethod
    def load(cls, name_or_path: str = "smollm2", device: str = "auto", dtype: str = "float32") -> "ExactModel":
        """Load a model by name ('smollm2') or local folder onto `device` (auto | cpu | cuda)."""
        from hartonomous.model import load_model, load_tokenizer, pick_device

        device = pick_device(device)
        return cls(load_model(name_or_path, device, dtype), load_tokenizer(name_or_path))

    def new_cache(self) -> KVCache:
        return KVCache(self.model.config)

    def _eos_candidates(self) -> list:
        sources = (getattr(self.model, "generation_config", None), self.model.config)
        return [getattr(source, "eos_token_id", None) for source in sources if source is not None]

    def fingerprint(self) -> str:
        from hartonomous.speculative.draft_cost import architecture_fingerprint

        return "torch|" + architecture_fingerprint(self.model)

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], cache: KVCache) -> torch.Tensor:
        """Run the prompt through the model, filling `cache`; logits (V,) for the next token."""
        self._check(ids)
        cache.reset()
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, cache=cache.layers, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def decode_one_token(self, token_id: int, cache: KVCache) -> torch.Tensor:
        """Feed one token against the cache; logits (V,) for the token after it."""
        self._check([token_id])
        input_ids = torch.tensor([[int(token_id)]], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, cache=cache.layers, use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float()

    @torch.inference_mode()
    def extend(self, ids: Sequence[int], cache: KVCache, keep: int) -> torch.Tensor:
        """Feed several tokens against the cache in one forward; logits (keep, V) of the last
        `keep` positions, i.e. the next-token logits after each of the last `keep` prefixes.

        Speculative decoding verifies its draft with this: one forward scores every draft token.
        """
        self._check(ids)
        if not 1 <= keep <= len(ids):
            raise ValueError(f"keep must be between 1 and {len(ids)}, got {keep}")
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, cache=cache.layers, use_cache=True, logits_to_keep=keep)
        return out.logits[0].float()

    @torch.inference_mode()
    def extend_tree(self, pending: Sequence[int], branches: Sequence[Sequence[int]], cache: KVCache) -> torch.Tensor:
        """Feed `pending` (tokens in order) and a tree of `branches` (chains that all continue after
        `pending`) against the cache in one forward; logits (len(pending) + sum of branch lengths, V),
        one row per fed token, in that order: row i is the next-token logits after it.

        The tree is laid out flat after `pending`; a 4D additive attention mask (0 where a token may
        look, the dtype's minimum elsewhere) lets each token see the cache, `pending` and its own
        branch up to itself, and explicit position ids give a branch token at depth j the position
        it would have in its chain (siblings share positions). Every fed token's keys stay in the
        cache, in that layout; the caller crops what it does not keep.
        """
        flat = list(pending) + [t for branch in branches for t in branch]
        self._check(flat)
        past, n = cache.length, len(flat)
        allowed, positions = self.tree_layout(past, len(pending), [len(b) for b in branches])
        dtype = next(self.model.parameters()).dtype
        mask = torch.full((1, 1, n, past + n), torch.finfo(dtype).min, dtype=dtype)
        mask.masked_fill_(allowed[None, None], 0.0)
        input_ids = torch.tensor([flat], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, cache=cache.layers, use_cache=True,
                         attention_mask=mask.to(self.device),
                         position_ids=torch.tensor([positions], dtype=torch.long, device=self.device))
        return out.logits[0].float()

    @torch.inference_mode()
    def full_logits_many(self, ids: Sequence[int], keep: int) -> torch.Tensor:
        """Logits (keep, V) of the last `keep` positions, recomputed from scratch (no cache)."""
        self._check(ids)
        if not 1 <= keep <= len(ids):
            raise ValueError(f"keep must be between 1 and {len(ids)}, got {keep}")
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, use_cache=False, logits_to_keep=keep)
        return out.logits[0].float()
