"""Every file, module and link the docs and the sources' docstrings and comments name exists.

Read: README.md and every Markdown file under docs/; the whole text (docstrings, comments and all)
of the Python, SQL and shell sources under hartonomous/, projection/, sql/, benchmarks/, scripts/
and migrations/. Three kinds of reference are checked:

- a path from the repository root with a file suffix (`hartonomous/engine.py`, `sql/070_memory.sql`,
  `benchmarks/augmented.py`, `tests/test_load.py`, `scripts/install-kernel.sh`) names a file, from
  the root or, in a document, from the document's own folder or docs/; a pattern (`sql/*.sql`,
  `{a,b}`, `<date>`) must match at least one. A folder holds its own kinds of file: `sql/events.py`
  (a file of SQLAlchemy's, docs/augmented.md) is not a path of sql/, which holds no Python;
- a dotted module (`hartonomous.corpus.origin.recorded_training_text`) resolves: each part is a
  package, a module (what follows is its attribute) or a name its package's `__init__` holds; the
  custom settings the SQL reads (`hartonomous.knn_routed`) are settings, not modules;
- a relative Markdown link (`[x](results/y.json)`, `(../benchmarks/z.md#anchor)`) names a file.

Tests are not read: their fixtures name files that exist only while they run.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("hartonomous", "projection", "sql", "benchmarks", "scripts", "migrations")
SOURCE_SUFFIXES = (".py", ".sql", ".sh")
TOP_DIRS = (*SOURCE_DIRS, "tests", "ext", "docs", "docker")
SUFFIXES = ("py", "sql", "sh", "md", "json", "c", "h", "control", "html", "js", "css", "log", "toml", "yml", "png",
            "gz")

# A path from the root: not inside a longer path or word (`../benchmarks/x.md` is a link, read below).
PATH = re.compile(r"(?<![\w/.-])((?:%s)/[\w./*{},<>-]*\.(?:%s))(?![\w/-])" % ("|".join(TOP_DIRS), "|".join(SUFFIXES)))
MODULE = re.compile(r"(?<![\w.])hartonomous((?:\.[A-Za-z_]\w*)+)")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
SETTING = re.compile(r"'hartonomous\.([a-z_]+)'")
FILE_SUFFIXES = ("py", "md", "json", "toml", "sql", "log", "txt")   # `hartonomous.toml` is a file name

# Stale references in files whose owners edit them separately; each entry must still be stale (the
# test fails once it is fixed, so that the entry goes).
KNOWN_STALE: dict[str, set[str]] = {}


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def sources() -> list[Path]:
    return [p for d in SOURCE_DIRS for p in sorted((ROOT / d).rglob("*"))
            if p.suffix in SOURCE_SUFFIXES and "__pycache__" not in p.parts]


def expand(pattern: str) -> list[str]:
    """`{a,b}` alternatives spelled out, `<placeholder>` as `*`."""
    pattern = re.sub(r"<[^<>/]*>", "*", pattern)
    parts = re.split(r"(\{[^{}]*\})", pattern)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


@cache
def suffixes_in(top: str) -> set[str]:
    """The file suffixes a top-level folder holds (what kind of file a path into it can name)."""
    return {p.suffix for p in (ROOT / top).rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def path_exists(ref: str, bases: list[Path]) -> bool:
    """Whether `ref` names a file (a pattern: matches one) from one of `bases`, or names a kind of file
    its top-level folder does not hold (someone else's path: `sql/events.py`)."""
    if Path(ref).suffix not in suffixes_in(ref.split("/")[0]):
        return True
    for pattern in expand(ref):
        for base in bases:
            if any(c in pattern for c in "*?["):
                if next(iter(base.glob(pattern)), None) is not None:
                    break
            elif (base / pattern).exists():
                break
        else:
            return False
    return True


def settings() -> set[str]:
    """The custom settings (`hartonomous.X`) the SQL reads and sets."""
    return {m.group(1) for p in sorted((ROOT / "sql").glob("*.sql")) for m in SETTING.finditer(p.read_text())}


def module_exists(dotted: str, known_settings: frozenset[str] = frozenset()) -> bool:
    """Whether `hartonomous.a.b.c` resolves: packages, then a module (the rest is its attribute), or a
    name the last package's `__init__.py` holds."""
    parts = dotted.split(".")[1:]
    if parts and parts[-1] in FILE_SUFFIXES:
        parts = parts[:-1]
    if len(parts) == 1 and parts[0] in known_settings:
        return True
    base = ROOT / "hartonomous"
    for part in parts:
        if (base / part / "__init__.py").exists():
            base = base / part
        elif (base / f"{part}.py").exists():
            return True
        else:
            return re.search(rf"\b{re.escape(part)}\b", (base / "__init__.py").read_text()) is not None
    return True


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def missing_paths(path: Path, text: str) -> Iterator[tuple[int, str]]:
    bases = [ROOT] if path.suffix != ".md" else [ROOT, path.parent, ROOT / "docs"]
    for m in PATH.finditer(text):
        if not path_exists(m.group(1), bases):
            yield line_of(text, m.start()), m.group(1)


def missing_modules(text: str, known_settings: frozenset[str]) -> Iterator[tuple[int, str]]:
    for m in MODULE.finditer(text):
        if not module_exists(m.group(0), known_settings):
            yield line_of(text, m.start()), m.group(0)


def missing_links(path: Path, text: str) -> Iterator[tuple[int, str]]:
    for m in LINK.finditer(text):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):     # http:, mailto: ...
            continue
        if not (path.parent / target).exists():
            yield line_of(text, m.start()), target


def stale(path: Path, known_settings: frozenset[str]) -> list[str]:
    text = path.read_text(errors="replace")
    found = [*missing_paths(path, text), *missing_modules(text, known_settings)]
    if path.suffix == ".md":
        found += list(missing_links(path, text))
    return [f"{path.relative_to(ROOT)}:{line}: {ref}" for line, ref in found]


def without_known(found: list[str]) -> list[str]:
    return [f for f in found if f.split(":")[0] not in KNOWN_STALE
            or f.split(": ", 1)[1] not in KNOWN_STALE[f.split(":")[0]]]


# -- the repository ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def known_settings() -> frozenset[str]:
    found = frozenset(settings())
    assert {"knn_routed", "knn_fanned_out"} <= found
    return found


def test_every_path_module_and_link_the_docs_name_exists(known_settings):
    found = [f for p in documents() for f in stale(p, known_settings)]
    assert not without_known(found), "\n".join(["named but missing:", *without_known(found)])


def test_every_path_and_module_the_sources_name_exists(known_settings):
    found = [f for p in sources() for f in stale(p, known_settings)]
    assert not without_known(found), "\n".join(["named but missing:", *without_known(found)])


def test_each_known_stale_reference_is_still_there(known_settings):
    """An entry of KNOWN_STALE goes once its file is fixed."""
    for name, refs in KNOWN_STALE.items():
        found = {f.split(": ", 1)[1] for f in stale(ROOT / name, known_settings)}
        assert refs <= found, f"{name} no longer names {refs - found}: remove it from KNOWN_STALE"


def test_the_checks_read_a_reasonable_share_of_the_tree():
    docs, code = documents(), sources()
    assert ROOT / "docs" / "design.md" in docs and ROOT / "docs" / "results" / "README.md" in docs
    assert ROOT / "hartonomous" / "engine.py" in code and ROOT / "sql" / "020_next_token.sql" in code
    named = sum(len(PATH.findall(p.read_text(errors="replace"))) for p in [*docs, *code])
    assert named > 200                # the pattern does find the paths the tree names


# -- what the checks catch and what they let through -----------------------------------------------------

@pytest.mark.parametrize("text", [
    "keys from hartonomous/lattice.py", "(sql/999_nothing.sql)", "see `benchmarks/nope.py`",
    "tests/test_nothing_here.py", "scripts/missing.sh", "`benchmarks/nothing_*.py`", "sql/{020_next_token,999_x}.sql",
    "docs/results/2026-01-01-nothing.json",
])
def test_a_missing_path_is_found(text):
    assert [ref for _, ref in missing_paths(ROOT / "hartonomous" / "x.py", text)]


@pytest.mark.parametrize("text", [
    "hartonomous/engine.py", "sql/070_memory.sql, and sql/*.sql", "`benchmarks/augmented.py`.",
    "scripts/install-kernel.sh", "tests/test_load.py:", "hartonomous/**/*.py", "sql/{020_next_token,070_memory}.sql",
    "docs/results/<date>-load.json", "../hartonomous/engine.py", "x/hartonomous/nothing.py",
    "https://example.com/sql/999_nothing.sql", "SQLAlchemy's sql/events.py",
])
def test_an_existing_path_or_pattern_passes(text):
    assert not list(missing_paths(ROOT / "hartonomous" / "x.py", text))


def test_a_document_names_paths_from_its_own_folder():
    doc = ROOT / "docs" / "results" / "README.md"
    assert not list(missing_paths(doc, "benchmarks/2026-11-22-spatial-path.md and README.md"))
    assert list(missing_paths(doc, "benchmarks/2026-01-01-nothing.md"))


@pytest.mark.parametrize("dotted, exists", [
    ("hartonomous.corpus.origin.recorded_training_text", True),
    ("hartonomous.corpus_origin.recorded_training_text", False),
    ("hartonomous.lattice", False),
    ("hartonomous.speculative.decoding.MAX_DRAFT_TOKENS", True),
    ("hartonomous.speculative.NOT_A_NAME", False),
    ("hartonomous.Client", True),                      # a name hartonomous/__init__.py holds
    ("hartonomous.augment", True),
    ("hartonomous.knn_routed", True),                  # a setting the SQL reads
    ("hartonomous.toml", True),                        # a file name
])
def test_a_dotted_module_resolves_or_is_found(known_settings, dotted, exists):
    assert module_exists(dotted, known_settings) is exists
    assert bool(list(missing_modules(f"see {dotted}.", known_settings))) is not exists


def test_a_broken_relative_link_is_found():
    doc = ROOT / "docs" / "design.md"
    text = "[sql](sql.md#the-native-kernel) [web](https://example.com/x.md) [gone](results/nothing.json)"
    assert [target for _, target in missing_links(doc, text)] == ["results/nothing.json"]


def test_known_stale_references_are_only_those_listed(monkeypatch):
    monkeypatch.setitem(KNOWN_STALE, "sql/020_next_token.sql", {"hartonomous/lattice.py"})
    found = ["sql/020_next_token.sql:43: hartonomous/lattice.py", "sql/020_next_token.sql:50: sql/nothing.sql",
             "docs/x.md:1: hartonomous/lattice.py"]
    assert without_known(found) == found[1:]
