"""Every relative link in the docs reaches a file, and every #anchor a heading of that file.

The docs link each other's sections (docs/benchmarks.md#..., fidelity.md#...); a renamed heading or
a moved section silently breaks them. Anchors follow GitHub's rule: the heading's text in lower
case, backticks and punctuation other than '-' and '_' dropped, spaces as '-', a repeated heading
suffixed -1, -2. No database.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().replace("`", "").lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in FENCE.sub("", markdown).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            found.add(s if n == 0 else f"{s}-{n}")
    return found


def broken_links(document: Path) -> list[str]:
    """'target: why' for each relative link of `document` that leads nowhere."""
    bad = []
    for target in LINK.findall(FENCE.sub("", document.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):          # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (document.parent / path).resolve() if path else document
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            bad.append(f"{target}: no heading with that anchor in {dest.name}")
    return bad


def test_every_relative_link_in_the_docs_leads_somewhere() -> None:
    broken = {str(d.relative_to(ROOT)): b for d in documents() if (b := broken_links(d))}
    assert broken == {}


def test_slugs_follow_githubs_rule() -> None:
    assert slug("Exact path vs transformers `generate` (per-token latency, CPU)") == \
        "exact-path-vs-transformers-generate-per-token-latency-cpu"
    assert slug("The native kernel: next_token next to the bare KNN") == \
        "the-native-kernel-next_token-next-to-the-bare-knn"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_a_link_to_a_missing_heading_is_reported(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n\n## Kept section\n", encoding="utf-8")
    doc = tmp_path / "a.md"
    doc.write_text("[ok](b.md#kept-section) [gone](b.md#moved-section) [none](c.md)\n"
                   "```\n[in code](nowhere.md)\n```\n", encoding="utf-8")
    bad = broken_links(doc)
    assert len(bad) == 2 and bad[0].startswith("b.md#moved-section") and bad[1].startswith("c.md")
