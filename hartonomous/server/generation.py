"""The blocking work behind each endpoint; runs in a worker thread, never on the event loop.

Each request's options are validated first (GenerationConfig and the prompt rule; their
InvalidArgument becomes a 422 naming the field), before a connection is borrowed or a model
loaded.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from hartonomous.client import distribution_rows, make_config
from hartonomous.engine import GenerationResult, TokenEvent, check_prompt, check_prompts
from hartonomous.generation_config import GenerationConfig
from hartonomous.server.runtime import Runtime
from hartonomous.server.schemas import BatchRequest, GenerateRequest, NextTokenRequest, StreamRequest
from hartonomous.textstream import decode

READY = "ready"                       # produce_stream emits this once the generation is set up


class Result(dict):
    """The final summary of a streamed generation (sent as `event: result`)."""


class MemoryNote(dict):
    """What a remembering server's memory did with a streamed generation, when the stream carries
    no result (sent as `event: memory`): the `memory` object of the response."""


def memory_out(result: GenerationResult) -> dict | None:
    """The response's `memory`: None where the server does not remember, else whether this
    generation was remembered and, if not, why (its path, its end, or the set's sampler policy)."""
    outcome = getattr(result, "memory", None)
    return outcome.as_dict() if outcome is not None else None


def result_out(result: GenerationResult, atom_set: str | None) -> dict:
    """A GenerationResult as the API's GenerateResponse."""
    t = result.timings
    return {"path": result.path, "atom_set": atom_set, "text": result.text, "token_ids": result.token_ids,
            "prompt_tokens": len(result.prompt_ids), "state": result.state.value,
            "finish_reason": result.finish_reason, "seed": result.seed,
            "timings": {"prefill_s": t.prefill_s, "total_s": t.total_s, "tokens_per_second": t.tokens_per_second,
                        "time_to_first_token_s": t.time_to_first_token_s},
            "stats": result.stats.as_dict() if result.stats is not None else None,
            "memory": memory_out(result)}


def _engine(runtime: Runtime, req):
    """The request's engine, built by its path's declaration over the server's shared resources."""
    return runtime.engine(req.path, req.path_options(), req.atom_set, in_database=getattr(req, "in_database", False))


def _config(req, *prompts: str) -> GenerationConfig:
    """The request's GenerationConfig; raises InvalidArgument (-> 422) for options or prompts it rejects."""
    config = make_config(**req.config_options())
    for prompt in prompts:
        check_prompt(prompt)
    return config


def next_token(runtime: Runtime, req: NextTokenRequest) -> dict:
    config = _config(req, req.prompt)
    with _engine(runtime, req) as engine:
        rows = distribution_rows(engine, req.prompt, config)
        atom_set = engine.atom_set
    return {"path": req.path, "atom_set": atom_set, "total_rows": len(rows),
            "rows": [r.__dict__ for r in rows[:req.limit]]}


def generate(runtime: Runtime, req: GenerateRequest, cancel: threading.Event) -> dict:
    config = _config(req, req.prompt)
    with _engine(runtime, req) as engine:
        session = engine.stream(req.prompt, config, cancel)
        with runtime.tracking(session):
            result = session.run()
        return result_out(result, engine.atom_set)


def generate_batch(runtime: Runtime, req: BatchRequest, cancel: threading.Event) -> dict:
    config = _config(req)
    check_prompts(req.prompts)
    with _engine(runtime, req) as engine:
        results = engine.generate_batch(req.prompts, config, cancel)
        return {"results": [result_out(r, engine.atom_set) for r in results]}


def produce_stream(runtime: Runtime, req: StreamRequest, emit: Callable[[Any], None],
                   cancel: threading.Event) -> None:
    """Emit READY, then one payload per event ({"token": text, ...}), then a Result (with details)."""
    config = _config(req, req.prompt)
    with _engine(runtime, req) as engine:
        session = engine.stream(req.prompt, config, cancel)
        emit(READY)
        with runtime.tracking(session):
            for event in session.events():
                if req.details:
                    emit(_details(event, engine.tokenizer, req.top_n))
                elif event.text:
                    emit({"token": event.text})
        if session.tail:                   # held-back text that no token event carried
            emit({"token": session.tail})
        if req.details:
            emit(Result(result_out(session.result, engine.atom_set)))
        elif session.result is not None and memory_out(session.result) is not None:
            emit(MemoryNote(memory_out(session.result)))


def _details(event: TokenEvent, tokenizer, top_n: int) -> dict:
    payload = {"token": event.text, "token_id": event.token_id, "step": event.step,
               "probability": _finite(event.probability), "seconds": event.seconds}
    dist = event.distribution
    if dist is not None and top_n:
        payload["distribution"] = [
            {"token_id": t, "text": decode(tokenizer, [t]), "probability": p}
            for t, p in zip(dist.token_ids[:top_n], dist.probabilities[:top_n])]
    if event.signals is not None:
        payload["signals"] = {k: _finite(v) for k, v in event.signals.as_dict().items()}
    for name in ("mode", "route", "origin", "source"):   # adaptive sampler / hybrid path / speculative origin, source
        if getattr(event, name) is not None:
            payload[name] = getattr(event, name)
    if event.weight is not None:               # augmented: the step's λ, and whether the store's top token won
        payload["weight"] = _finite(event.weight)
        payload["store_top"] = event.store_top
    if event.citations:                        # cite: where a store-picked token came from
        payload["citations"] = [c.as_dict() for c in event.citations]
    if event.live is not None:                 # speculative: running acceptance and tokens per forward
        payload["live"] = {k: _finite(v) if isinstance(v, float) else v for k, v in event.live.items()}
    return payload


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
