"""The FastAPI application: `create_app(runtime)`; tests inject a Runtime with a tiny model and a test DB."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from hartonomous.server import errors, openai_api
from hartonomous.server.routes import STATIC_DIR, router
from hartonomous.server.runtime import Runtime, ServerConfig

DESCRIPTION = """Geometric (spatial, PostGIS) and exact (transformer) next-token inference over HTTP.

Streaming: `POST /api/generate/stream` answers with Server-Sent Events,
`data: {"token": "..."}` per token, then `data: [DONE]`. The playground is at `/`."""


def create_app(runtime: Runtime | None = None, config: ServerConfig | None = None) -> FastAPI:
    """The app over `runtime` (or a new one from `config`); it is opened and closed by the lifespan."""
    runtime = runtime or Runtime(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.open()
        try:
            yield
        finally:
            runtime.close()

    app = FastAPI(title="Hartonomous", version=_version(), description=DESCRIPTION,
                  lifespan=lifespan, redoc_url=None)
    app.state.runtime = runtime
    app.include_router(router)
    openai_api.install(app)             # /v1: the OpenAI-compatible API (docs/openai.md)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    errors.install(app)
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hartonomous")
    except PackageNotFoundError:
        return "0"
