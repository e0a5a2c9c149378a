"""The endpoints: /api/next_token, /api/generate(/stream|/batch), /api/atom_sets, /api/paths, /healthz, /."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse
from sse_starlette import EventSourceResponse

from hartonomous.atomset import atom_set_names, list_atom_sets
from hartonomous.paths import DEFAULT_PATH
from hartonomous.paths.context import as_dicts
from hartonomous.paths.default import gated_sets, served_paths
from hartonomous.server import generation
from hartonomous.server.playground import STATIC_DIR, page as playground_page
from hartonomous.server.runtime import Runtime
from hartonomous.server.schemas import (AtomSetsResponse, BatchRequest, BatchResponse, ErrorResponse,
                                        GenerateRequest, GenerateResponse, NextTokenRequest, NextTokenResponse,
                                        StreamRequest)
from hartonomous.server.streaming import WorkerStream, run_blocking, sse_events

ERRORS = {400: {"model": ErrorResponse}, 503: {"model": ErrorResponse}, 500: {"model": ErrorResponse}}
ATOM_SET_FIELDS = ("name", "model", "kind", "vocab_size", "embedding_dim", "projection", "kernel", "bandwidth",
                   "centroid_window", "centroid_decay", "history_weight", "history_window", "is_default", "created_at")

router = APIRouter()


def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime


@router.post("/api/next_token", response_model=NextTokenResponse, responses=ERRORS, tags=["inference"])
async def next_token(body: NextTokenRequest, request: Request) -> dict:
    """The next-token distribution after the sampler, most likely first, with token texts."""
    runtime = _runtime(request)
    return await run_blocking(request, runtime.executor_for(body.path),
                              lambda cancel: generation.next_token(runtime, body))


@router.post("/api/generate", response_model=GenerateResponse, responses=ERRORS, tags=["inference"])
async def generate(body: GenerateRequest, request: Request) -> dict:
    """Blocking generation on one path; a client disconnect cancels it."""
    runtime = _runtime(request)
    return await run_blocking(request, runtime.executor_for(body.path), partial(generation.generate, runtime, body))


@router.post("/api/generate/batch", response_model=BatchResponse, responses=ERRORS, tags=["inference"])
async def generate_batch(body: BatchRequest, request: Request) -> dict:
    """Every prompt with the same options (and seed), one after another, on one path."""
    runtime = _runtime(request)
    return await run_blocking(request, runtime.executor_for(body.path), partial(generation.generate_batch, runtime, body))


@router.post("/api/generate/stream", responses={
    200: {"content": {"text/event-stream": {}},
          "description": 'SSE: `data: {"token": "..."}` per token, then `data: [DONE]`.'}, **ERRORS},
    tags=["inference"])
async def generate_stream(body: StreamRequest, request: Request) -> EventSourceResponse:
    """Server-Sent Events, one per token; closing the connection cancels the generation."""
    runtime = _runtime(request)
    stream = WorkerStream(runtime.executor_for(body.path), partial(generation.produce_stream, runtime, body))
    try:
        await stream.get()          # READY; set-up errors (unknown atom set, ...) become HTTP errors here
    except BaseException:
        stream.cancel.set()
        raise
    return EventSourceResponse(sse_events(stream), ping=runtime.config.ping_seconds, sep="\n",
                               headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@router.get("/api/atom_sets", response_model=AtomSetsResponse, responses=ERRORS, tags=["database"])
def atom_sets(request: Request) -> dict:
    """The atom sets in the database, the default one first."""
    with _runtime(request).connection() as conn:
        records = list_atom_sets(conn)
        gated = gated_sets(conn)
    sets = [{**record.model_dump(mode="json", include=set(ATOM_SET_FIELDS)), "stats": record.stats.to_json(),
             "paths": served_paths(record, gated)} for record in records]
    return {"atom_sets": sets, "default": next((s["name"] for s in sets if s["is_default"]), None)}


@router.get("/healthz", tags=["service"])
def healthz(request: Request) -> JSONResponse:
    """200 when the database answers (with the atom set count and whether generations are remembered),
    else 503 saying what is wrong."""
    runtime = _runtime(request)
    info = {"status": "ok", "database": "ok", "exact_model": runtime.exact_status()}
    try:
        with runtime.connection(timeout=min(5.0, runtime.config.pool_timeout_s)) as conn:
            info["atom_sets"] = len(atom_set_names(conn))
    except Exception as exc:     # any failure here is reported, not raised
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        info.update(status="error", database=f"unavailable: {first}")
        return JSONResponse(status_code=503, content=info)
    writer = runtime.memory_writer
    info["memory"] = ({"remember": True, "max_atoms": writer.max_atoms, "remembered": writer.written,
                       "refused": writer.refused, "failed": writer.failed,
                       "policy": writer.policy.arguments() if writer.policy is not None else None}
                      if writer is not None else {"remember": False})
    info["memory"]["read"] = runtime.reads_memory      # drafts read the sets' memory (serve --memory or --remember)
    info["prefix_cache"] = runtime.prefix_cache_stats()
    info["draft_learning"] = runtime.draft_learning.as_dict()   # what speculative requests carry to the next
    info["pools"] = runtime.pool_stats()
    return JSONResponse(info)


@router.get("/api/paths", tags=["service"])
def paths() -> dict:
    """The generation paths as declared (hartonomous/paths/): what each does and needs, its options
    and their defaults, its extra per-token fields."""
    return {"paths": as_dicts(), "default": DEFAULT_PATH}


@router.get("/", include_in_schema=False)
def playground() -> HTMLResponse:
    """The playground page, with a pane for each declared path."""
    return HTMLResponse(playground_page())
