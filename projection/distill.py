"""Teacher forcing with the exact model: the argmax next token at every position of a text.

Text is tokenized once and cut into chunks of `context_length` tokens; each chunk is one
context (the model and the atom keys see the same tokens). Chunks are run in batches of about
`batch_tokens` tokens; the language-model head is applied in slices so the full
(batch × length × vocab) logits never exist at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hartonomous.errors import UserError

HEAD_SLICE = 2048


@dataclass
class Distilled:
    """Token chunks and, per chunk, the exact model's argmax next token at each position."""

    chunks: list[np.ndarray]
    argmax: list[np.ndarray]
    seconds: float

    @property
    def tokens(self) -> int:
        return int(sum(len(c) for c in self.chunks))

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else float("inf")


def tokenize(tokenizer, text: str, max_tokens: int | None = None) -> tuple[np.ndarray, str]:
    """(token ids of text without special tokens, cut at max_tokens; the text those ids cover)."""
    if max_tokens is None or not getattr(tokenizer, "is_fast", False):
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"][:max_tokens]
        covered = text if max_tokens is None or len(ids) < max_tokens else tokenizer.decode(ids)
        return np.asarray(ids, dtype=np.int64), covered
    enc = tokenizer(text, add_special_tokens=False, verbose=False, return_offsets_mapping=True)
    ids = enc["input_ids"][:max_tokens]
    end = enc["offset_mapping"][len(ids) - 1][1] if ids else 0
    return np.asarray(ids, dtype=np.int64), text[:end]


def chunk_ids(ids: np.ndarray, context_length: int) -> list[np.ndarray]:
    """Consecutive chunks of at most context_length tokens; a last chunk of 1 token is dropped."""
    if context_length < 2:
        raise UserError(f"--context-length must be at least 2, got {context_length}")
    chunks = [ids[lo:lo + context_length] for lo in range(0, len(ids), context_length)]
    return [c for c in chunks if len(c) >= 2]


def distill(model, chunks: list[np.ndarray], batch_tokens: int = 4096,
            advance: Callable[[int], None] | None = None) -> Distilled:
    """Run the model over every chunk (teacher forcing) and keep the argmax at each position."""
    import torch

    if not chunks:
        raise UserError("the corpus has no text to distill; pass a longer --corpus or raise --max-tokens")
    device = next(model.parameters()).device
    body = model.base_model
    head = model.get_output_embeddings()
    order = sorted(range(len(chunks)), key=lambda i: -len(chunks[i]))
    results: list[np.ndarray | None] = [None] * len(chunks)
    start = time.perf_counter()
    pos = 0
    with torch.inference_mode():
        while pos < len(order):
            length = len(chunks[order[pos]])
            size = max(1, batch_tokens // length)
            batch = order[pos:pos + size]
            pos += len(batch)
            ids = torch.zeros((len(batch), length), dtype=torch.long)
            mask = torch.zeros((len(batch), length), dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, :len(chunks[i])] = torch.from_numpy(chunks[i])
                mask[row, :len(chunks[i])] = 1
            hidden = body(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
            flat = hidden.reshape(-1, hidden.shape[-1])
            best = torch.cat([head(part).argmax(-1) for part in flat.split(HEAD_SLICE)]).view(len(batch), length)
            best = best.cpu().numpy()
            for row, i in enumerate(batch):
                results[i] = best[row, :len(chunks[i])].astype(np.int64)
            if advance:
                advance(int(sum(len(chunks[i]) for i in batch)))
    return Distilled(list(chunks), [r for r in results if r is not None], time.perf_counter() - start)
