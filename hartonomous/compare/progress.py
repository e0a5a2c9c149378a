"""What `compare` tells a progress display: a stage with its size, then steps through it."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def stage(self, description: str, total: int) -> None: ...
    def advance(self, n: int = 1) -> None: ...


class NoProgress:
    """A display that shows nothing (library calls and tests)."""

    def stage(self, description: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass
