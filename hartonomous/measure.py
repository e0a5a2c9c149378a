"""Measurement helpers shared by `hartonomous compare`, `hartonomous bench` and the load runner.

One home for: the percentile of a list of timings, the shared buffers and execution time of one
statement under `EXPLAIN (ANALYZE, BUFFERS)`, and the description of the machine a number was
taken on (one set of key names for every report; see `MACHINE_KEYS`), with the commit of the
code that took it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg

from hartonomous.model import exact_model_description

SERVER_SETTINGS = ("shared_buffers", "work_mem", "effective_cache_size", "jit")
MACHINE_KEYS = ("cpu", "cores", "memory_gib", "load_average", "os", "python",
                "postgresql", "postgis", "pgvector", "server_settings",
                "torch", "torch_threads", "exact_device", "gpu", "exact_model", "commit", "dirty")
PACKAGE_ROOT = Path(__file__).resolve().parent.parent   # the checkout (or site-packages) holding hartonomous/


# --- percentiles ----------------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (q in [0, 100]) with linear interpolation between ranks (numpy's
    default); None when there are no values, so JSON reports get null rather than NaN."""
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


# --- EXPLAIN (ANALYZE, BUFFERS) -----------------------------------------------------------------

@dataclass(frozen=True)
class Explained:
    """One statement as EXPLAIN (ANALYZE, BUFFERS) saw it."""

    execution_ms: float     # "Execution Time": the executor's time, without planning
    shared_buffers: float   # shared hits + reads of the top plan node (nested statements included)


def explain(conn: psycopg.Connection, sql: str, params: Sequence = ()) -> Explained:
    """Run `sql` under EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) and read the top node.

    The top node counts every buffer the statement pins, a function's nested statements
    included; each pin counts once, so a page read twice counts twice (hits + reads).
    """
    (plan,) = conn.execute("EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) " + sql, params).fetchone()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]
    node = top["Plan"]
    return Explained(execution_ms=float(top["Execution Time"]),
                     shared_buffers=float(node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)))


# --- the machine ----------------------------------------------------------------------------------

def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15-minute load averages, rounded; None where the OS has none."""
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def host() -> dict:
    """CPU, usable cores, memory, load, OS and Python of this process's machine."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": _cpu_model(), "cores": usable, "memory_gib": _memory_gib(), "load_average": load_average(),
            "os": f"{platform.system()} {platform.release()}", "python": platform.python_version()}


def database(conn: psycopg.Connection) -> dict:
    """The server's PostgreSQL, PostGIS and pgvector versions and the settings that shape timings."""
    pg = conn.execute("SHOW server_version").fetchone()[0]
    ext = dict(conn.execute("SELECT extname, extversion FROM pg_extension "
                            "WHERE extname IN ('postgis', 'vector')").fetchall())
    settings = dict(conn.execute("SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                                 (list(SERVER_SETTINGS),)).fetchall())
    return {"postgresql": pg, "postgis": ext.get("postgis"), "pgvector": ext.get("vector"),
            "server_settings": {name: settings.get(name) for name in SERVER_SETTINGS}}


def exact_path(exact_device: str | None, exact_model: str | None) -> dict:
    """torch, its threads, the exact path's device, the GPU torch sees and what "exact" means;
    all None when no exact path ran (torch is then not imported)."""
    if exact_device is None:
        return {"torch": None, "torch_threads": None, "exact_device": None, "gpu": None, "exact_model": None}
    import torch

    return {"torch": torch.__version__, "torch_threads": torch.get_num_threads(), "exact_device": exact_device,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "exact_model": exact_model_description(exact_model) if exact_model else None}


def _git(root: Path, *args: str) -> str | None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}   # this checkout, not an outer one
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def checkout(root: Path = PACKAGE_ROOT) -> dict:
    """{"commit": `git rev-parse HEAD`, "dirty": tracked files differ from it} of the git checkout whose
    top level is `root` (by default the one this package runs from); both None when `root` is not
    the top of a git checkout (an installed wheel) or git is not there. Untracked files do not count."""
    top = _git(root, "rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != Path(root).resolve():
        return {"commit": None, "dirty": None}
    commit = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if commit is None or status is None else bool(status)}


def describe_machine(conn: psycopg.Connection, exact_device: str | None = None,
                     exact_model: str | None = None) -> dict:
    """Every key of MACHINE_KEYS: the host, the database server, the exact path when one ran, and
    the commit of the code (`checkout`)."""
    return {**host(), **database(conn), **exact_path(exact_device, exact_model), **checkout()}


def load_warning(machine: dict | None) -> str:
    """A sentence when other work competed for the CPUs while we timed (1-minute load > cores)."""
    load, cores = (machine or {}).get("load_average"), (machine or {}).get("cores")
    if load and cores and load[0] > cores:
        return (f" Caution: the machine was busy (1-minute load average {load[0]:g} on {cores} cores) "
                "while this was timed, so these latencies are inflated.")
    return ""
