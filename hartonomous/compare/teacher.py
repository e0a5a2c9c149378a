"""Teacher forcing with the exact model: next-token log-probabilities at every position."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch


def max_context(model) -> int:
    """The longest sequence the model accepts (positions it was configured for)."""
    return int(getattr(model.config, "max_position_embeddings", 2048) or 2048)


@torch.inference_mode()
def log_probs(model, ids: Sequence[int]) -> torch.Tensor:
    """(len(ids), V) float32 log-softmax of the logits after each prefix ids[: t + 1] (T = 1)."""
    if len(ids) == 0:
        return torch.zeros((0, int(model.config.vocab_size)))
    if len(ids) > max_context(model):
        raise ValueError(f"{len(ids)} tokens exceed the model's {max_context(model)} positions")
    device = next(model.parameters()).device
    input_ids = torch.tensor([list(map(int, ids))], dtype=torch.long, device=device)
    logits = model(input_ids=input_ids, use_cache=False).logits[0].float()
    return torch.log_softmax(logits, dim=-1).cpu()


def argmax_labels(model, ids: Sequence[int], window: int = 512,
                  progress: Callable[[int], None] | None = None) -> np.ndarray:
    """The exact argmax after every prefix of a long corpus, in non-overlapping windows.

    Each window restarts the context, as the builder's teacher forcing does when it
    distils a corpus longer than one forward pass.
    """
    window = min(window, max_context(model))
    labels = np.empty(len(ids), dtype=np.int64)
    for lo in range(0, len(ids), window):
        chunk = list(ids[lo:lo + window])
        with torch.inference_mode():
            device = next(model.parameters()).device
            logits = model(input_ids=torch.tensor([chunk], device=device), use_cache=False).logits[0]
        labels[lo:lo + len(chunk)] = logits.argmax(dim=-1).cpu().numpy()
        if progress:
            progress(len(chunk))
    return labels
