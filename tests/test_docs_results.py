"""The load test's figures in docs/reliability.md are the committed JSON's, at the precision shown.

docs/reliability.md quotes one run of tests/test_load.py; the JSON that run wrote is committed under
docs/results/ and linked from the section. Every number the section and the summary table show
must be that JSON's, rounded as printed, so a new run cannot be half-copied into the docs. No
database.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RELIABILITY = ROOT / "docs" / "reliability.md"
KIND_ROWS = {"`next_token`": "next_token", "`generate`": "generate", "`generate` in database": "generate_in_database",
             "`generate` speculative, memory on": "generate_speculative"}


def shown(value: float, text: str) -> bool:
    """Whether `text` (as the docs print it: "24.3", "1,465", "1070") is `value` at that precision."""
    text = text.replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return f"{value:.{decimals}f}" == text


def load_section(markdown: str) -> str:
    start = markdown.index("## Load: `tests/test_load.py`")
    end = markdown.index("\n## ", start + 1)
    return markdown[start:end]


def quoted_json(section: str) -> dict:
    names = set(re.findall(r"\(results/(\d{4}-\d{2}-\d{2}-load(?:-[a-z]+)?\.json)\)", section))
    assert len(names) == 1, f"the load section must link exactly one docs/results/<date>-load.json, found {names}"
    return json.loads((ROOT / "docs" / "results" / names.pop()).read_text())


def check_load_figures(markdown: str) -> list[str]:
    """Mismatches between the load figures in `markdown` (docs/reliability.md) and the JSON it links."""
    section = load_section(markdown)
    report = quoted_json(section)
    wrong: list[str] = []

    def expect(value: float, text: str, what: str) -> None:
        if not shown(value, text):
            wrong.append(f"{what}: the docs say {text}, the JSON {value}")

    rows = {cells[0]: cells[1:] for cells in
            ([c.strip() for c in line.strip().strip("|").split("|")] for line in section.splitlines()
             if line.startswith("| ") and not line.startswith("| |"))}
    for label, kind in KIND_ROWS.items():
        assert label in rows, f"no row {label} in the load table"
        requests, p50, p99 = rows[label]
        stats = report["by_kind"][kind]
        expect(stats["requests"], requests, f"{kind} requests")
        expect(stats["p50_ms"], p50.removesuffix(" ms"), f"{kind} p50")
        expect(stats["p99_ms"], p99.removesuffix(" ms"), f"{kind} p99")
    total, p50, p99 = rows["**all**"]
    m = re.fullmatch(r"\*\*([\d,]+) in ([\d.]+) s = ([\d.]+) requests/s, ([\d.]+) generated tokens/s, "
                     r"(\d+) errors\*\*", total)
    assert m, f"the 'all' row does not read as expected: {total}"
    for value, text, what in zip((report["requests"], report["seconds"], report["requests_per_second"],
                                  report["tokens_per_second"], report["errors"]), m.groups(),
                                 ("requests", "seconds", "requests/s", "tokens/s", "errors")):
        expect(value, text, what)
    expect(report["p50_ms"], p50.removesuffix(" ms"), "p50")
    expect(report["p99_ms"], p99.removesuffix(" ms"), "p99")

    memory = report["memory"]
    m = re.search(r"Memory: ([\d,]+) generations remembered .*?\*\*(\d+) failed writes\*\*, and (\d+) atoms\s+"
                  r"\((\d+) generations of 8\) held at the end: within the (\d+)-atom bound", section, re.S)
    assert m, "the memory sentence of the load section does not read as expected"
    for key, text in zip(("remembered", "failed", "atoms_after_run", "generations_after_run", "max_atoms"), m.groups()):
        expect(memory[key], text, f"memory {key}")

    m = re.search(r"load average rose from ([\d.]+) before the run to ([\d.]+) after it", section)
    assert m, "the load section must give the machine's load average before and after the run"
    expect(report["machine"]["load_average_before"][0], m.group(1), "load average before")
    expect(report["machine"]["load_average"][0], m.group(2), "load average after")

    summary = next(line for line in markdown.splitlines() if line.startswith("| load |"))
    m = re.search(r"load average ([\d.]+) → ([\d.]+) on (\d+) cores\): ([\d,]+) requests, \*\*(\d+) errors\*\*, "
                  r"([\d.]+) requests/s, p50 (\d+) ms, p99 (\d+) ms; ≤ (\d+) connections, (\d+) left; "
                  r"([\d,]+) generations remembered, (\d+) failed, memory (\d+) ≤ (\d+) atoms", summary)
    assert m, f"the summary table's load row does not read as expected: {summary}"
    values = (report["machine"]["load_average_before"][0], report["machine"]["load_average"][0],
              report["machine"]["cores"], report["requests"], report["errors"], report["requests_per_second"],
              report["p50_ms"], report["p99_ms"], report["connections"]["server_peak"],
              report["connections"]["server_after_stop"], memory["remembered"], memory["failed"],
              memory["atoms_after_run"], memory["max_atoms"])
    for i, (value, text) in enumerate(zip(values, m.groups())):
        expect(value, text, f"summary row, figure {i + 1}")
    return wrong


def test_the_load_figures_in_reliability_md_are_the_committed_json() -> None:
    assert check_load_figures(RELIABILITY.read_text(encoding="utf-8")) == []


def test_a_figure_that_differs_from_the_json_is_reported() -> None:
    markdown = RELIABILITY.read_text(encoding="utf-8")
    section = load_section(markdown)
    row = next(line for line in section.splitlines() if line.startswith("| `next_token` |"))
    requests = row.split("|")[2].strip()
    tampered = markdown.replace(row, row.replace(f"| {requests} |", f"| {int(requests) + 1} |", 1))
    assert any("next_token requests" in w for w in check_load_figures(tampered))


def test_shown_rounds_as_the_docs_print() -> None:
    assert shown(1069.5019, "1070") and shown(24.2747, "24.3") and shown(1465, "1,465")
    assert not shown(24.2747, "24.2") and not shown(519.63, "519")


@pytest.mark.parametrize("bad", ["", "(results/2026-11-27-load.json) (results/2026-11-26-load.json)"])
def test_the_section_must_link_exactly_one_json(bad: str) -> None:
    with pytest.raises(AssertionError, match="exactly one"):
        quoted_json(bad)
