"""Dependency direction: the offline build (`projection`) may use the runtime core (`hartonomous`),
never the other way round, except in `hartonomous/cli.py`, the composition root that wires both.

Read from the source with `ast` (no imports are executed), so an import inside a function counts
as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hartonomous"
COMPOSITION_ROOT = "hartonomous/cli.py"


def imported_modules(source: str) -> set[str]:
    """Every absolute module name a Python source imports (`import a.b`, `from a.b import c`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def imports_projection(source: str) -> bool:
    return any(name == "projection" or name.startswith("projection.") for name in imported_modules(source))


def test_the_import_finder_sees_every_form_of_import() -> None:
    assert imports_projection("import projection")
    assert imports_projection("import projection.ingest as ingest")
    assert imports_projection("def f():\n    from projection.corpus import load_corpus\n")
    assert imports_projection("from projection import build")
    assert not imports_projection("import projectionist\nfrom hartonomous.corpus import load_corpus\n")
    assert not imports_projection("from .projection import x")  # relative: inside the importing package


def test_nothing_in_the_runtime_imports_projection_except_the_cli() -> None:
    offenders = sorted(
        path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")
        if imports_projection(path.read_text(encoding="utf-8"))
    )
    assert [p for p in offenders if p != COMPOSITION_ROOT] == [], "runtime modules import projection"

