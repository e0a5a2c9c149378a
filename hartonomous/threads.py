"""A fixed torch thread count for the numerics a build must reproduce (teacher forcing, learned positions).

torch splits some reductions between its intra-op threads, so their rounding can follow the thread
count, which environment variables (OMP_NUM_THREADS) or earlier code may have changed. Within
`fixed_threads()` torch uses one thread per CPU this process may run on: a property of the machine,
so the same command on the same machine always reduces in the same order.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def machine_threads() -> int:
    """The number of CPUs this process may run on (its affinity mask; all CPUs where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # platforms without sched_getaffinity
        return max(1, os.cpu_count() or 1)


@contextmanager
def fixed_threads(count: int | None = None) -> Iterator[int]:
    """torch's intra-op threads set to `count` (default: machine_threads()) inside the block, then
    restored; yields the count."""
    import torch

    count = machine_threads() if count is None else count
    before = torch.get_num_threads()
    if before != count:
        torch.set_num_threads(count)
    try:
        yield count
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
