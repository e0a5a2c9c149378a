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

# Teacher-forced positions scored by default (--max-positions): at 2,000 one standard error of a
# top-1 rate is about 0.01. Here, not in the runner, so that the CLI's --help stays light.
DEFAULT_MAX_POSITIONS = 2000


__getattr__ = lazy_exports(__name__, _EXPORTS)
