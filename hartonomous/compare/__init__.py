"""Side-by-side comparison of the spatial path with exact inference (`hartonomous compare`).

    result = run_compare(conn, CompareOptions(atom_set="smollm2-context"))
    write_report(result.report, result.figures, Path("reports/smollm2-context"))
"""

from hartonomous.compare.render import write_report
from hartonomous.compare.runner import CompareOptions, CompareResult, run_compare

__all__ = ["CompareOptions", "CompareResult", "run_compare", "write_report"]
