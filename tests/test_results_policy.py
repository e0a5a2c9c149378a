"""docs/results/ keeps what its policy says (docs/results/README.md, "What is kept here, and how").

- Only result files and their notes: `.json`, `.json.gz`, `.md`, `.log`; never an HTML report, a
  figure or a run's working folder (those go to reports/, which git ignores).
- A JSON over PLAIN_LIMIT is stored gzip-compressed, unless a script reads it as it is: the
  README's results table (scripts/results_table.py) reads its sources plain, and they stay so.
- A compressed file is a JSON document, and every result the docs name exists under its name.
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import re
from pathlib import Path

import pytest

from test_docs_paths import expand

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
PLAIN_LIMIT = 512 * 1024
KEPT_SUFFIXES = (".json", ".json.gz", ".md", ".log")
DATED = re.compile(r"20\d\d-\d\d-\d\d-[\w{},<>*.-]*?\.(?:json\.gz|json|md|log)(?![\w-])")


def read_by_the_readme_table() -> set[str]:
    """The JSONs scripts/results_table.py reads (its row sources)."""
    return set(re.findall(r'"(20\d\d-\d\d-\d\d-[\w.-]+\.json)"', (ROOT / "scripts" / "results_table.py").read_text()))


def results() -> list[Path]:
    return sorted(p for p in RESULTS.iterdir() if p.is_file())


def test_only_results_and_their_notes_are_kept():
    others = [p.name for p in results() if not p.name.endswith(KEPT_SUFFIXES)]
    assert not others, f"not a result or its note (reports and figures go to reports/): {others}"
    assert not [p for p in RESULTS.iterdir() if p.is_dir()]


def test_a_large_json_is_compressed_unless_the_readme_table_reads_it():
    table = read_by_the_readme_table()
    large = [p.name for p in results() if p.suffix == ".json" and p.stat().st_size > PLAIN_LIMIT]
    assert large and set(large) <= table, f"compress with gzip -9n: {sorted(set(large) - table)}"


def test_the_readme_table_reads_plain_json_files():
    table = read_by_the_readme_table()
    assert len(table) >= 5
    assert all((RESULTS / name).is_file() for name in table), sorted(n for n in table if not (RESULTS / n).is_file())


@pytest.mark.parametrize("path", [p for p in results() if p.name.endswith(".json.gz")], ids=lambda p: p.name)
def test_a_compressed_result_is_a_json_document(path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        report = json.load(f)
    assert isinstance(report, dict) and report


def named_results(text: str) -> list[str]:
    return [name for m in DATED.finditer(text) for name in expand(m.group(0))]


def test_every_result_the_docs_name_exists():
    """README.md and docs/**/*.md name results by file name (patterns included): each names a file of
    docs/results/ or docs/benchmarks/ (a compressed one by its `.json.gz` name)."""
    kept = [p.name for folder in ("results", "benchmarks") for p in (ROOT / "docs" / folder).iterdir()]
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for name in named_results(doc.read_text()):
            if not fnmatch.filter(kept, name):
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
    assert not missing, "\n".join(["named but not in docs/results or docs/benchmarks:", *missing])


def test_names_and_patterns_are_read_from_the_text():
    text = ("`2026-11-26-compare-code-src-{1e5,1e6}-test.json.gz` and [x](2026-11-27-load.json), "
            "`2026-11-23-learned-*.json`, 2026-11-23-fidelity-build-ctx{20,100}.log.")
    assert named_results(text) == [
        "2026-11-26-compare-code-src-1e5-test.json.gz", "2026-11-26-compare-code-src-1e6-test.json.gz",
        "2026-11-27-load.json", "2026-11-23-learned-*.json", "2026-11-23-fidelity-build-ctx20.log",
        "2026-11-23-fidelity-build-ctx100.log"]
