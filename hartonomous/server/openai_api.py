"""The OpenAI-compatible API under /v1: GET /v1/models, POST /v1/completions, POST /v1/chat/completions.

Same app, same engines as /api (Runtime.engine), OpenAI's shapes (docs/openai.md). Each request is
validated (hartonomous.server.openai_schemas) before anything loads; its model id names a path and
an atom set (hartonomous.server.openai_models). The generation runs in the path's executor; a
client that disconnects cancels it within one step, streamed or not, as on /api.

finish_reason: `length` when max_tokens ran out; `stop` for an end-of-sequence token, a stop
sequence, and the project's own ends `no_candidates` (the path had nothing left to propose) and
`abstain` (adaptive sampling stopped); the project's reason is in the response's `hartonomous`.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import psycopg
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from hartonomous.errors import InvalidArgument, UserError
from hartonomous.generation_config import GenerationConfig, SamplerArgs
from hartonomous.server.openai_models import list_models, resolve
from hartonomous.server.openai_schemas import (ChatRequest, Common, CompletionRequest, OpenAIError, invalid,
                                               parse)
from hartonomous.server.streaming import DONE, WorkerStream, run_blocking
from hartonomous.textstream import decode

log = logging.getLogger("hartonomous.server")
router = APIRouter(prefix="/v1", tags=["openai"])
PROMPT_ROWS = 512               # echo's prompt logprobs: logits rows per forward (~100 MB for SmolLM2)
RAW = SamplerArgs(temperature=1.0, top_k=None, top_p=1.0, repetition_penalty=1.0)   # logprobs' distribution
FINISH = {"length": "length"}    # every other end of the project's is "stop" (module docstring)


def finish_reason(reason: str) -> str:
    return FINISH.get(reason, "stop")


# -- the generation, in a worker thread ----------------------------------------------------------


class RawTap:
    """A backend that also keeps each step's own distribution at temperature 1, before top-k and
    top-p (`last`): the logprobs. Computed first, so the step's state is the sampler's afterwards."""

    def __init__(self, backend: Any):
        self._backend = backend
        self.last = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def distribution(self, state: Any, sampler: SamplerArgs):
        self.last = self._backend.distribution(state, RAW)
        return self.last if sampler == RAW else self._backend.distribution(state, sampler)


def _steps(backend: Any) -> bool:
    """Whether the engine drives `backend` step by step (one distribution per token)."""
    from hartonomous.backends.base import WholeLoopBackend

    return not isinstance(backend, WholeLoopBackend) and not hasattr(backend, "stream_tokens")


class TargetScorer:
    """The logprobs of a path that decides several tokens per call (speculative): its target's own
    distribution at each position (temperature 1, no warpers), from a state of the target's that
    follows the emitted tokens: one more forward per token, only when logprobs are asked for."""

    def __init__(self, target: Any):
        self.target = target
        self.state = None
        self.last: int | None = None       # the token to feed before the next distribution

    @classmethod
    def of(cls, backend: Any, path: str) -> "TargetScorer":
        target = getattr(backend, "exact", None)
        if target is None or not hasattr(target, "distribution"):
            raise invalid("logprobs", f"the {path} path here has no next-token distribution to report (the "
                                      "in-database loop computes none); ask without logprobs, or use path exact")
        return cls(target)

    def next(self, prompt_ids: list[int], token: int):
        """The target's distribution before `token`; then `token` is fed to it."""
        if self.state is None:
            self.state = self.target.start(list(prompt_ids))
        else:
            self.target.advance(self.state, self.last)
        self.last = token
        return self.target.distribution(self.state, RAW)


@dataclass
class Piece:
    """One token's output: its text and, with logprobs, its own and the top alternatives'."""

    text: str
    token_id: int | None = None
    logprob: float | None = None
    top: list[tuple[int, float]] = field(default_factory=list)
    extra: dict = field(default_factory=dict)   # the path's per-token fields (augmented λ, speculative origin)


@dataclass
class Plan:
    """What one /v1 request runs: a path over an atom set, a prompt (text, ids, or chat), options."""

    model_id: str
    path: str
    atom_set: str | None
    prompt: str | list[int] | None
    messages: list[dict] | None
    max_tokens: int
    config_options: dict
    path_options: Any
    logprobs: int | None          # top alternatives per token (0: the token's own only); None: none
    fit: bool = False             # no max_tokens given (chat): as many as the context leaves, up to the cap
    echo: bool = False            # completions: the prompt comes first in the text (with logprobs, scored)


def plan(request: Common, model_id) -> Plan:
    from hartonomous.paths.options import PathOptions

    chat = isinstance(request, ChatRequest)
    top = (request.top_logprobs or 0) if chat and request.logprobs else (None if chat else request.logprobs)
    max_tokens = request.new_tokens() if chat else (request.max_tokens or 16)
    options = dict(temperature=request.temperature, top_k=request.top_k or None, top_p=request.top_p,
                   repetition_penalty=request.repetition_penalty, max_new_tokens=max_tokens, seed=request.seed,
                   stop_strings=request.stops(), cite=request.cite)
    fit = chat and request.max_completion_tokens is None and request.max_tokens is None
    return Plan(model_id.id, model_id.path, model_id.atom_set, None if chat else request.prompt,
                request.chat() if chat else None, max_tokens, options, PathOptions(), top, fit,
                bool(getattr(request, "echo", False)))


def context_length(model: Any) -> int | None:
    """The exact model's context in tokens, where its runtime says (llama n_ctx, GGUF, transformers config)."""
    n_ctx = getattr(model, "n_ctx", None)
    if isinstance(n_ctx, int):
        return n_ctx
    length = getattr(getattr(model, "config", None), "context_length", None)
    if isinstance(length, int):
        return length
    inner = getattr(getattr(model, "model", None), "config", None)
    length = getattr(inner, "max_position_embeddings", None)
    return length if isinstance(length, int) else None


def render_chat(tokenizer: Any, messages: list[dict]) -> str:
    """The messages in the model's own chat template (its tokenizer's metadata), ready for the reply:
    transformers' rendering, or the same Jinja rules for the GGUF runtimes' tokenizer (FastTokenizer)."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        raise invalid("messages", "this model has no chat template in its tokenizer metadata, so chat cannot be "
                                  "rendered; use POST /v1/completions with your own prompt")
    if hasattr(tokenizer, "apply_chat_template"):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return _jinja(template).render(messages=messages, add_generation_prompt=True,
                                   bos_token=getattr(tokenizer, "bos_token", None) or "",
                                   eos_token=getattr(tokenizer, "eos_token", None) or "")


def _jinja(template: str) -> Any:
    """A chat template compiled as transformers compiles one (sandboxed, trimmed blocks, loop controls)."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str):
        raise invalid("messages", f"the model's chat template refused the messages: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def prompt_ids(engine: Any, p: Plan) -> tuple[list[int], str, int]:
    """The prompt's token ids and text, and the new tokens to allow; a prompt plus max_tokens beyond
    the model's context is a 400 (without max_tokens, chat takes what the context leaves)."""
    tokenizer = engine.tokenizer
    if p.messages is not None:
        text = render_chat(tokenizer, p.messages)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        param = "messages"
    elif isinstance(p.prompt, str):
        text, ids, param = p.prompt, list(engine.encode(p.prompt)), "prompt"
    else:
        vocab = len(tokenizer) if hasattr(tokenizer, "__len__") else tokenizer.vocab_size
        if any(t >= vocab for t in p.prompt):
            raise invalid("prompt", f"token ids must be below the vocabulary size {vocab}")
        ids, param = list(p.prompt), "prompt"
        text = decode(tokenizer, ids)
    model = getattr(engine.backend, "model", None) or getattr(getattr(engine.backend, "exact", None), "model", None)
    limit = context_length(model) if model is not None else None
    max_tokens = min(p.max_tokens, limit - len(ids)) if p.fit and limit is not None else p.max_tokens
    if limit is not None and (len(ids) + max_tokens > limit or max_tokens < 1):
        raise invalid(param, f"this model's context is {limit} tokens; the prompt holds {len(ids)} and max_tokens "
                             f"asks for {max(max_tokens, 1)} more ({len(ids) + max(max_tokens, 1)}); shorten the "
                             "prompt or lower max_tokens", "context_length_exceeded")
    return ids, text, max_tokens


def produce(runtime: Any, p: Plan, emit: Callable[[Any], None], cancel: threading.Event) -> None:
    """Emit Ready once set up, then a Piece per token, then the GenerationResult (with the prompt)."""
    from hartonomous.client import make_config

    try:
        config: GenerationConfig = make_config(**p.config_options)
    except InvalidArgument as exc:
        raise invalid(exc.name, " ".join(str(exc).split())) from exc
    with runtime.engine(p.path, p.path_options, p.atom_set) as engine:
        ids, text, max_tokens = prompt_ids(engine, p)
        config = replace(config, max_new_tokens=max_tokens)
        echo = None
        if p.echo:
            echo = Echo(text, prompt_logprobs(runtime.exact_model(), ids, p.logprobs)
                        if p.logprobs is not None else [])
        tap = scorer = None
        if p.logprobs is not None:
            if _steps(engine.backend):
                tap = engine.backend = RawTap(engine.backend)
            else:
                scorer = TargetScorer.of(engine.backend, p.path)
        session = engine.stream(ids, config, cancel)
        tokenizer = engine.tokenizer
        emit(Ready(tokenizer))
        if echo is not None:
            emit(echo)
        with runtime.tracking(session):
            for event in session.events():
                piece = Piece(event.text, event.token_id, extra=token_fields(event))
                if tap is not None and tap.last is not None:
                    piece.logprob, piece.top = _logprobs(tap.last, event.token_id, p.logprobs)
                elif scorer is not None:
                    piece.logprob, piece.top = _logprobs(scorer.next(ids, event.token_id), event.token_id,
                                                         p.logprobs)
                if event.token_id in session.eos_ids or event.token_id in session.stop_ids:
                    piece.token_id = None       # not part of the output: no logprobs entry
                emit(piece)
        if session.tail:
            emit(Piece(session.tail))
        emit(Finished(session.result, ids, text, tokenizer, engine.atom_set, echo))


@dataclass
class Ready:
    """The generation is set up (errors before this are HTTP errors; after, stream errors)."""

    tokenizer: Any


@dataclass
class Echo:
    """The prompt, echoed before the completion (`echo`): its text and, with logprobs, its tokens."""

    text: str
    pieces: list[Piece]


@dataclass
class Finished:
    result: Any
    prompt_ids: list[int]
    prompt_text: str
    tokenizer: Any
    atom_set: str | None
    echo: Echo | None = None


def token_fields(event: Any) -> dict:
    """A streamed token's extension fields: hybrid's route, speculative's origin, augmented's λ, and
    with `cite` a store-picked token's citations (files and lines, memory entries)."""
    fields = {name: getattr(event, name) for name in ("route", "origin", "source", "store_top")
              if getattr(event, name) is not None}
    if event.weight is not None and math.isfinite(event.weight):
        fields["weight"] = event.weight
    if event.citations:
        fields["citations"] = [c.as_dict() for c in event.citations]
        fields["step"] = event.step
    return fields


def prompt_logprobs(model: Any, ids: list[int], top: int, rows: int = PROMPT_ROWS) -> list[Piece]:
    """The prompt's tokens scored by the exact model at temperature 1 (echo with logprobs): each
    token's logprob given the tokens before it, and the top alternatives there; the first token has
    none (nothing comes before it). Rows of logits `rows` at a time, so a long prompt never holds its
    whole (tokens x vocabulary) matrix; each batch is one forward over the prompt so far."""
    import torch

    pieces = [Piece("", ids[0], None, None)]
    for start in range(1, len(ids), rows):
        end = min(len(ids), start + rows)
        logits = model.full_logits_many(ids[:end - 1], end - start)    # rows for positions start-1 .. end-2
        logp = torch.log_softmax(logits.float(), dim=-1)
        best = torch.topk(logp, top, dim=-1) if top else None
        for r, token in enumerate(ids[start:end]):
            alternatives = list(zip(best.indices[r].tolist(), best.values[r].tolist())) if best is not None else []
            pieces.append(Piece("", token, _floor(float(logp[r, token])), [(t, _floor(v)) for t, v in alternatives]))
    return pieces


def _floor(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else -9999.0


def _logprobs(dist: Any, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    probs = dict(zip(dist.token_ids, dist.probabilities))
    own = probs.get(token, 0.0)
    return _log(own), [(t, _log(q)) for t, q in zip(dist.token_ids[:top], dist.probabilities[:top])]


def _log(p: float) -> float:
    return math.log(p) if p > 0 else -9999.0      # OpenAI's floor for an impossible token


# -- the wire shapes ---------------------------------------------------------------------------


def usage(done: Finished) -> dict:
    n_prompt, n_out = len(done.prompt_ids), len(done.result.token_ids)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}


def extension(done: Finished, p: Plan, memory: bool) -> dict:
    """The project's own fields: the path, the set, the project's finish reason, the seed (and memory)."""
    from hartonomous.server.generation import memory_out

    r = done.result
    out = {"path": r.path, "atom_set": done.atom_set, "finish_reason": r.finish_reason, "seed": r.seed,
           "stats": r.stats.as_dict() if r.stats is not None else None}
    if memory:
        out["memory"] = memory_out(r)
    return out


def _text(tokenizer: Any, token_id: int) -> str:
    return decode(tokenizer, [token_id])


def completion_logprobs(pieces: list[Piece], tokenizer: Any, offset: int) -> dict:
    tokens, own, tops, offsets = [], [], [], []
    for piece in pieces:
        if piece.token_id is None:
            continue
        text = _text(tokenizer, piece.token_id)
        offsets.append(offset)
        offset += len(text)
        tokens.append(text)
        own.append(piece.logprob)
        tops.append({_text(tokenizer, t): lp for t, lp in piece.top} if piece.top is not None else None)
    return {"tokens": tokens, "token_logprobs": own, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(pieces: list[Piece], tokenizer: Any) -> dict:
    def entry(token_id: int, logprob: float) -> dict:
        text = _text(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {"content": [dict(entry(p.token_id, p.logprob), top_logprobs=[entry(t, lp) for t, lp in p.top])
                        for p in pieces if p.token_id is not None], "refusal": None}


class Shape:
    """The response objects of one request (non-streamed and chunks), chat or text."""

    def __init__(self, p: Plan, request: Common):
        self.p, self.request = p, request
        self.chat = p.messages is not None
        self.id = ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.tokenizer: Any = None          # the engine's, once the generation is set up

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.p.model_id,
                "system_fingerprint": None}

    def whole(self, pieces: list[Piece], done: Finished) -> dict:
        text = done.result.text
        reason = finish_reason(done.result.finish_reason)
        if self.chat:
            logprobs = chat_logprobs(pieces, done.tokenizer) if self.p.logprobs is not None else None
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": logprobs, "finish_reason": reason}
            body = self._head("chat.completion")
        else:
            echoed = done.echo.pieces if done.echo is not None else []
            logprobs = (completion_logprobs(echoed + pieces, done.tokenizer, 0) if self.p.logprobs is not None
                        else None)
            choice = {"index": 0, "text": (done.prompt_text + text) if done.echo is not None else text,
                      "logprobs": logprobs, "finish_reason": reason}
            body = self._head("text_completion")
        out = extension(done, self.p, self.request.memory)
        if self.request.cite:            # per cited token: its step (0-based index among the generated tokens)
            out["citations"] = [{"step": p.extra["step"], "citations": p.extra["citations"]}
                                for p in pieces if p.extra.get("citations")]
        return dict(body, choices=[choice], usage=usage(done), hartonomous=out)

    def chunk(self, piece: Piece | None, tokenizer: Any, *, first: bool = False,
              done: Finished | None = None) -> dict:
        reason = finish_reason(done.result.finish_reason) if done is not None else None
        with_logprobs = self.p.logprobs is not None and piece is not None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else (
                {"content": piece.text} if piece is not None else {})
            choice = {"index": 0, "delta": delta, "logprobs": chat_logprobs([piece], tokenizer) if with_logprobs
                      else None, "finish_reason": reason}
            body = self._head("chat.completion.chunk")
        else:
            text = piece.text if piece is not None else ""
            choice = {"index": 0, "text": text, "logprobs": completion_logprobs([piece], tokenizer, 0)
                      if with_logprobs else None, "finish_reason": reason}
            body = self._head("text_completion")
        if piece is not None and piece.extra:
            choice["hartonomous"] = piece.extra
        body["choices"] = [choice]
        if self.request.include_usage():
            body["usage"] = None
        if done is not None:
            body["hartonomous"] = extension(done, self.p, self.request.memory)
        return body

    def echo_chunk(self, echo: Echo) -> dict:
        """The first chunk of a streamed completion with `echo`: the prompt (and its logprobs)."""
        choice = {"index": 0, "text": echo.text, "logprobs": completion_logprobs(echo.pieces, self.tokenizer, 0)
                  if self.p.logprobs is not None else None, "finish_reason": None}
        body = dict(self._head("text_completion"), choices=[choice])
        if self.request.include_usage():
            body["usage"] = None
        return body

    def usage_chunk(self, done: Finished) -> dict:
        return dict(self._head("chat.completion.chunk" if self.chat else "text_completion"), choices=[],
                    usage=usage(done))


# -- the endpoints ---------------------------------------------------------------------------------


def _runtime(request: Request) -> Any:
    return request.app.state.runtime


def openai_error(exc: BaseException) -> OpenAIError:
    """Any failure of a /v1 request in OpenAI's shape (a traceback never reaches the client)."""
    from hartonomous.errors import DatabaseUnavailable
    from hartonomous.server.runtime import ServiceUnavailable

    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, InvalidArgument):
        return invalid(exc.name, " ".join(str(exc).split()))
    if isinstance(exc, (ServiceUnavailable, DatabaseUnavailable)):
        return OpenAIError(503, " ".join(str(exc).split()), None, "service_unavailable", "server_error")
    if isinstance(exc, UserError):
        return invalid(None, " ".join(str(exc).split()))
    if isinstance(exc, psycopg.OperationalError):
        return OpenAIError(503, "the database is unreachable; try again shortly, and check GET /healthz", None,
                           "service_unavailable", "server_error")
    error_id = uuid.uuid4().hex[:12]
    log.error("/v1 request failed (error id %s)", error_id, exc_info=exc)
    return OpenAIError(500, f"internal server error (id {error_id}); the server log has the details", None, None,
                       "server_error")


async def _plan(request: Request, model: type[Common]) -> tuple[Common, Plan]:
    body = parse(await request.body(), model)
    runtime = _runtime(request)
    model_id = await run_in_threadpool(resolve, runtime, body.model, body.path, body.atom_set)
    return body, plan(body, model_id)


async def _generate(request: Request, model: type[Common]):
    try:
        body, p = await _plan(request, model)
        runtime = _runtime(request)
        executor = runtime.executor_for(p.path)
        shape = Shape(p, body)
        if body.stream:
            stream = WorkerStream(executor, partial(produce, runtime, p))
            try:
                shape.tokenizer = (await stream.get()).tokenizer   # Ready: set-up errors are HTTP errors here
            except BaseException:
                stream.cancel.set()
                raise
            return EventSourceResponse(_chunks(stream, shape), ping=runtime.config.ping_seconds, sep="\n",
                                       headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        def collect(cancel: threading.Event) -> tuple[list[Piece], Finished]:
            items: list[Any] = []
            produce(runtime, p, items.append, cancel)
            return [i for i in items if isinstance(i, Piece)], items[-1]

        pieces, done = await run_blocking(request, executor, collect)
        return JSONResponse(shape.whole(pieces, done))
    except Exception as exc:
        error = openai_error(exc)
        return JSONResponse(status_code=error.status, content=error.body())


async def _chunks(stream: WorkerStream, shape: Shape) -> AsyncIterator[dict]:
    """The chunks, then `data: [DONE]`; an error after the first chunk is a chunk with `error`.
    Leaving early (the client went away) cancels the generation."""
    try:
        if shape.chat:
            yield {"data": _json(shape.chunk(None, None, first=True))}
        async for item in stream:
            if isinstance(item, Finished):
                yield {"data": _json(shape.chunk(None, item.tokenizer, done=item))}
                if shape.request.include_usage():
                    yield {"data": _json(shape.usage_chunk(item))}
            elif isinstance(item, Piece) and (item.text or "citations" in item.extra
                                              or (shape.p.logprobs is not None and item.token_id is not None)):
                yield {"data": _json(shape.chunk(item, shape.tokenizer))}
            elif isinstance(item, Echo):
                yield {"data": _json(shape.echo_chunk(item))}
    except Exception as exc:
        yield {"data": _json(openai_error(exc).body())}
    finally:
        stream.cancel.set()
    yield {"data": DONE}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@router.get("/models")
async def models(request: Request) -> JSONResponse:
    """Every servable id: the exact model, then each path over each atom set whose needs are met."""
    try:
        listed = await run_in_threadpool(list_models, _runtime(request))
    except Exception as exc:
        error = openai_error(exc)
        return JSONResponse(status_code=error.status, content=error.body())
    return JSONResponse({"object": "list", "data": [_model(m.id) for m in listed]})


@router.get("/models/{model_id:path}")
async def model(model_id: str, request: Request) -> JSONResponse:
    try:
        found = await run_in_threadpool(resolve, _runtime(request), model_id)
    except Exception as exc:
        error = openai_error(exc)
        return JSONResponse(status_code=error.status, content=error.body())
    return JSONResponse(_model(found.id))


def _model(model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "hartonomous"}


@router.post("/completions")
async def completions(request: Request):
    """OpenAI's text completion (docs/openai.md)."""
    return await _generate(request, CompletionRequest)


@router.post("/chat/completions")
async def chat_completions(request: Request):
    """OpenAI's chat completion, the messages in the model's own chat template (docs/openai.md)."""
    return await _generate(request, ChatRequest)


@router.api_route("/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"], include_in_schema=False)
async def unknown(rest: str) -> JSONResponse:
    """Any other /v1 address: OpenAI's 404 in its error shape (registered last, so it matches last)."""
    error = OpenAIError(404, f"/v1/{rest} is not served here; this server answers /v1/models, /v1/completions "
                             "and /v1/chat/completions (docs/openai.md)", None, "unknown_url")
    return JSONResponse(status_code=404, content=error.body())


def install(app: FastAPI) -> None:
    """Serve /v1 on `app`."""
    app.include_router(router)
