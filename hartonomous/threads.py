"""Fixed thread counts for the numerics a build must reproduce (issue 22: deterministic builds).

Some results follow the number of threads that computed them: LAPACK's symmetric eigensolver
(numpy.linalg.eigh, the LMDS and PCA projections) gives other last bits on 1 and 2 BLAS threads,
and torch splits large reductions between its intra-op threads. Those counts come from
environment variables (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS) or from whatever code ran
earlier. Within `fixed_threads()` torch and every BLAS library loaded (threadpoolctl) use one
thread per CPU this process may run on: a property of the machine, so the same command on the
same machine always reduces in the same order.
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
    """torch's intra-op threads and the BLAS threads set to `count` (default: machine_threads())
    inside the block, then restored; yields the count."""
    import torch
    from threadpoolctl import threadpool_limits

    count = machine_threads() if count is None else count
    before = torch.get_num_threads()
    if before != count:
        torch.set_num_threads(count)
    try:
        with threadpool_limits(limits=count, user_api="blas"):
            yield count
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
