"""Side-by-side comparison of the spatial path with exact inference (`hartonomous compare`).

    result = run_compare(conn, CompareOptions(atom_set="smollm2-context"))
    write_report(result.report, result.figures, Path("reports/smollm2-context"))

Names are imported on first use, so `hartonomous --help` does not pay for torch and scipy.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "write_report": "hartonomous.compare.render",
    "CompareOptions": "hartonomous.compare.runner",
    "CompareResult": "hartonomous.compare.runner",
    "run_compare": "hartonomous.compare.runner",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hartonomous.compare' has no attribute {name!r}")
