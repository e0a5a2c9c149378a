"""The backend interfaces the generation engine drives, and the distribution they return.

Two kinds of backend, and the engine dispatches on which one it is given:

- a step `Backend` turns a context into the next-token distribution after the shared sampler
  (`hartonomous.sampling`); the engine picks the token, so every step-by-step path draws its
  randomness the same way;
- a `WholeLoopBackend` runs the entire loop in one call elsewhere (the database's
  `generate_tokens`; see `hartonomous.backends.in_database`) and returns the generated ids.

Both receive the sampler settings as `SamplerArgs` (hartonomous.generation_config).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from hartonomous.generation_config import SamplerArgs


@dataclass(frozen=True)
class Distribution:
    """Next-token candidates ordered by probability descending, then token id ascending."""

    token_ids: list[int]
    probabilities: list[float]

    def __len__(self) -> int:
        return len(self.token_ids)


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a path that it drives step by step."""

    name: str
    tokenizer: Any
    atom_set_name: str | None       # the atom set the path reads; None for the exact path

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


class WholeLoopBackend(ABC):
    """A backend that runs the entire generation loop in one call (in-database generation).

    The engine recognises it by type and calls `generate_all` once instead of stepping; the
    events it then yields carry no probabilities, timings per token or distributions.
    """

    name: str
    tokenizer: Any
    atom_set_name: str | None

    @abstractmethod
    def eos_token_ids(self) -> set[int]:
        """Token ids that end a generation when EOS stopping is on."""

    @abstractmethod
    def generate_all(self, prompt_ids: list[int], max_new_tokens: int, sampler: SamplerArgs, seed: int,
                     stop_token_ids: list[int], cancel: threading.Event) -> list[int]:
        """Generated ids (a stop token included); raises Cancelled if `cancel` fires first."""

    @abstractmethod
    def close(self) -> None:
        """Release resources (connections)."""


class Cancelled(Exception):
    """Raised by a backend when a cancellation interrupted a call in progress."""
