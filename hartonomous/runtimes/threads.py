"""How many threads the exact model's forwards use: all the cores on a quiet machine, fewer beside
busy neighbours.

torch's OpenMP threads meet at a barrier after every operation (about 600 per decoded token). When
another process holds one of two cores, the thread scheduled there reaches each barrier a time
slice late, and a 25 ms decode step took 1.8 s (docs/runtimes.md, "Threads under load"). So, unless
a count is given, the count is chosen again before each prompt: the cores this process may run on,
less the other tasks running right now (the kernel's run queue, /proc/loadavg), at least one.
"""

from __future__ import annotations

import os

from hartonomous.errors import UserError


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def check_threads(threads: int | None, option: str = "--threads") -> int | None:
    """`threads` when it is between 1 and the cores (None stays None: the adaptive default)."""
    if threads is not None and not 1 <= threads <= cores():
        raise UserError(f"{option} must be between 1 and {cores()} (this machine's cores), got {threads}")
    return threads


def _own_running() -> int:
    """This process's threads running now (its OpenMP threads spin a while after each forward)."""
    count = 0
    try:
        for task in os.scandir("/proc/self/task"):
            try:
                with open(f"{task.path}/stat") as f:
                    count += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except (OSError, IndexError):
                continue
    except OSError:
        return 1
    return max(1, count)


def busy_neighbours() -> int:
    """Other processes' tasks running now: the run queue's count in /proc/loadavg less this process's
    running threads; 0 where the kernel does not say."""
    try:
        with open("/proc/loadavg") as f:
            running = int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return 0
    return max(0, running - _own_running())


class ThreadPolicy:
    """A fixed thread count, or (None) the cores less the busy neighbours, chosen at each `apply`."""

    def __init__(self, fixed: int | None = None):
        self.fixed = check_threads(fixed)

    def choose(self) -> int:
        if self.fixed is not None:
            return self.fixed
        return max(1, min(cores(), cores() - busy_neighbours()))

    def apply(self) -> int:
        """Set torch's thread count for the next forwards; the count set."""
        import torch

        threads = self.choose()
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return threads

    def describe(self) -> str:
        return f"{self.fixed} (fixed)" if self.fixed is not None else f"auto (up to {cores()})"
