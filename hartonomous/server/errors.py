"""Errors as JSON `{"error": "..."}`; a traceback never reaches the client.

422: the request is outside the limits (each entry of `detail` names its field in `loc`): the
     schema's ranges, or an InvalidArgument from the engine's rules (GenerationConfig, prompts);
400: a problem the user can fix (UserError, e.g. an unknown atom set);
503: the database or the exact model is unavailable now;
500: anything else; logged server-side with an error id that the response repeats.
"""

from __future__ import annotations

import logging
import uuid

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hartonomous.errors import DatabaseUnavailable, InvalidArgument, UserError
from hartonomous.server.runtime import ServiceUnavailable
from hartonomous.server.streaming import internal_error_message

log = logging.getLogger("hartonomous.server")


def _field(loc) -> str:
    parts = [str(p) for p in loc if p != "body"]
    return ".".join(parts) or "body"


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 naming the fields; the offending input is not echoed back (it may be huge)."""
    detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""),
               "field": "body" if e.get("type") == "json_invalid" else _field(e.get("loc", ())),
               "type": e.get("type", "")} for e in exc.errors()]
    summary = "; ".join(f"{d['field']}: {d['msg']}" for d in detail[:3]) or "invalid request"
    return JSONResponse(status_code=422, content={"error": summary, "detail": detail})


async def invalid_argument(request: Request, exc: InvalidArgument) -> JSONResponse:
    """The engine rejected an option: the same 422 as a schema error, naming the field."""
    message = " ".join(str(exc).split())
    detail = [{"loc": ["body", exc.name], "msg": message, "field": exc.name, "type": "value_error"}]
    return JSONResponse(status_code=422, content={"error": f"{exc.name}: {message}", "detail": detail})


async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """A body that is not UTF-8 JSON is a 422 naming `body`, like any other malformed body."""
    if exc.status_code == 400 and isinstance(exc.__cause__, (ValueError, RecursionError)):  # bad bytes, deep nesting
        detail = [{"loc": ["body"], "field": "body", "msg": "the body is not valid UTF-8 JSON",
                   "type": "json_invalid"}]
        return JSONResponse(status_code=422, content={"error": "body: the body is not valid UTF-8 JSON",
                                                      "detail": detail})
    return await http_exception_handler(request, exc)


async def user_error(request: Request, exc: UserError) -> JSONResponse:
    status = 503 if isinstance(exc, (ServiceUnavailable, DatabaseUnavailable)) else 400
    return JSONResponse(status_code=status, content={"error": " ".join(str(exc).split())})


async def database_error(request: Request, exc: psycopg.OperationalError) -> JSONResponse:
    log.warning("database error on %s: %s", request.url.path, str(exc).strip().splitlines()[:1])
    return JSONResponse(status_code=503, content={
        "error": "the database is unreachable; try again shortly, and check GET /healthz"})


class CatchAll:
    """ASGI middleware: an unhandled exception becomes a logged 500 with a JSON body."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            error_id = uuid.uuid4().hex[:12]
            log.exception("unhandled error on %s %s (error id %s)", scope.get("method"), scope.get("path"),
                          error_id)
            if not started:
                response = JSONResponse(status_code=500, content={"error": internal_error_message(error_id)})
                await response(scope, receive, send)


def install(app: FastAPI) -> None:
    """Register the handlers and the catch-all middleware on `app`."""
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(InvalidArgument, invalid_argument)
    app.add_exception_handler(UserError, user_error)
    app.add_exception_handler(psycopg.OperationalError, database_error)
    app.add_middleware(CatchAll)
