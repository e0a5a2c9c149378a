"""Build and load the int4 runtime's native forward (hartonomous/runtimes/native/int4_forward.cpp).

One translation unit against the venv's own torch headers and libraries, compiled by the system's
C++ compiler directly (no pip, so no build isolation fetching another torch, and no ninja). The
shared object is kept under the venv, keyed by the source, the torch version, the compiler flags and
the CPU's instruction set (it is built with -march=native), so it is compiled once per venv and CPU:
`make install-native` (which `make install` runs) builds it, later runs only load it.

Where no compiler is found or the build fails, `build()` says so in one line and the int4 runtime
keeps its Python forward; `load()` never builds, it finds the built object or answers None.
`python -m hartonomous.runtimes.native_build` is the make target's command.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from functools import lru_cache
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("native") / "int4_forward.cpp"
NAME = "hartonomous_int4_forward"
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-std=c++17", "-fPIC", "-shared",
         "-fopenmp", "-w")
BUILD_SECONDS = 900         # a quiet 2-core machine takes ~30 s, a busy one several minutes


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ""


def build_dir() -> Path:
    """Where built objects live: HARTONOMOUS_NATIVE_DIR, else the venv's share/hartonomous-native."""
    return Path(os.environ.get("HARTONOMOUS_NATIVE_DIR") or Path(sys.prefix) / "share" / "hartonomous-native")


def target() -> Path:
    """The shared object for this source, torch, flag set and CPU."""
    import torch

    key = hashlib.sha256(SOURCE.read_bytes())
    key.update(f"|{torch.__version__}|{' '.join(FLAGS)}|{_cpu_flags()}|{sys.version_info[:2]}".encode())
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return build_dir() / f"{NAME}-{key.hexdigest()[:16]}{suffix}"


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def command(out: Path, cxx: str) -> list[str]:
    import torch
    from torch.utils import cpp_extension

    abi = int(torch.compiled_with_cxx11_abi())
    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    libs = cpp_extension.library_paths()
    return [cxx, *FLAGS, f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-DTORCH_EXTENSION_NAME={NAME}",
            "-DTORCH_API_INCLUDE_EXTENSION_H", *includes, str(SOURCE), "-o", str(out),
            *[f"-L{p}" for p in libs], *[f"-Wl,-rpath,{p}" for p in libs],
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def build(force: bool = False) -> tuple[bool, str]:
    """Compile the native forward unless built: (ok, one line saying what happened)."""
    out = target()
    if out.exists() and not force:
        return True, f"native int4 forward: built ({out})"
    cxx = compiler()
    if cxx is None:
        return False, "native int4 forward: no C++ compiler found (install g++); the int4 runtime keeps its Python forward"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    started = time.perf_counter()
    try:
        done = subprocess.run(command(tmp, cxx), capture_output=True, text=True, timeout=BUILD_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as exc:
        tmp.unlink(missing_ok=True)
        return False, f"native int4 forward: the build failed ({type(exc).__name__}); the int4 runtime keeps its Python forward"
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        first = next((line for line in done.stderr.splitlines() if "error" in line), done.stderr.strip()[:200])
        return False, f"native int4 forward: the build failed ({first}); the int4 runtime keeps its Python forward"
    tmp.replace(out)
    for old in out.parent.glob(f"{NAME}-*"):            # builds of earlier sources (a loaded one stays mapped)
        if old != out and ".tmp" not in old.name:      # another build in progress writes a .tmp
            old.unlink(missing_ok=True)
    return True, f"native int4 forward: built in {time.perf_counter() - started:.0f} s ({out})"


@lru_cache(maxsize=1)
def load() -> ModuleType | None:
    """The built extension module, or None when it is not built here (or does not load)."""
    import torch  # noqa: F401 - the extension links against torch's libraries, loaded first

    try:
        path = target()
    except OSError:
        return None
    if not path.exists():
        return None
    loader = importlib.machinery.ExtensionFileLoader(NAME, str(path))
    spec = importlib.util.spec_from_file_location(NAME, str(path), loader=loader)
    try:
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
    except ImportError:
        return None
    return module


def main() -> int:
    ok, line = build(force="--force" in sys.argv)
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
