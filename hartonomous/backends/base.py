"""The backend interface the generation engine drives, and the distribution it returns.

A backend turns a context into the next-token distribution after the shared sampler
(`hartonomous.sampling`); the engine picks the token, so both paths draw their randomness the
same way. Backends that can run the whole loop elsewhere (the database's `generate_tokens`)
also implement `generate_all`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SamplerArgs:
    """The sampler settings both paths share (docs/design.md, 'Sampler semantics')."""

    temperature: float = 1.0
    top_k: int | None = 40
    top_p: float = 0.9
    repetition_penalty: float = 1.0


@dataclass(frozen=True)
class Distribution:
    """Next-token candidates ordered by probability descending, then token id ascending."""

    token_ids: list[int]
    probabilities: list[float]

    def __len__(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a path."""

    name: str
    tokenizer: Any

    def eos_token_ids(self) -> set[int]:
        """Token ids that end a generation when EOS stopping is on."""

    def start(self, prompt_ids: list[int]) -> Any:
        """Begin a sequence (e.g. prefill the KV cache); returns backend state."""

    def distribution(self, state: Any, sampler: SamplerArgs) -> Distribution:
        """The next-token distribution for the state's context."""

    def advance(self, state: Any, token_id: int) -> None:
        """Append a chosen token to the state's context."""

    def close(self) -> None:
        """Release resources (connections, caches)."""


class WholeLoopBackend(Backend, Protocol):
    """A backend that can also run the entire loop in one call (in-database generation)."""

    def generate_all(self, prompt_ids: list[int], max_new_tokens: int, sampler: SamplerArgs, seed: int,
                     stop_token_ids: list[int], cancel: threading.Event) -> list[int]:
        """Generated ids (a stop token included); raises Cancelled if `cancel` fires first."""


class Cancelled(Exception):
    """Raised by a backend when a cancellation interrupted a call in progress."""
