"""The Python client: every path behind one small object.

    from hartonomous import Client
    with Client() as client:
        print(client.generate("The capital of France is", path="exact", seed=1).text)
        for piece in client.stream("Once upon a time", path="spatial", seed=1):
            print(piece, end="", flush=True)
        client.next_token("The capital of France is", top_k=5)   # rows with token texts

Models, tokenizers and the database connection are opened on first use and reused. Options
are GenerationConfig's (its defaults, its checks); `in_database=True` runs the spatial loop in
SQL `generate_tokens` (hartonomous.backends.in_database). `path="speculative"` drafts with the
spatial path and verifies with the exact model (hartonomous.speculative.decoding): the exact path's output,
with `result.stats` (a SpeculativeStats) saying how much drafting helped. `path="hybrid"` takes each
step from the spatial path when the atom set's predicted risk is below `risk_threshold`, else from
the exact model (hartonomous.backends.hybrid; `result.stats` is a HybridStats). The exact path's
per-step signals carry the spatial predictor's risk for the same context (read from the database).

A memory of past generations (hartonomous.speculative.memory; off by default): `remember=True` writes every
completed exact or speculative generation (only tokens the exact model chose: never the spatial or
hybrid path's) run under sampler settings the set's memory policy admits into the atom set's
memory, within the set's bound, and says on each result what the memory did with it
(`result.memory`), through an owner connection of its own (or pass a MemoryWriter to share one), and `memory=True` lets the
speculative path's drafter read that memory, so repeated or similar requests draft what the model
said before (the output is the exact path's either way; only the speed changes); the augmented
path's store reads it too (there it changes the output).
`spatial_memory=True` lets the spatial path's next_token read it too (its output then depends on
what was remembered; `compare --memory` uses it).
`path="augmented"` mixes the exact model with the atom set's own store at every step,
p = (1 - λ) p_exact + λ p_store, λ from the set's fitted gate (hartonomous.augment; the set must be
built with corpus labels and have a gate: `hartonomous gate fit SET`); `augment_weight` fixes λ
instead (experiments: 0 is the exact path bit for bit, 1 the store alone); `result.stats` is an
AugmentedStats (mean λ, how often the store's top token was picked). Its output holds the store's
guesses, so it is never remembered.
The augmented path refuses an atom set built from another model than the exact one (by the model
key the set recorded at build time, `build --model`, against `model`; a client handed a loaded
`exact_model` without `model` checks the vocabulary size only).
`speculative_target="augmented"` makes `path="speculative"` verify the spatial drafts against the
augmented distribution instead of the exact one (hartonomous.augment.backend.AugmentedBackend.score;
the same set checks as `path="augmented"`, chains only): the augmented path's output;
`result.stats.target` says which target ran, and it is never remembered.
`max_tree_width` > 1 lets speculative rounds draft trees (one `draft_tree` call, verified
in one forward with a 4D attention mask; hartonomous.speculative.decoding); off by default, since on a
2-core CPU they measured slower than chains (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from hartonomous.engine import Engine, GenerationResult, Session, check_prompt
from hartonomous.errors import InvalidArgument, UserError
from hartonomous.generation_config import GenerationConfig
from hartonomous.speculative.memory import MemoryWriter

PATHS = ("spatial", "exact", "speculative", "hybrid", "augmented")
SPECULATIVE_TARGETS = ("exact", "augmented")    # the distribution a speculative round verifies against
CONFIG_OPTIONS = tuple(f.name for f in fields(GenerationConfig))


@dataclass(frozen=True)
class TokenProbability:
    """One row of a next-token distribution."""

    token_id: int
    text: str
    probability: float
    cumulative_probability: float


class Client:
    """Generate with the spatial (PostGIS) or exact (transformer) path; see the module docstring."""

    def __init__(self, *, database_url: str | None = None, connection=None, atom_set: str | None = None,
                 search_radius: float | None = None, max_neighbors: int = 100, history_weight: float | None = None,
                 history_window: int | None = None, spatial_tokenizer=None,
                 model: str | None = None, device: str | None = None, dtype: str = "float32",
                 runtime: str | None = None, exact_model=None, draft_tokens: int = 4, max_draft_tokens: int = 8,
                 risk_threshold: float = 0.5,
                 memory: bool = False, remember: "bool | MemoryWriter" = False, max_tree_width: int = 1,
                 spatial_memory: bool = False, augment_weight: float | None = None,
                 speculative_target: str = "exact"):
        self.database_url, self._conn = database_url, connection
        self.atom_set, self.search_radius, self.max_neighbors = atom_set, search_radius, max_neighbors
        self.history_weight, self.history_window = history_weight, history_window
        self.spatial_tokenizer = spatial_tokenizer
        self.model, self.device, self.dtype, self.runtime = model, device, dtype, runtime
        self._exact_model = exact_model
        self._exact_model_given = exact_model is not None   # then `model` (if any) names it; nothing loads it
        self.draft_tokens, self.max_draft_tokens = draft_tokens, max_draft_tokens
        self.max_tree_width = max_tree_width     # > 1: speculative rounds may draft trees this wide
        from hartonomous.backends.hybrid import check_threshold

        self.risk_threshold = check_threshold(risk_threshold)
        self.augment_weight = check_augment_weight(augment_weight)   # None: the set's gate decides λ
        self.speculative_target = check_speculative_target(speculative_target)
        self.memory = bool(memory)                   # the speculative drafter reads the memory
        self.spatial_memory = bool(spatial_memory)   # the spatial path's next_token reads it too
        self._writer, self._owns_writer = None, False
        if isinstance(remember, MemoryWriter):
            self._writer = remember
        elif remember:
            self._writer, self._owns_writer = MemoryWriter(), True
        self._risk_backend = None
        self._engines: dict[tuple[str, bool], Engine] = {}

    # -- engines -------------------------------------------------------------------------

    def engine(self, path: str = "spatial", *, in_database: bool = False) -> Engine:
        """The engine of a path (built on first use); `in_database` only applies to the spatial path."""
        if path not in PATHS:
            raise InvalidArgument("path", f"path must be one of {', '.join(PATHS)}, got '{path}'")
        key = (path, in_database and path == "spatial")
        if key not in self._engines:
            if path == "spatial":
                backend = self._spatial_backend(key[1], memory=self.spatial_memory)
            elif path == "exact":
                backend = self._exact_backend()
            elif path == "hybrid":
                backend = self._hybrid_backend()
            elif path == "augmented":
                backend = self._augmented_backend()
            else:
                backend = self._speculative_backend()
            hooks = [hook for hook in (_settle_augmented if path == "augmented" else None,
                                       self._remembering(key)) if hook is not None]
            self._engines[key] = Engine(backend, on_result=_chain(hooks))
        return self._engines[key]

    def _remembering(self, key: tuple[str, bool]):
        """With a memory writer: the engine's on_result hook that offers each result to the atom
        set's memory and puts what it did on the result (`result.memory`: remembered, or not and
        why). Only completed generations of REMEMBERED_PATHS verified against the exact model are
        written (the spatial, hybrid and augmented paths' outputs hold the store's own guesses), and
        only under sampler settings the set's policy admits (remember() checks them in SQL)."""
        if self._writer is None:
            return None
        writer, path = self._writer, key[0]

        def remember(result) -> None:
            atom_set = self.atom_set if path == "exact" else self._engines[key].atom_set
            result.memory = writer.remember_result(atom_set, result)

        return remember

    def _speculative_backend(self):
        """The exact model (or, with speculative_target="augmented", the augmented path) verifying
        drafts of a spatial backend of its own (same atom set options), draft lengths shaped by the
        exact model's forward costs measured here (hartonomous/speculative/draft_cost.py)."""
        from hartonomous.config import get_settings
        from hartonomous.speculative.draft_cost import costs_cache_dir, forward_costs
        from hartonomous.speculative.decoding import SpeculativeBackend

        if self.speculative_target == "augmented":
            target = self._augmented_backend()
            exact = target.exact
        else:
            target = exact = self._exact_backend()
        # Measured once per runtime and CPU (~6 s for SmolLM2 on 2 cores), then read from the home's cache.
        costs = forward_costs(exact.model, costs_cache_dir(get_settings().home)) if exact.model.use_cache else None
        return SpeculativeBackend(target, self._spatial_beside(exact), draft_tokens=self.draft_tokens,
                                  max_draft_tokens=self.max_draft_tokens, costs=costs, memory=self.memory,
                                  max_tree_width=self.max_tree_width)

    def _hybrid_backend(self):
        """Spatial steps while the predicted risk is below `risk_threshold`, exact steps otherwise."""
        from hartonomous.backends.hybrid import HybridBackend

        exact = self._exact_backend()
        return HybridBackend(self._spatial_beside(exact), exact, self.risk_threshold)

    def _augmented_backend(self):
        """The exact model mixed with the atom set's store by the set's gate (hartonomous.augment).
        The set is checked before the model loads: corpus labels, a gate, the model it was built
        from; then the vocabulary."""
        from hartonomous.atomset import load_atom_set
        from hartonomous.augment.backend import AugmentedBackend, check_compatible
        from hartonomous.augment.gates import check_corpus_labels, load_gate

        conn = self._connection()
        info = load_atom_set(conn, self.atom_set)
        check_corpus_labels(info)
        gate = load_gate(conn, info.name)
        check_same_model(info, self._exact_model_key())
        exact = self._exact_backend()
        check_compatible(info, exact.model)
        return AugmentedBackend(exact, conn, info, gate, max_neighbors=self.max_neighbors,
                                history_weight=self.history_weight, history_window=self.history_window,
                                memory=self.memory, weight=self.augment_weight)

    def _spatial_beside(self, exact):
        """A spatial backend of its own that shares the exact model's tokenizer (ids must agree)."""
        spatial_tokenizer = self.spatial_tokenizer
        self.spatial_tokenizer = self.spatial_tokenizer or exact.tokenizer
        try:
            return self._spatial_backend(False)
        finally:
            self.spatial_tokenizer = spatial_tokenizer

    def _spatial_signals(self, ids: list[int]):
        """The spatial path's signals for a context (the exact path's risk source; connects on first use)."""
        from hartonomous.backends.spatial import SpatialState

        if self._risk_backend is None:
            self._risk_backend = self._spatial_beside(self._exact_backend())
        return self._risk_backend.signals(SpatialState(list(ids)))

    def _connection(self):
        if self._conn is None:
            from hartonomous.db.connection import reader_url
            from hartonomous.db.retry import ReconnectingConnection

            # Reconnects (bounded) if the database restarts mid-generation; see hartonomous/db/retry.py.
            self._conn = ReconnectingConnection(self.database_url or reader_url())
            self._owns_conn = True
        return self._conn

    def _spatial_backend(self, in_database: bool, memory: bool = False):
        """The spatial path's backend; `memory`: its next_token reads the set's memory too (the
        in-database loop, generate_tokens, reads the stored atoms only)."""
        from hartonomous.backends.in_database import InDatabaseBackend
        from hartonomous.backends.spatial import SpatialBackend

        if in_database and memory:
            raise InvalidArgument("spatial_memory", "the in-database loop (generate_tokens) does not read the "
                                                    "memory; drop in_database, or spatial_memory")

        tokenizer = self.spatial_tokenizer
        for (path, _), engine in self._engines.items():   # reuse the tokenizer of the other spatial mode
            if path == "spatial":
                tokenizer = tokenizer or engine.tokenizer
        options = dict(tokenizer=tokenizer, search_radius=self.search_radius, max_neighbors=self.max_neighbors,
                       history_weight=self.history_weight, history_window=self.history_window)
        if in_database:
            return InDatabaseBackend(self._connection(), self.atom_set, **options)
        return SpatialBackend(self._connection(), self.atom_set, memory=memory, **options)

    @property
    def exact_runtime(self) -> str | None:
        """The runtime of the exact model this client loaded (torch, int4, llama); None before it loads one."""
        return getattr(self._exact_model, "runtime", None) if self._exact_model is not None else None

    def _exact_model_key(self) -> str | None:
        """The exact model as a load name ('smollm2' or a folder): the one this client loads, or the
        `model` named beside a handed-in `exact_model`; None where a loaded model came unnamed."""
        if self._exact_model_given:
            return self.model
        from hartonomous.config import get_settings

        return self.model or get_settings().model

    def _exact_backend(self):
        from hartonomous.backends.exact import ExactBackend
        from hartonomous.config import get_settings
        from hartonomous.runtimes import load_exact_model

        if self._exact_model is None:
            settings = get_settings()
            self._exact_model = load_exact_model(self.runtime or settings.runtime, self.model or settings.model,
                                                 self.device or settings.device, self.dtype)
        return ExactBackend(self._exact_model, risk_source=self._spatial_signals)

    # -- generation ----------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], path: str = "spatial", *, in_database: bool = False,
                 cancel: threading.Event | None = None, **options: Any) -> GenerationResult:
        """Blocking generation; options are GenerationConfig fields (max_new_tokens, seed, top_k, ...)."""
        config = make_config(**options)                  # validate before connecting or loading a model
        return self.engine(path, in_database=in_database).generate(prompt, config, cancel)

    def stream(self, prompt: str | Sequence[int], path: str = "spatial", *, in_database: bool = False,
               cancel: threading.Event | None = None, **options: Any) -> Session:
        """Iterate for text pieces as they are made; `.cancel()` stops it, `.result` holds the outcome."""
        config = make_config(**options)
        return self.engine(path, in_database=in_database).stream(prompt, config, cancel)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], path: str = "spatial", *,
                       in_database: bool = False, cancel: threading.Event | None = None,
                       **options: Any) -> list[GenerationResult]:
        config = make_config(**options)
        return self.engine(path, in_database=in_database).generate_batch(prompts, config, cancel)

    def next_token(self, prompt_or_ids: str | Sequence[int], path: str = "spatial", *,
                   temperature: float = GenerationConfig.temperature, top_k: int | None = GenerationConfig.top_k,
                   top_p: float = GenerationConfig.top_p,
                   repetition_penalty: float = GenerationConfig.repetition_penalty) -> list[TokenProbability]:
        """The next-token distribution after the sampler, most likely first, with token texts."""
        from hartonomous.textstream import decode

        config = make_config(temperature=temperature, top_k=top_k, top_p=top_p,
                             repetition_penalty=repetition_penalty)      # validate before connecting
        check_prompt(prompt_or_ids)
        if path == "speculative":
            raise InvalidArgument("path", "next_token has no speculative path: its distribution is the exact "
                                          "path's; use path='exact'")
        if path == "hybrid":
            raise InvalidArgument("path", "next_token has no hybrid path: each step comes from one of the two "
                                          "paths; use path='spatial' or path='exact'")
        engine = self.engine(path)
        dist = engine.distribution(prompt_or_ids, config)
        rows, total = [], 0.0
        for token_id, p in zip(dist.token_ids, dist.probabilities):
            total += p
            rows.append(TokenProbability(token_id, decode(engine.tokenizer, [token_id]), p, total))
        return rows

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
        if self._risk_backend is not None:
            self._risk_backend.close()
            self._risk_backend = None
        if self._owns_writer and self._writer is not None:
            self._writer.close()
            self._writer = None
        if getattr(self, "_owns_conn", False) and self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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


def _settle_augmented(result) -> None:
    """The augmented result's statistics count the last pick too (the engine never feeds it back)."""
    if result.stats is not None:
        result.stats.settle(result.token_ids)


def check_speculative_target(target: str) -> str:
    """What `path="speculative"` verifies drafts against: the exact model or the augmented path."""
    if not isinstance(target, str) or target not in SPECULATIVE_TARGETS:
        raise InvalidArgument("speculative_target", f"speculative_target must be one of "
                                                    f"{', '.join(SPECULATIVE_TARGETS)}, got {target!r}")
    return target


def _model_identity(key: str) -> str:
    """A model key as one spelling: a folder by its resolved path, 'smollm2' (or anything else) as is."""
    from hartonomous.model import SMOLLM2

    path = Path(key).expanduser()
    return str(path.resolve()) if key != SMOLLM2 and path.is_dir() else key


def check_same_model(atom_set, model_key: str | None) -> None:
    """The set's store predicts the tokens of the model it was built from: refuse another exact
    model, even one with the same vocabulary (a set without a recorded model key, or an unnamed
    loaded model, is left to the vocabulary check)."""
    built = atom_set.model_key
    if not built or not model_key or _model_identity(built) == _model_identity(model_key):
        return
    raise UserError(f"atom set '{atom_set.name}' was built from model '{built}' but the exact model is "
                    f"'{model_key}'; the augmented path mixes the two, so use --model {built} "
                    f"(Client(model=...)) or an atom set built from '{model_key}' (build --model {model_key})")


def check_augment_weight(weight: float | None) -> float | None:
    """λ for the augmented path, fixed for experiments: None (the gate decides) or a number in [0, 1]."""
    if weight is None:
        return None
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) \
            or not 0.0 <= weight <= 1.0:
        raise InvalidArgument("augment_weight", f"augment_weight (λ) must be a number in [0, 1] or None (the "
                                                f"set's gate decides), got {weight!r}")
    return float(weight)


def make_config(**options: Any) -> GenerationConfig:
    """GenerationConfig from keyword options, with a clear error for unknown ones."""
    unknown = sorted(set(options) - set(CONFIG_OPTIONS))
    if unknown:
        raise UserError(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(CONFIG_OPTIONS)}")
    return GenerationConfig(**options)
