"""The model's context: a prompt plus the tokens asked for must fit in it (torch-free, for the engine)."""

from __future__ import annotations

from typing import Any


def context_limit(backend: Any) -> int | None:
    """The context in tokens of the exact model a backend runs (its own, or its exact side's), where
    the runtime declares one (`context_limit()`: the int4 runtime, the GGUF's context length)."""
    model = getattr(backend, "model", None) or getattr(getattr(backend, "exact", None), "model", None)
    limit = getattr(model, "context_limit", None)
    return int(limit()) if callable(limit) else None
