"""Start-up after an unclean shutdown: stop the dead server's orphaned backends.

When the postmaster is killed (SIGKILL, OOM killer) while a backend runs a long query, that
backend keeps running, attached to the old shared memory, until it next waits. PostgreSQL
then refuses to start ("pre-existing shared memory block ... is still in use ... Terminate
any old server processes"). This module does what that hint says, for this data directory
only: it finds the processes attached to the segment named in the log (Linux /proc) and
stops them (SIGTERM, then SIGKILL after a grace period), so that `hartonomous db up` can
start the cluster; PostgreSQL's crash recovery then replays the WAL as usual.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

IN_USE = re.compile(r"pre-existing shared memory block \(key (\d+), ID \d+\) is still in use")


def shared_memory_in_use(log_file: Path, since: int = 0) -> int | None:
    """The key of the segment a start-up found in use, from what the log got after byte `since`."""
    try:
        with log_file.open("rb") as fh:
            fh.seek(since)
            tail = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    keys = [int(m.group(1)) for line in tail if (m := IN_USE.search(line))]
    return keys[-1] if keys else None


def attached_processes(key: int) -> list[int]:
    """PIDs of postgres processes that map the System V segment `key` (from /proc/*/maps)."""
    name = f"/SYSV{key:08x}"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if not (proc / "comm").read_text().startswith("postgres"):
                continue
            if any(line.rstrip().endswith((name, f"{name} (deleted)")) for line in (proc / "maps").open()):
                found.append(int(proc.name))
        except OSError:          # gone meanwhile, or not ours to read
            continue
    return found


def _alive(pids: list[int]) -> list[int]:
    """The pids still running (a zombie has released its memory: it counts as gone)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            alive.append(pid)
    return alive


def _signal_and_wait(pids: list[int], sig: int, wait_s: float) -> list[int]:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + wait_s
    while (left := _alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def stop_orphaned_backends(log_file: Path, since: int = 0, grace_s: float = 5.0) -> bool:
    """Stop what keeps the old shared memory in use; True when a new start-up is worth trying.

    Only acts when the start-up logged after byte `since` failed for that reason; waits at most
    about `grace_s` + 5 seconds.
    """
    key = shared_memory_in_use(log_file, since)
    if key is None:
        return False
    pids = attached_processes(key)
    if pids:
        left = _signal_and_wait(pids, signal.SIGTERM, grace_s)
        if left:
            _signal_and_wait(left, signal.SIGKILL, 5.0)
    return True
