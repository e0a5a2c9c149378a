"""What the paths are built from, and how a path becomes an engine.

PathResources holds one caller's shared resources (the database connection, the exact model, the
spatial tokenizer, the memory flags, what drafting learned) and the paths' options; a path's factory
(PathDeclaration.build) asks it for the backends it combines. The Client keeps one for its
lifetime and caches the engines; the server makes one per request over a pooled connection and
its shared model, and builds the request's engine with `build_engine`, without a Client.
"""

from __future__ import annotations

from typing import Any

from hartonomous.errors import InvalidArgument
from hartonomous.paths import DECLARATIONS, check_speculative_target, declaration
from hartonomous.paths.options import PathOptions


class PathResources:
    """Opened on first use: a connection (unless one is handed in), the exact model (unless one is
    handed in), the spatial backends; `close()` closes what it opened."""

    def __init__(self, *, options: PathOptions | None = None, database_url: str | None = None, connection=None,
                 atom_set: str | None = None, spatial_tokenizer=None, model: str | None = None,
                 device: str | None = None, dtype: str = "float32", runtime: str | None = None, exact_model=None,
                 memory: bool = False, spatial_memory: bool = False, draft_learning=None):
        self.options = options or PathOptions()
        check_speculative_target(self.options.speculative_target)
        self.database_url, self._conn, self._owns_conn = database_url, connection, False
        self.atom_set = atom_set
        self.spatial_tokenizer = spatial_tokenizer
        self._learned_tokenizer = None          # the first spatial backend's, reused by the other spatial mode
        self.model, self.device, self.dtype, self.runtime = model, device, dtype, runtime
        self.exact_model = exact_model
        self._exact_model_given = exact_model is not None   # then `model` (if any) names it; nothing loads it
        self.memory = bool(memory)                   # the speculative drafter and the augmented store read it
        self.spatial_memory = bool(spatial_memory)   # the spatial path's next_token reads it too
        self._risk_backend = None
        # What speculative runs learned, carried to the next runs of their kind (a server hands in
        # its own, shared by its requests; else this caller's: hartonomous/speculative/learned.py).
        if draft_learning is None:
            from hartonomous.speculative.learned import DraftLearning

            draft_learning = DraftLearning()
        self.draft_learning = draft_learning

    def connection(self):
        if self._conn is None:
            from hartonomous.db.connection import reader_url
            from hartonomous.db.retry import ReconnectingConnection

            # Reconnects (bounded) if the database restarts mid-generation; see hartonomous/db/retry.py.
            self._conn = ReconnectingConnection(self.database_url or reader_url())
            self._owns_conn = True
        return self._conn

    def spatial_backend(self, in_database: bool, memory: bool = False, tokenizer=None):
        """A spatial backend; `memory`: its next_token reads the set's memory too (the in-database
        loop, generate_tokens, reads the stored atoms only); `tokenizer`: another path's (ids must agree)."""
        from hartonomous.backends.in_database import InDatabaseBackend
        from hartonomous.backends.spatial import SpatialBackend

        if in_database and memory:
            raise InvalidArgument("spatial_memory", "the in-database loop (generate_tokens) does not read the "
                                                    "memory; drop in_database, or spatial_memory")
        own = tokenizer is None
        tokenizer = tokenizer or self.spatial_tokenizer or self._learned_tokenizer
        o = self.options
        options = dict(tokenizer=tokenizer, search_radius=o.search_radius, max_neighbors=o.max_neighbors,
                       history_weight=o.history_weight, history_window=o.history_window)
        if in_database:
            backend = InDatabaseBackend(self.connection(), self.atom_set, **options)
        else:
            backend = SpatialBackend(self.connection(), self.atom_set, memory=memory, **options)
        if own:
            self._learned_tokenizer = self._learned_tokenizer or backend.tokenizer
        return backend

    def spatial_beside(self, exact):
        """A spatial backend of its own that shares the exact model's tokenizer (ids must agree)."""
        return self.spatial_backend(False, tokenizer=self.spatial_tokenizer or exact.tokenizer)

    def backend(self, path: str):
        """Another path's backend over these resources (a speculative round's target)."""
        return declaration(path).build(self, False)

    def _spatial_signals(self, ids: list[int]):
        """The spatial path's signals for a context (the exact path's risk source; connects on first use)."""
        from hartonomous.backends.spatial import SpatialState

        if self._risk_backend is None:
            self._risk_backend = self.spatial_beside(self.exact_backend())
        return self._risk_backend.signals(SpatialState(list(ids)))

    def exact_model_key(self) -> str | None:
        """The exact model as a load name ('smollm2' or a folder): the one loaded here, or the
        `model` named beside a handed-in `exact_model`; None where a loaded model came unnamed."""
        if self._exact_model_given:
            return self.model
        from hartonomous.config import get_settings

        return self.model or get_settings().model

    def exact_backend(self):
        from hartonomous.backends.exact import ExactBackend
        from hartonomous.config import get_settings
        from hartonomous.runtimes import load_exact_model

        if self.exact_model is None:
            settings = get_settings()
            self.exact_model = load_exact_model(self.runtime or settings.runtime, self.model or settings.model,
                                                self.device or settings.device, self.dtype)
        return ExactBackend(self.exact_model, risk_source=self._spatial_signals)

    def close(self) -> None:
        if self._risk_backend is not None:
            self._risk_backend.close()
            self._risk_backend = None
        if self._owns_conn and self._conn is not None:
            self._conn.close()
            self._conn = None


def build_engine(path: str, resources: PathResources, *, in_database: bool = False, writer: Any = None):
    """The engine of `path` over `resources`, built by its declaration; with a MemoryWriter, each
    result is offered to the atom set's memory and says what the memory did (`result.memory`:
    remembered, or not and why). Only completed generations of remembered paths verified against
    the exact model are written, and only under sampler settings the set's policy admits
    (remember() checks them in SQL)."""
    from hartonomous.engine import Engine

    declared = declaration(path)
    backend = declared.build(resources, in_database and path == "spatial")
    hooks = [declared.settle] if declared.settle is not None else []
    engine: Engine | None = None
    if writer is not None:
        def remember(result) -> None:
            atom_set = engine.atom_set if declared.needs_atom_set else resources.atom_set
            result.memory = writer.remember_result(atom_set, result)

        hooks.append(remember)
    engine = Engine(backend, on_result=_chain(hooks))
    return engine


def _chain(hooks: list):
    """One on_result hook running `hooks` in order (None for none)."""
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    def run(result) -> None:
        for hook in hooks:
            hook(result)

    return run


def as_dicts() -> list[dict]:
    """The declarations as JSON-ready dicts (GET /api/paths), with their options' defaults."""
    return [{"name": d.name, "description": d.description, "label": d.label, "shown": d.shown,
             "needs": sorted(d.needs), "remembered": d.remembered, "next_token": d.next_token,
             "speculative_target": d.speculative_target, "options": list(d.options),
             "defaults": {name: getattr(PathOptions, name) for name in d.options},
             "token_fields": list(d.token_fields)} for d in DECLARATIONS.values()]
