"""Where a generated token came from: the files and lines of an indexed set, or its memory.

`Citer` asks the database (store_sources, sql/100_sources.sql) for the tokens the store picked:
the file occurrences of the longest stored suffix of the context followed by the token (path,
line, license) and the memory entries at the context's key (the generation they were remembered
in). `verbatim` (store_verbatim) finds the runs of 20 or more generated tokens stored verbatim in
one file, with that file's license: the check a team runs before accepting generated code.

Which tokens are cited (`store_picked`): those where the store's top pick was chosen, per path:
spatial and in-database, every token the store ranked first (in-database: every token, the loop
ran in SQL); hybrid, the steps the spatial path answered; augmented, the steps whose token was the
store's most probable; speculative, the drafts the exact model kept. The exact path reads no store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hartonomous.errors import InvalidArgument

CITE_K = 3                 # sources listed per token
VERBATIM_TOKENS = 20       # the shortest run flagged as stored verbatim
MAX_CONTEXT = 256          # store_sources reads the last 256 tokens of context || token
SOURCES = ("SELECT kind, path, line, license, license_source, match_tokens, generation, step "
           "FROM store_sources(%s, %s, %s, %s, true)")
VERBATIM = ("SELECT start_index, length, path, line, license, license_source "
            "FROM store_verbatim(%s, %s, %s, 1)")


@dataclass(frozen=True)
class Citation:
    """One source of a token: a file line (kind 'file') or a remembered generation (kind 'memory')."""

    kind: str
    path: str | None = None
    line: int | None = None
    license: str | None = None          # SPDX id; None when unknown
    license_source: str | None = None   # spdx-header | license-file | package-metadata | unknown
    match_tokens: int | None = None     # context tokens matched before the token
    generation: int | None = None       # memory: the generation it was remembered in
    step: int | None = None

    @property
    def label(self) -> str:
        """file:line, or memory:generation/step."""
        if self.kind == "memory":
            return f"memory:{self.generation}/{self.step}"
        return f"{self.path}:{self.line}"

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class VerbatimRun:
    """A run of generated tokens stored verbatim in one file."""

    start: int             # 0-based index into the generated tokens
    length: int
    path: str
    line: int
    license: str | None
    license_source: str

    @property
    def message(self) -> str:
        license = self.license or "license unknown"
        return (f"tokens {self.start + 1}-{self.start + self.length} ({self.length}) match {self.path}:{self.line} "
                f"verbatim ({license})")

    def as_dict(self) -> dict:
        return asdict(self)


class Citer:
    """store_sources and store_verbatim for one atom set over a connection the caller owns."""

    def __init__(self, conn: Any, atom_set: str, k: int = CITE_K):
        self.conn, self.atom_set, self.k = conn, atom_set, k

    def cite(self, context: Sequence[int], token: int) -> tuple[Citation, ...]:
        """The sources of `token` after `context` (files first, then the memory)."""
        rows = self.conn.execute(SOURCES, ([int(t) for t in context[-MAX_CONTEXT:]], self.atom_set, self.k,
                                           int(token)), prepare=True).fetchall()
        return tuple(Citation(*row) for row in rows)

    def verbatim(self, tokens: Sequence[int], min_tokens: int = VERBATIM_TOKENS) -> list[VerbatimRun]:
        """The runs of at least `min_tokens` of `tokens` stored verbatim in one file."""
        if len(tokens) < min_tokens:
            return []
        rows = self.conn.execute(VERBATIM, ([int(t) for t in tokens], self.atom_set, min_tokens)).fetchall()
        return [VerbatimRun(*row) for row in rows]


def store_connection(backend: Any) -> Any | None:
    """The database connection of a path that reads an atom set; None for the exact path."""
    for owner in (backend, getattr(backend, "spatial", None)):
        conn = getattr(owner, "conn", None)
        if conn is not None and getattr(owner, "atom_set_name", None):
            return conn
    return None


def citer_for(backend: Any, k: int = CITE_K) -> Citer:
    """A Citer over the backend's own store connection; InvalidArgument('cite') where there is none."""
    conn = store_connection(backend)
    if conn is None:
        raise InvalidArgument("cite", f"cite needs a path that reads an atom set; the {backend.name} path reads "
                                      "none: use spatial, hybrid, augmented or speculative")
    return Citer(conn, backend.atom_set_name, k)


def store_picked(backend_name: str, event: Any) -> bool:
    """Whether the event's token is one the store picked (see the module docstring)."""
    if backend_name == "augmented":
        return bool(event.store_top)
    if backend_name == "speculative":
        return event.origin == "draft"
    if backend_name == "hybrid" and event.route != "spatial":
        return False
    dist = event.distribution
    return dist is None or (len(dist) > 0 and dist.token_ids[0] == event.token_id)


def cited_events(events: Sequence[Any]) -> list[Any]:
    """The events that carry citations (config.cite, a token the store picked)."""
    return [e for e in events if e.citations]


def report_lines(events: Sequence[Any], runs: Sequence[VerbatimRun], tokenizer: Any) -> list[str]:
    """What `generate --cite` prints after the output: each cited token with its file:line sources
    (and license), then each run of tokens stored verbatim, flagged."""
    cited = cited_events(events)
    lines = [f"[cite] {len(cited)} of {len(events)} tokens picked by the store have sources"]
    for event in cited:
        sources = ", ".join(c.label + (f" ({c.license})" if c.license else "") for c in event.citations)
        lines.append(f"  {event.step + 1:>4} {tokenizer.decode([event.token_id])!r}: {sources}")
    for run in runs:
        lines.append(f"[cite] VERBATIM: {run.message}")
    return lines
