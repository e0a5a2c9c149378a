"""Side-by-side comparison of the spatial path with exact inference (`hartonomous compare`).

    result = run_compare(conn, CompareOptions(atom_set="smollm2-context"))
    write_report(result.report, result.figures, Path("reports/smollm2-context"))

Names are imported on first use, so `hartonomous --help` does not pay for torch and scipy.
"""

from __future__ import annotations

from hartonomous.lazy import lazy_exports

_EXPORTS = {
    "write_report": "hartonomous.compare.render",
    "CompareOptions": "hartonomous.compare.runner",
    "CompareResult": "hartonomous.compare.runner",
    "run_compare": "hartonomous.compare.runner",
}
__all__ = list(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
