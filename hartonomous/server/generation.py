"""The blocking work behind each endpoint; runs in a worker thread, never on the event loop."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

from hartonomous.client import make_config
from hartonomous.engine import Engine, GenerationResult, TokenEvent
from hartonomous.server.runtime import ObservedBackend, Runtime
from hartonomous.server.schemas import BatchRequest, GenerateRequest, NextTokenRequest, StreamRequest
from hartonomous.textstream import decode

READY = "ready"                       # produce_stream emits this once the generation is set up


class Result(dict):
    """The final summary of a streamed generation (sent as `event: result`)."""


def _atom_set(engine: Engine) -> str | None:
    info = getattr(engine.backend, "atom_set", None)
    return getattr(info, "name", None)


def result_out(result: GenerationResult, atom_set: str | None) -> dict:
    """A GenerationResult as the API's GenerateResponse."""
    t = result.timings
    return {"path": result.path, "atom_set": atom_set, "text": result.text, "token_ids": result.token_ids,
            "prompt_tokens": len(result.prompt_ids), "state": result.state.value,
            "finish_reason": result.finish_reason, "seed": result.seed,
            "timings": {"prefill_s": t.prefill_s, "total_s": t.total_s, "tokens_per_second": t.tokens_per_second,
                        "time_to_first_token_s": t.time_to_first_token_s}}


def _client(runtime: Runtime, req):
    return runtime.client(req.path, req.atom_set, req.search_radius, req.max_neighbors)


def next_token(runtime: Runtime, req: NextTokenRequest) -> dict:
    with _client(runtime, req) as client:
        rows = client.next_token(req.prompt, req.path, temperature=req.temperature, top_k=req.top_k,
                                 top_p=req.top_p, repetition_penalty=req.repetition_penalty)
        atom_set = _atom_set(client.engine(req.path))
    return {"path": req.path, "atom_set": atom_set, "total_rows": len(rows),
            "rows": [r.__dict__ for r in rows[:req.limit]]}


def generate(runtime: Runtime, req: GenerateRequest, cancel: threading.Event) -> dict:
    with _client(runtime, req) as client:
        engine = client.engine(req.path, in_database=req.in_database)
        session = engine.stream(req.prompt, make_config(**req.config_options()), cancel)
        with runtime.tracking(session):
            result = session.run()
        return result_out(result, _atom_set(engine))


def generate_batch(runtime: Runtime, req: BatchRequest, cancel: threading.Event) -> dict:
    with _client(runtime, req) as client:
        engine = client.engine(req.path, in_database=req.in_database)
        results = engine.generate_batch(req.prompts, make_config(**req.config_options()), cancel)
        return {"results": [result_out(r, _atom_set(engine)) for r in results]}


def produce_stream(runtime: Runtime, req: StreamRequest, emit: Callable[[Any], None],
                   cancel: threading.Event) -> None:
    """Emit READY, then one payload per token ({"token": text, ...}), then a Result."""
    with _client(runtime, req) as client:
        base = client.engine(req.path, in_database=req.in_database)
        observed = ObservedBackend(base.backend)
        session = Engine(observed).stream(req.prompt, make_config(**req.config_options()), cancel)
        emit(READY)
        sent = []
        with runtime.tracking(session):
            for event in session.events():
                if event.text:
                    sent.append(event.text)
                if req.details:
                    emit(_details(event, observed.last, base.tokenizer, req.top_n))
                elif event.text:
                    emit({"token": event.text})
        result = session.result
        so_far = "".join(sent)
        if result.text.startswith(so_far) and len(result.text) > len(so_far):   # text held back to the end
            emit({"token": result.text[len(so_far):]})
        if req.details:
            emit(Result(result_out(result, _atom_set(base))))


def _details(event: TokenEvent, dist, tokenizer, top_n: int) -> dict:
    payload = {"token": event.text, "token_id": event.token_id, "step": event.step,
               "probability": _finite(event.probability), "seconds": event.seconds}
    if dist is not None and top_n:
        payload["distribution"] = [
            {"token_id": t, "text": decode(tokenizer, [t]), "probability": p}
            for t, p in zip(dist.token_ids[:top_n], dist.probabilities[:top_n])]
    return payload


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
