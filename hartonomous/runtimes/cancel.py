"""The cancel event of the generation a thread runs, for forwards long enough to stop inside.

The engine runs a generation under `watching(session.cancel_event)`; a runtime's long forward (a
prompt of thousands of tokens, a decode step at the full context) asks `cancel_check()` for a
callable it polls between layers, and stops with hartonomous.backends.base.Cancelled when the event
is set. A thread that runs no generation gets None: nothing to poll.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_local = threading.local()


@contextmanager
def watching(event: threading.Event | None) -> Iterator[None]:
    """Make `event` the cancel of this thread's forwards for the block (generations in one thread may
    interleave as generators: each leaves exactly its own entry)."""
    if event is None:
        yield
        return
    stack = _local.__dict__.setdefault("events", [])
    token = (event,)
    stack.append(token)
    try:
        yield
    finally:
        for i in range(len(stack) - 1, -1, -1):
            if stack[i] is token:
                del stack[i]
                break


def current() -> threading.Event | None:
    stack = getattr(_local, "events", None)
    return stack[-1][0] if stack else None


def cancel_check() -> Callable[[], bool] | None:
    """The callable a forward polls (the event's is_set), or None when no generation watches."""
    event = current()
    return None if event is None else event.is_set
