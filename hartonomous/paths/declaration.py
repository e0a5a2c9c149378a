"""What a path declaration holds, and what its factory may ask of the object that builds it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


# What a path needs (PathDeclaration.needs).
EXACT_MODEL = "exact model"          # the transformer (any runtime)
ATOM_SET = "atom set"                # a built atom set in the database
CORPUS_LABELS = "corpus labels"      # the set was built with corpus labels (build --corpus-labels)
GATE = "gate"                        # a fitted gate (hartonomous gate fit SET)
RISK_PREDICTOR = "risk predictor"    # the set's risk predictor (built with the set)
NEEDS = (EXACT_MODEL, ATOM_SET, CORPUS_LABELS, GATE, RISK_PREDICTOR)


class PathContext(Protocol):
    """What a path's factory builds from (hartonomous.paths.context.PathResources): the shared
    resources, opened on first use, and the paths' options."""

    options: Any               # a PathOptions (hartonomous.paths.options)
    atom_set: str | None
    memory: bool               # the speculative drafter and the augmented store read the set's memory
    spatial_memory: bool       # the spatial path's next_token reads it too
    draft_learning: Any        # what speculative runs learned, carried across runs (speculative/learned.py)

    def connection(self) -> Any: ...
    def exact_backend(self) -> Any: ...
    def exact_model_key(self) -> str | None: ...
    def spatial_backend(self, in_database: bool, memory: bool = False, tokenizer: Any = None) -> Any: ...
    def spatial_beside(self, exact: Any) -> Any: ...
    def backend(self, path: str) -> Any: ...       # another path's backend (what speculative verifies with)


@dataclass(frozen=True)
class PathDeclaration:
    """One path, declared once; everything that lists paths reads these."""

    name: str
    description: str                           # one line: what the path does
    label: str                                 # a few words: the playground pane's subtitle
    build: Callable[[PathContext, bool], Any]  # (context, in_database) -> backend
    needs: frozenset[str]                      # of NEEDS
    shown: bool = False                        # the playground shows its pane until unticked
    remembered: bool = False                   # its words are the exact model's: the memory may keep them
    next_token: bool = False                   # it has a next-token distribution of its own to show
    next_token_instead: str = ""               # without one: why not, and which path to ask instead
    speculative_target: bool = False           # a speculative round can verify drafts against it
    options: tuple[str, ...] = ()              # the PathOptions fields it reads (tests check the names)
    token_fields: tuple[str, ...] = ()         # extra per-token fields of its detailed events
    settle: Callable[[Any], None] | None = None   # runs on each result before anything else sees it

    def __post_init__(self) -> None:
        unknown = set(self.needs) - set(NEEDS)
        if unknown:
            raise ValueError(f"path {self.name}: unknown needs {sorted(unknown)}; known: {', '.join(NEEDS)}")

    @property
    def uses_model(self) -> bool:
        """Whether it runs the exact model (the server runs it on the model's workers)."""
        return EXACT_MODEL in self.needs

    @property
    def needs_atom_set(self) -> bool:
        """Whether it reads an atom set (its engine then names the set it ran on)."""
        return ATOM_SET in self.needs
