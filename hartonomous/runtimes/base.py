"""What every exact runtime shares: input checks, EOS ids, the tree layout, from-scratch logits.

A runtime is one implementation of the exact model's operations (gpt-fast's split):
`prefill(ids, cache)` and `decode_one_token(token, cache)` return the next-token logits (V,);
`extend(ids, cache, keep)` feeds several tokens in one forward and returns the logits after each of
the last `keep`; `extend_tree(pending, branches, cache)` verifies a tree of drafts in one forward;
`cache.crop(n)` rolls back. Logits are float32 on every runtime, and sampling is not here: the
engine sends them through hartonomous.sampling, so every runtime samples the same way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hartonomous.errors import UserError


class RuntimeModel:
    """The shared part of the exact model's operations; subclasses provide the forward."""

    runtime: str = "?"
    tokenizer = None
    vocab_size: int = 0
    use_cache: bool = True

    def _eos_candidates(self) -> list[int | None]:
        """EOS ids the model's own files name (generation config, config, GGUF metadata)."""
        return []

    def eos_token_ids(self) -> set[int]:
        ids: set[int] = set()
        for eos in self._eos_candidates():
            if isinstance(eos, int):
                ids.add(eos)
            elif eos:
                ids.update(int(e) for e in eos)
        if getattr(self.tokenizer, "eos_token_id", None) is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return ids

    def _check(self, ids: Sequence[int]) -> None:
        if len(ids) == 0:
            raise UserError("the prompt is empty; give at least one token of text")
        bad = [i for i in ids if not 0 <= int(i) < self.vocab_size]
        if bad:
            raise UserError(f"token id {bad[0]} is outside the model's vocabulary (0..{self.vocab_size - 1})")

    def fingerprint(self) -> str:
        """What the cost of a forward depends on (the speculative cost model's cache key)."""
        raise NotImplementedError

    @staticmethod
    def tree_layout(past: int, pending: int, lengths: Sequence[int]) -> tuple[torch.Tensor, list[int]]:
        """Who may attend to whom when `pending` tokens and then branches of `lengths` are fed flat
        after `past` cached ones: a bool mask (n, past + n), and every fed token's position (a branch
        token at depth j gets the position it would have in its chain; siblings share positions)."""
        n = pending + sum(lengths)
        allowed = torch.zeros(n, past + n, dtype=torch.bool)
        allowed[:, :past] = True
        allowed[:pending, past:past + pending] = torch.ones(pending, pending, dtype=torch.bool).tril()
        positions = list(range(past, past + pending))
        row = pending
        for k in lengths:
            allowed[row:row + k, past:past + pending] = True
            allowed[row:row + k, past + row:past + row + k] = torch.ones(k, k, dtype=torch.bool).tril()
            positions.extend(range(past + pending, past + pending + k))
            row += k
        return allowed, positions

    def full_logits_many(self, ids: Sequence[int], keep: int) -> torch.Tensor:
        raise NotImplementedError

    def full_logits(self, ids: Sequence[int]) -> torch.Tensor:
        """Next-token logits recomputed from scratch (no cache): the reference the cache must match."""
        return self.full_logits_many(ids, 1)[0]
