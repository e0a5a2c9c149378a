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

A memory of past generations (hartonomous.memory; off by default): `remember=True` writes every
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

import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from hartonomous.engine import Engine, GenerationResult, Session, check_prompt
from hartonomous.errors import InvalidArgument, UserError
from hartonomous.generation_config import GenerationConfig
from hartonomous.paths import (DEFAULT_PATH, PATHS, check_speculative_target, declaration,  # noqa: F401
                               next_token_paths, speculative_targets)
from hartonomous.paths.context import PathResources, build_engine
from hartonomous.paths.augmented import check_same_model  # noqa: F401  (its home; imported from here too)
from hartonomous.paths.options import PathOptions, check_augment_weight  # noqa: F401
from hartonomous.memory import MemoryWriter

SPECULATIVE_TARGETS = speculative_targets()    # the distributions a speculative round verifies against
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
                 search_radius: float | None = PathOptions.search_radius,
                 max_neighbors: int = PathOptions.max_neighbors,
                 history_weight: float | None = PathOptions.history_weight,
                 history_window: int | None = PathOptions.history_window, spatial_tokenizer=None,
                 model: str | None = None, device: str | None = None, dtype: str = "float32",
                 runtime: str | None = None, exact_model=None, draft_tokens: int = PathOptions.draft_tokens,
                 max_draft_tokens: int = PathOptions.max_draft_tokens,
                 risk_threshold: float = PathOptions.risk_threshold,
                 memory: bool = False, remember: "bool | MemoryWriter" = False,
                 max_tree_width: int = PathOptions.max_tree_width,
                 spatial_memory: bool = False, augment_weight: float | None = PathOptions.augment_weight,
                 speculative_target: str = PathOptions.speculative_target):
        # The paths' options, checked here (InvalidArgument naming the option); the paths read them.
        options = PathOptions(search_radius=search_radius, max_neighbors=max_neighbors,
                              history_weight=history_weight, history_window=history_window,
                              draft_tokens=draft_tokens, max_draft_tokens=max_draft_tokens,
                              max_tree_width=max_tree_width, speculative_target=speculative_target,
                              risk_threshold=risk_threshold, augment_weight=augment_weight)
        self.resources = PathResources(options=options, database_url=database_url, connection=connection,
                                       atom_set=atom_set, spatial_tokenizer=spatial_tokenizer, model=model,
                                       device=device, dtype=dtype, runtime=runtime, exact_model=exact_model,
                                       memory=memory, spatial_memory=spatial_memory)
        self._writer, self._owns_writer = None, False
        if isinstance(remember, MemoryWriter):
            self._writer = remember
        elif remember:
            self._writer, self._owns_writer = MemoryWriter(), True
        self._engines: dict[tuple[str, bool], Engine] = {}

    @property
    def options(self) -> PathOptions:
        return self.resources.options

    # -- engines -------------------------------------------------------------------------

    def engine(self, path: str = DEFAULT_PATH, *, in_database: bool = False) -> Engine:
        """The engine of a path (built on first use from its declaration, hartonomous.paths);
        `in_database` only applies to the spatial path."""
        declaration(path)
        key = (path, in_database and path == "spatial")
        if key not in self._engines:
            self._engines[key] = build_engine(path, self.resources, in_database=key[1], writer=self._writer)
        return self._engines[key]

    @property
    def exact_runtime(self) -> str | None:
        """The runtime of the exact model this client loaded (torch, int4, llama); None before it loads one."""
        model = self.resources.exact_model
        return getattr(model, "runtime", None) if model is not None else None

    # -- generation ----------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], path: str = DEFAULT_PATH, *, in_database: bool = False,
                 cancel: threading.Event | None = None, **options: Any) -> GenerationResult:
        """Blocking generation; options are GenerationConfig fields (max_new_tokens, seed, top_k, ...)."""
        config = make_config(**options)                  # validate before connecting or loading a model
        return self.engine(path, in_database=in_database).generate(prompt, config, cancel)

    def stream(self, prompt: str | Sequence[int], path: str = DEFAULT_PATH, *, in_database: bool = False,
               cancel: threading.Event | None = None, **options: Any) -> Session:
        """Iterate for text pieces as they are made; `.cancel()` stops it, `.result` holds the outcome."""
        config = make_config(**options)
        return self.engine(path, in_database=in_database).stream(prompt, config, cancel)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], path: str = DEFAULT_PATH, *,
                       in_database: bool = False, cancel: threading.Event | None = None,
                       **options: Any) -> list[GenerationResult]:
        config = make_config(**options)
        return self.engine(path, in_database=in_database).generate_batch(prompts, config, cancel)

    def next_token(self, prompt_or_ids: str | Sequence[int], path: str = DEFAULT_PATH, *,
                   temperature: float = GenerationConfig.temperature, top_k: int | None = GenerationConfig.top_k,
                   top_p: float = GenerationConfig.top_p,
                   repetition_penalty: float = GenerationConfig.repetition_penalty) -> list[TokenProbability]:
        """The next-token distribution after the sampler, most likely first, with token texts."""
        config = make_config(temperature=temperature, top_k=top_k, top_p=top_p,
                             repetition_penalty=repetition_penalty)      # validate before connecting
        check_prompt(prompt_or_ids)
        check_next_token_path(path)
        return distribution_rows(self.engine(path), prompt_or_ids, config)

    def close(self) -> None:
        for engine in self._engines.values():
            engine.close()
        self._engines.clear()
        self.resources.close()
        if self._owns_writer and self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_next_token_path(path: str) -> None:
    """next_token shows a path's own next-token distribution: refuse a path without one."""
    declared = declaration(path)
    if not declared.next_token:
        instead = declared.next_token_instead or f"use path={' or '.join(map(repr, next_token_paths()))}"
        raise InvalidArgument("path", f"next_token has no {path} path: {instead}")


def distribution_rows(engine: Engine, prompt_or_ids: str | Sequence[int],
                      config: GenerationConfig) -> list[TokenProbability]:
    """An engine's next-token distribution after the sampler, most likely first, with token texts."""
    from hartonomous.textstream import decode

    dist = engine.distribution(prompt_or_ids, config)
    rows, total = [], 0.0
    for token_id, p in zip(dist.token_ids, dist.probabilities):
        total += p
        rows.append(TokenProbability(token_id, decode(engine.tokenizer, [token_id]), p, total))
    return rows


def make_config(**options: Any) -> GenerationConfig:
    """GenerationConfig from keyword options, with a clear error for unknown ones."""
    unknown = sorted(set(options) - set(CONFIG_OPTIONS))
    if unknown:
        raise UserError(f"unknown option(s) {', '.join(unknown)}; valid: {', '.join(CONFIG_OPTIONS)}")
    return GenerationConfig(**options)
