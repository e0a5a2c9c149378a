"""The playground page: index.html with a check box and a pane for each declared path.

The paths come from their declarations (hartonomous/paths/), never from a list in the page or its
script: a path's `shown` pane is ticked at start (the script unticks those the default atom set
cannot serve: GET /api/atom_sets's `paths`), the others stay hidden until ticked; a path's
legend, where it has one, is the page's `<template data-legend="NAME">`.
"""

from __future__ import annotations

import re
from functools import lru_cache
from html import escape
from pathlib import Path

from hartonomous.paths import DECLARATIONS, PathDeclaration

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
LEGEND = re.compile(r'<template data-legend="(?P<name>[\w-]+)">(?P<body>.*?)</template>\s*', re.S)


def _check(d: PathDeclaration) -> str:
    return (f'<label class="check" title="{escape(d.description)}"><input id="use-{d.name}" type="checkbox"'
            f'{" checked" if d.shown else ""}> {escape(d.name)}</label>')


def _pane(d: PathDeclaration, legend: str | None) -> str:
    hidden = "" if d.shown else " data-optional hidden"
    parts = [f'<article class="pane" id="pane-{d.name}" data-path="{d.name}" data-state="idle" data-tokens="0"'
             f'{hidden}>',
             f'  <h2>{escape(d.name.capitalize())} <small>{escape(d.label)}</small></h2>',
             '  <div class="stats"><span class="state">idle</span><span class="rate">– tokens/s</span>'
             '<span class="count">0 tokens</span></div>',
             '  <pre class="output"><span class="prompt-echo"></span><span class="generated"></span></pre>']
    if legend:
        parts.append(f'  <div class="legend">{legend.strip()}</div>')
    if d.token_fields:                   # a path with per-token fields has statistics to show too
        parts.append('  <div class="spec-stats"></div>')
    parts.append('</article>')
    return "\n".join(parts)


@lru_cache(maxsize=1)
def page() -> str:
    """The playground's HTML (rendered once per process)."""
    template = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    legends = {m["name"]: m["body"] for m in LEGEND.finditer(template)}
    template = LEGEND.sub("", template)
    checks = "\n".join(_check(d) for d in DECLARATIONS.values())
    panes = "\n".join(_pane(d, legends.get(d.name)) for d in DECLARATIONS.values())
    return template.replace("<!-- path checks -->", checks).replace("<!-- path panes -->", panes)
