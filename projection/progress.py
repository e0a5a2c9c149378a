"""Progress reporting for builds: a no-op reporter (tests, library use) and a rich one (CLI)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Reporter:
    """Silent: steps and bars are accepted and ignored."""

    def step(self, message: str) -> None:
        pass

    @contextmanager
    def bar(self, description: str, total: int, unit: str = "it") -> Iterator[Callable[[int], None]]:
        yield lambda n=1: None


class RichReporter(Reporter):
    """Timestamped steps and rich progress bars with a rate column."""

    def __init__(self, console) -> None:
        self.console = console
        self.start = time.perf_counter()

    def step(self, message: str) -> None:
        self.console.print(f"[dim]{time.perf_counter() - self.start:7.1f}s[/dim] {message}")

    @contextmanager
    def bar(self, description: str, total: int, unit: str = "it") -> Iterator[Callable[[int], None]]:
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, ProgressColumn, TextColumn,
                                   TimeElapsedColumn, TimeRemainingColumn)
        from rich.text import Text

        class Rate(ProgressColumn):
            def render(self, task) -> Text:
                speed = task.finished_speed or task.speed
                return Text(f"{speed:,.0f} {unit}/s" if speed else "", style="cyan")

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), Rate(),
                   TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=False) as progress:
            task = progress.add_task(description, total=total)
            yield lambda n=1: progress.advance(task, n)
