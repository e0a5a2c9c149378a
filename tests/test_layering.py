"""Dependency direction, read from the source with `ast` (no imports are executed, so an import
inside a function counts as much as one at the top of a module).

1. The offline build (`projection`) and the benchmarks (`benchmarks`) may use the runtime
   (`hartonomous`), never the other way round, except in `hartonomous/cli.py`, the composition
   root that wires them together.
2. Inside the runtime, the core (what one inference step is made of: the generation options,
   the sampler, the SQL calls, adaptive sampling, kernel, centroid, entropies, signals, risk,
   the atom-set catalog, the holdout splits, errors, text streaming) imports nothing built on top
   of it: not the engine, the backends, the client, the server, the command line, compare or the
   benchmarks.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hartonomous"
COMPOSITION_ROOT = "hartonomous/cli.py"
OUTSIDE_THE_RUNTIME = ("projection", "benchmarks")

CORE = ("hartonomous/generation_config.py", "hartonomous/sampling.py", "hartonomous/sqlcalls.py",
        "hartonomous/adaptive.py", "hartonomous/kernel.py", "hartonomous/centroid.py", "hartonomous/entropy.py",
        "hartonomous/signals.py", "hartonomous/risk.py", "hartonomous/errors.py", "hartonomous/textstream.py",
        "hartonomous/splits.py", "hartonomous/atomset")
ABOVE_THE_CORE = ("hartonomous.engine", "hartonomous.backends", "hartonomous.speculative", "hartonomous.client",
                  "hartonomous.server", "hartonomous.cli", "hartonomous.cli_generate", "hartonomous.db.cluster_cli",
                  "hartonomous.compare", "benchmarks", "projection")


def imported_modules(source: str) -> set[str]:
    """Every absolute module name a Python source imports (`import a.b`, `from a.b import c`); for
    `from package import name` also `package.name`, since the name may be a submodule."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def within(name: str, packages: tuple[str, ...]) -> bool:
    """Whether module `name` is one of `packages` or inside one of them."""
    return any(name == p or name.startswith(p + ".") for p in packages)


def imports_any(source: str, packages: tuple[str, ...]) -> bool:
    return any(within(name, packages) for name in imported_modules(source))


def imports_projection(source: str) -> bool:
    return imports_any(source, ("projection",))


def python_files(*paths: str) -> list[Path]:
    files: list[Path] = []
    for relative in paths:
        path = ROOT / relative
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_the_import_finder_sees_every_form_of_import() -> None:
    assert imports_projection("import projection")
    assert imports_projection("import projection.ingest as ingest")
    assert imports_projection("def f():\n    from projection.corpus import load_corpus\n")
    assert imports_projection("from projection import build")
    assert not imports_projection("import projectionist\nfrom hartonomous.corpus.sources import load_corpus\n")
    assert not imports_projection("from .projection import x")  # relative: inside the importing package
    assert imports_any("from hartonomous import engine", ("hartonomous.engine",))
    assert imports_any("from hartonomous.backends.base import Distribution", ("hartonomous.backends",))
    assert not imports_any("from hartonomous.engines import x\nimport hartonomous.backendsx",
                           ("hartonomous.engine", "hartonomous.backends"))


def test_nothing_in_the_runtime_imports_the_build_or_the_benchmarks_except_the_cli() -> None:
    offenders = sorted(
        path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")
        if imports_any(path.read_text(encoding="utf-8"), OUTSIDE_THE_RUNTIME)
    )
    assert [p for p in offenders if p != COMPOSITION_ROOT] == [], "runtime modules import projection or benchmarks"


def test_the_core_list_names_files_that_exist() -> None:
    missing = [p for p in CORE if not (ROOT / p).exists()]
    assert missing == [], f"CORE names files that are gone: {missing}"


def test_the_runtime_core_imports_nothing_above_it() -> None:
    offenders = {
        path.relative_to(ROOT).as_posix(): sorted(name for name in imported_modules(path.read_text(encoding="utf-8"))
                                                  if within(name, ABOVE_THE_CORE))
        for path in python_files(*CORE)
    }
    assert {path: names for path, names in offenders.items() if names} == {}, "the core imports a layer above it"


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_the_cycle_finder_finds_a_circle_through_three_modules() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_no_runtime_modules_import_each_other_even_for_type_checking() -> None:
    """A reader follows imports one way. The package root's lazy `Client`/`Engine` names are not
    imports of the package by its modules, so `from hartonomous import sqlcalls` counts as
    `hartonomous.sqlcalls` only."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {
        name: {imported for imported in imported_modules(path.read_text(encoding="utf-8"))
               if imported in modules and imported not in (name, "hartonomous")}
        for name, path in modules.items()
    }
    assert import_cycles(graph) == []


def test_the_inference_runtime_never_imports_the_build_time_text_and_labels() -> None:
    """hartonomous.corpus (corpora, teacher labels, self-distillation) serves the build and
    compare; generating text needs none of it, so the engine, backends, speculative decoding,
    client and server load without it. Indexing a repository (hartonomous/repository/) reads and cuts
    files as the build reads its corpus."""
    users = ("hartonomous/corpus/", "hartonomous/compare/", "hartonomous/augment/calibrate.py", "hartonomous/repository/",
             COMPOSITION_ROOT)
    offenders = sorted(
        path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*.py")
        if not path.relative_to(ROOT).as_posix().startswith(users)
        and imports_any(path.read_text(encoding="utf-8"), ("hartonomous.corpus",))
    )
    assert offenders == []
