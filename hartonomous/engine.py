"""One generation engine for every path (the InferenceSession of the original designs).

`Engine(backend)` tokenizes a prompt and runs the loop: ask the backend for the next-token
distribution (after the shared sampler), pick a token, check stop conditions, stream text.
The token is picked the same way on every path that takes one token per step (spatial, exact,
hybrid, augmented), by inverse CDF with `seeded_uniform(seed, step)`, which is also what the
database's `generate_tokens` does; so a seed reproduces a run, and the same seed gives those paths
the same random numbers (speculative decoding draws its own: hartonomous.speculative.decoding).

A step `Backend` is driven token by token; a `WholeLoopBackend` (in-database generation) runs
the loop in one call, and the engine turns its ids into the same events.

A `Session` is one generation: iterate it for text pieces (never half a character), iterate
`events()` for one `TokenEvent` per token (with the step's distribution), or call `run()` for the
result. Text held back until the end (an unfinished character, a possible stop-string prefix)
comes out in the last token's event; when the generation ends without a token to carry it
(cancelled, or no candidates left), it is `session.tail` once the events are exhausted. So the
events' texts plus `tail` join to `result.text` (the pieces of `iter(session)` include it). The
state moves ready -> generating -> complete | stopped |
cancelled (or failed if the backend raised). `cancel()` (or the `cancel` event) stops it within
one step.

The options of a generation (`GenerationConfig`, its sampler `SamplerArgs`) live in the runtime
core, `hartonomous.generation_config`; the engine applies them.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from hartonomous.adaptive import step_sampler
from hartonomous.backends.base import Backend, Cancelled, Distribution, WholeLoopBackend
from hartonomous.errors import InvalidArgument
from hartonomous.generation_config import GenerationConfig
from hartonomous.runtimes.cancel import watching
from hartonomous.runtimes.context import context_limit
from hartonomous.textstream import TextStream, cut_at_stop, decode

# torch and hartonomous.sampling are imported where they are used, so that the CLI can import the
# engine without loading torch.

VECTOR_PICK_ABOVE = 1024


class State(str, Enum):
    READY = "ready"
    GENERATING = "generating"
    COMPLETE = "complete"      # max_new_tokens reached or EOS
    STOPPED = "stopped"        # a stop token id or stop string, or no candidates left
    CANCELLED = "cancelled"
    FAILED = "failed"          # the backend raised


@dataclass(frozen=True)
class TokenEvent:
    """One generated token: the text piece it released ('' while a character is incomplete).

    The last token's event also carries the text held back until the end.
    """

    step: int
    token_id: int
    probability: float | None    # None when the database ran the whole loop
    text: str
    seconds: float | None
    distribution: Distribution | None = None   # the step's distribution; None for the whole loop
    signals: Any = None        # the step's StepSignals when asked for (config.signals or adaptive)
    mode: str | None = None    # adaptive sampling: the step's sampler, standard | explore | cautious
    route: str | None = None   # hybrid: the path that answered the step, spatial | exact
    origin: str | None = None  # speculative: draft (a drafted token the exact model kept) | exact
    source: str | None = None  # speculative, config.sources, a kept draft: corpus | self-distilled | memory | context
    live: dict | None = None   # speculative: acceptance_rate, tokens_per_forward, rounds so far
    weight: float | None = None     # augmented: the step's λ, the store's weight in the mixture
    store_top: bool | None = None   # augmented: whether the picked token was the store's most probable one
    citations: tuple | None = None  # config.cite, a token the store picked: its Citations (files, lines, memory)


@dataclass
class Timings:
    """Compute time only (time the caller spends between pieces is not counted)."""

    prefill_s: float = 0.0                       # prompt processing (KV-cache prefill)
    per_token_s: list[float] = field(default_factory=list)   # first entry includes the prefill;
    total_s: float = 0.0                                      # empty for in-database generation
    tokens: int = 0

    @property
    def time_to_first_token_s(self) -> float | None:
        return self.per_token_s[0] if self.per_token_s else None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.total_s if self.tokens and self.total_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Steady-state rate, excluding the first token (which pays for the prefill)."""
        rest = self.per_token_s[1:]
        return len(rest) / sum(rest) if rest and sum(rest) > 0 else None


@dataclass
class GenerationResult:
    path: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    state: State
    finish_reason: str          # length | eos | stop_token | stop_string | no_candidates | abstain | cancelled | error
    seed: int
    timings: Timings
    probabilities: list[float] = field(default_factory=list)
    stats: Any = None           # path statistics where the path keeps some (speculative: SpeculativeStats)
    config: GenerationConfig | None = None   # the options it ran with (the memory checks its sampler settings)
    memory: Any = None          # what a remembering client's memory did with it (hartonomous.memory.MemoryOutcome)


class Session:
    """One generation; iterate for text pieces, `events()` for events, `run()` for the result."""

    def __init__(self, engine: "Engine", prompt_ids: list[int], config: GenerationConfig,
                 cancel: threading.Event | None = None):
        self.engine, self.backend = engine, engine.backend
        self.prompt_ids = list(prompt_ids)
        self.config = config
        self.seed = int(config.seed) if config.seed is not None else secrets.randbits(63)
        self.cancel_event = cancel or threading.Event()
        self.state = State.READY
        self.result: GenerationResult | None = None
        self.stop_ids = set(config.stop_token_ids)
        self.eos_ids = self.backend.eos_token_ids() if config.stop_at_eos else set()
        limit = context_limit(self.backend)
        if limit is not None and len(self.prompt_ids) + config.max_new_tokens > limit:
            raise InvalidArgument("max_new_tokens", f"this model's context is {limit} tokens; the prompt holds "
                                                    f"{len(self.prompt_ids)} and max_new_tokens asks for "
                                                    f"{config.max_new_tokens} more; shorten the prompt or lower "
                                                    "max_new_tokens")
        self._stream = TextStream(self.backend.tokenizer, config.stop_strings)
        self._tokens: list[int] = []
        self._probs: list[float] = []
        self._timings = Timings()
        self.tail = ""        # held-back text no event carried; see the module docstring
        self._events: Iterator[TokenEvent] | None = None
        self._stats: Any = None          # the path's own statistics (speculative: SpeculativeStats)
        self._citer: Any = None
        if config.cite:                  # hartonomous.repository.citations (imported only when asked for)
            from hartonomous.repository.citations import citer_for

            self._citer = citer_for(self.backend)
        for option in ("adaptive", "signals"):
            if getattr(config, option) and not hasattr(self.backend, "signals"):
                raise InvalidArgument(option, f"{option} needs per-step signals, which the {self.backend.name} "
                                              "path does not compute step by step; use the spatial, exact or "
                                              "hybrid path (not in-database)")

    def cancel(self) -> None:
        """Stop the generation; takes effect within one step."""
        self.cancel_event.set()

    def __iter__(self) -> Iterator[str]:
        """Non-empty text pieces as they are made; they join to `result.text`.

        A consumer that stops iterating early cancels the generation.
        """
        events = self.events()
        try:
            for event in events:
                if event.text:
                    yield event.text
        finally:
            events.close()
        if self.tail:
            yield self.tail

    def run(self) -> GenerationResult:
        for _ in self.events():
            pass
        assert self.result is not None
        return self.result

    def events(self) -> Iterator[TokenEvent]:
        """One TokenEvent per token; afterwards, `tail` holds any text no event carried."""
        if self._events is not None:
            raise RuntimeError("a session runs once; start a new session to generate again")
        self._events = self._run()
        return self._events

    # -- the loop ------------------------------------------------------------------------

    def _run(self) -> Iterator[TokenEvent]:
        self.state = State.GENERATING
        try:
            with watching(self.cancel_event):     # a runtime's long forward polls it (hartonomous.runtimes.cancel)
                yield from self._run_backend()
        except GeneratorExit:
            if self.result is None:
                self._finish(State.CANCELLED, "cancelled")
            raise
        except Cancelled:
            self._finish(State.CANCELLED, "cancelled")
        except KeyboardInterrupt:
            if self.result is None:
                self._finish(State.CANCELLED, "cancelled")
            raise
        except BaseException:
            if self.result is None:
                self._finish(State.FAILED, "error")
            raise

    def _run_backend(self) -> Iterator[TokenEvent]:
        if isinstance(self.backend, WholeLoopBackend):
            yield from self._run_whole()
        elif hasattr(self.backend, "stream_tokens"):   # several tokens per call (speculative)
            yield from self._run_stream()
        else:
            yield from self._run_steps()

    def _run_steps(self) -> Iterator[TokenEvent]:
        cfg, sampler = self.config, self.config.sampler
        t0 = time.perf_counter()
        state = self.backend.start(self.prompt_ids)
        self._timings.prefill_s = time.perf_counter() - t0
        self._stats = getattr(state, "stats", None)       # the path's own statistics (hybrid: HybridStats)
        for step in range(cfg.max_new_tokens):
            if self.cancel_event.is_set():
                return self._finish(State.CANCELLED, "cancelled")
            if step > 0:
                t0 = time.perf_counter()
                self.backend.advance(state, self._tokens[-1])
            signals = self.backend.signals(state) if cfg.signals or cfg.adaptive else None
            mode = None
            if cfg.adaptive:
                mode, sampler = step_sampler(cfg, self._risk(signals))
                if sampler is None:
                    return self._finish(State.STOPPED, "abstain")
            dist = self.backend.distribution(state, sampler)
            route = getattr(state, "route", None)        # hybrid: the path that answered this step
            weight = getattr(state, "weight", None)      # augmented: this step's λ and the store's top token
            if self.cancel_event.is_set():
                return self._finish(State.CANCELLED, "cancelled")
            if len(dist) == 0:
                return self._finish(State.STOPPED, "no_candidates")
            token, prob = pick(dist, self.seed, step)
            seconds = time.perf_counter() - t0
            self._timings.per_token_s.append(seconds)
            self._timings.total_s += seconds
            last = "length" if step == cfg.max_new_tokens - 1 else None
            event = self._accept(step, token, prob, seconds, dist, last, signals, mode, route)
            if weight is not None:
                event = replace(event, weight=weight, store_top=token == getattr(state, "store_top", None))
            yield self._cited(event)
            if self.result is not None:
                return

    def _risk(self, signals: Any) -> float:
        risk = None if signals is None else signals.risk
        if risk is None:
            raise InvalidArgument("adaptive", f"adaptive sampling needs a risk per step, and the {self.backend.name} "
                                              "path has none here: use an atom set built with a risk predictor "
                                              "(hartonomous build), or turn adaptive off")
        return float(risk)

    def _run_whole(self) -> Iterator[TokenEvent]:
        cfg = self.config
        t0 = time.perf_counter()
        ids = self.backend.generate_all(self.prompt_ids, cfg.max_new_tokens, cfg.sampler, self.seed,
                                        sorted(self.stop_ids | self.eos_ids), self.cancel_event)
        self._timings.total_s = time.perf_counter() - t0
        ids = [int(t) for t in ids[:cfg.max_new_tokens]]
        out_of_tokens = "length" if len(ids) == cfg.max_new_tokens else "no_candidates"
        for step, token in enumerate(ids):
            yield self._cited(self._accept(step, token, None, None, None,
                                           out_of_tokens if step == len(ids) - 1 else None))
            if self.result is not None:
                return
        self._finish(State.STOPPED, "no_candidates")          # the database generated nothing

    def _run_stream(self) -> Iterator[TokenEvent]:
        """Tokens from a backend that decides several per call; stop rules and cancels as per step."""
        cfg = self.config
        run = self.backend.stream_tokens(self.prompt_ids, cfg.max_new_tokens, cfg.sampler, self.seed,
                                         sorted(self.stop_ids | self.eos_ids), self.cancel_event, sources=cfg.sources)
        self._stats = run.stats
        try:
            for step, (token, prob, seconds, origin, source) in enumerate(run):
                if self.cancel_event.is_set():
                    return self._finish(State.CANCELLED, "cancelled")
                self._timings.per_token_s.append(seconds)
                self._timings.total_s += seconds
                last = "length" if step == cfg.max_new_tokens - 1 else None
                event = self._accept(step, int(token), prob, seconds, None, last)
                stats = run.stats
                yield self._cited(replace(event, origin=origin, source=source,
                                          live={"acceptance_rate": stats.acceptance_rate,
                                                "tokens_per_forward": stats.tokens_per_forward,
                                                "rounds": stats.rounds}))
                if self.result is not None:
                    return
        finally:
            run.close()
        if self.result is None:
            self._finish(State.COMPLETE, "length")

    def _accept(self, step: int, token: int, prob: float | None, seconds: float | None,
                dist: Distribution | None, ends: str | None, signals: Any = None, mode: str | None = None,
                route: str | None = None) -> TokenEvent:
        """Record a token and return its event. When the token ends the generation (a stop or EOS
        token, a stop string, or `ends`: the last token there will be), finish the session first
        and put the held-back text into this event."""
        self._tokens.append(token)
        self._probs.append(prob if prob is not None else float("nan"))
        if token in self.stop_ids:
            piece, reason = "", "stop_token"
        elif token in self.eos_ids:
            piece, reason = "", "eos"
        else:
            piece = self._stream.push(token)
            reason = "stop_string" if self._stream.stopped else ends
        if reason:
            self._finish(State.COMPLETE if reason in ("eos", "length") else State.STOPPED, reason)
            piece, self.tail = piece + self.tail, ""
        return TokenEvent(step, token, prob, piece, seconds, dist, signals, mode, route)

    def _cited(self, event: TokenEvent) -> TokenEvent:
        """With config.cite, a store-picked token's event with its sources (the text before it: the
        prompt and the tokens generated so far)."""
        if self._citer is None:
            return event
        from hartonomous.repository.citations import store_picked

        if not store_picked(self.backend.name, event):
            return event
        context = self.prompt_ids + self._tokens[:event.step]
        return replace(event, citations=self._citer.cite(context, event.token_id))

    def _finish(self, state: State, reason: str) -> None:
        self.tail = self._stream.finish()
        self._timings.tokens = len(self._tokens)
        self.state = state
        self.result = GenerationResult(
            path=self.backend.name, prompt_ids=self.prompt_ids, token_ids=list(self._tokens),
            text=self._final_text(reason), state=state, finish_reason=reason, seed=self.seed,
            timings=self._timings, probabilities=list(self._probs), stats=self._stats, config=self.config)
        if self.engine.on_result is not None:
            self.engine.on_result(self.result)

    def _final_text(self, reason: str) -> str:
        """decode(generated ids), without a final stop/EOS token, cut at the first stop string."""
        ids = self._tokens[:-1] if reason in ("stop_token", "eos") else self._tokens
        text, _ = cut_at_stop(decode(self.backend.tokenizer, ids), self.config.stop_strings)
        return text


def pick(dist: Distribution, seed: int, step: int) -> tuple[int, float]:
    """The token at `seeded_uniform(seed, step)` on the distribution's CDF, and its probability.

    Large distributions (no top-k) use the vectorised `pick_index`, the same rule in torch:
    the rows are already in the documented order, so index order is token-id order for ties.
    """
    from hartonomous.sampling import pick_by_uniform, pick_index, seeded_uniform

    u = seeded_uniform(seed, step)
    if len(dist) > VECTOR_PICK_ABOVE:
        import torch

        index = int(pick_index(torch.tensor(dist.probabilities, dtype=torch.float64), u))
        return dist.token_ids[index], dist.probabilities[index]
    token = int(pick_by_uniform(dist.token_ids, dist.probabilities, u))
    return token, dist.probabilities[dist.token_ids.index(token)]


def check_prompt(prompt: str | Sequence[int]) -> None:
    """The one rule for prompts: text that is not only whitespace, or at least one token id."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InvalidArgument("prompt", "the prompt is empty; pass some text to continue")
    elif len(prompt) == 0:
        raise InvalidArgument("prompt", "the prompt is empty; pass at least one token id")


def check_prompts(prompts: Sequence[str | Sequence[int]]) -> None:
    """`check_prompt` for each prompt of a batch; the error names `prompts` and the index."""
    for i, prompt in enumerate(prompts):
        try:
            check_prompt(prompt)
        except InvalidArgument as exc:
            raise InvalidArgument("prompts", f"prompt {i}: {exc}") from exc


class Engine:
    """Prompt in, text out, over any backend (exact, spatial step by step, or in-database)."""

    def __init__(self, backend: Backend | WholeLoopBackend,
                 on_result: Callable[[GenerationResult], None] | None = None):
        self.backend = backend
        self.on_result = on_result     # called with every session's result as it ends (e.g. the memory)

    @property
    def tokenizer(self):
        return self.backend.tokenizer

    @property
    def atom_set(self) -> str | None:
        """The atom set the backend reads (None for the exact path)."""
        return self.backend.atom_set_name

    def encode(self, prompt: str | Sequence[int]) -> list[int]:
        """Token ids of a prompt (text, or ids passed through)."""
        check_prompt(prompt)
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        return [int(i) for i in prompt]

    def distribution(self, prompt: str | Sequence[int], config: GenerationConfig | None = None) -> Distribution:
        """The next-token distribution after the prompt, after the sampler (one step, nothing picked)."""
        config = config or GenerationConfig()
        return self.backend.distribution(self.backend.start(self.encode(prompt)), config.sampler)

    def session(self, prompt: str | Sequence[int], config: GenerationConfig | None = None,
                cancel: threading.Event | None = None) -> Session:
        return Session(self, self.encode(prompt), config or GenerationConfig(), cancel)

    def generate(self, prompt: str | Sequence[int], config: GenerationConfig | None = None,
                 cancel: threading.Event | None = None) -> GenerationResult:
        """Blocking: the whole result."""
        return self.session(prompt, config, cancel).run()

    def stream(self, prompt: str | Sequence[int], config: GenerationConfig | None = None,
               cancel: threading.Event | None = None) -> Session:
        """A session to iterate for text pieces; `.result` is set once it is exhausted."""
        return self.session(prompt, config, cancel)

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], config: GenerationConfig | None = None,
                       cancel: threading.Event | None = None) -> list[GenerationResult]:
        """Every prompt with the same config (and seed), one after another; equal to one-by-one calls."""
        check_prompts(prompts)
        sessions = [self.session(p, config, cancel) for p in prompts]   # encode all prompts first
        return [s.run() for s in sessions]

    def close(self) -> None:
        self.backend.close()
