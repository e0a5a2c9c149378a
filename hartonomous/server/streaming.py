"""Worker threads to the event loop, and the SSE wire format.

A generation runs in a worker thread and emits items; `WorkerStream` hands them to the event
loop. Its `cancel` event is the session's cancel event: setting it (client gone, server
stopping) stops the generation within one step. `run_blocking` is the same for one result,
polling for a client disconnect while it waits.

Wire format (the original protocol): `data: {"token": "..."}` per token, then `data: [DONE]`.
Extra, only on request (`details`): more fields in each token event and a final
`event: result`. A server that remembers generations ends a stream without details with
`event: memory` (whether the memory kept it, and why not). On a failure after the stream started: `event: error` with
`{"error": "..."}`, then `data: [DONE]`. Keep-alive pings are SSE comments (`: ping ...`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

import psycopg
from starlette.requests import Request

from hartonomous.errors import UserError
from hartonomous.server.generation import MemoryNote, Result

log = logging.getLogger("hartonomous.server")
T = TypeVar("T")
DONE = "[DONE]"
DISCONNECT_POLL_S = 0.1
DATABASE_GONE = "the database connection was lost during the generation; try again shortly, and check GET /healthz"


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class WorkerStream:
    """Run `produce(emit, cancel)` in `executor`; await its items with `get()` or `async for`."""

    _END = object()

    def __init__(self, executor: Executor, produce: Callable[[Callable[[Any], None], threading.Event], None]):
        self.cancel = threading.Event()
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._finished = False
        executor.submit(self._work, produce)

    def _emit(self, item: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:           # the event loop is closed: nobody is listening any more
            self.cancel.set()

    def _work(self, produce) -> None:
        try:
            produce(self._emit, self.cancel)
        except BaseException as exc:   # handed to the event loop, which decides what the client sees
            self._emit(_Failure(exc))
        finally:
            self._emit(self._END)

    async def get(self) -> Any:
        """The next item; re-raises the producer's exception; StopAsyncIteration at the end."""
        if self._finished:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is self._END:
            self._finished = True
            raise StopAsyncIteration
        if isinstance(item, _Failure):
            self._finished = True
            raise item.exc
        return item

    def __aiter__(self) -> "WorkerStream":
        return self

    async def __anext__(self) -> Any:
        return await self.get()


async def run_blocking(request: Request, executor: Executor, fn: Callable[[threading.Event], T]) -> T:
    """`fn(cancel)` in a worker thread; a client disconnect sets `cancel` (stops within one step)."""
    cancel = threading.Event()
    future = asyncio.wrap_future(executor.submit(fn, cancel))
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=DISCONNECT_POLL_S)
            if done:
                return future.result()
            if not cancel.is_set() and await request.is_disconnected():
                log.info("client disconnected; cancelling %s", request.url.path)
                cancel.set()
    except asyncio.CancelledError:
        cancel.set()
        raise


async def sse_events(stream: WorkerStream) -> AsyncIterator[dict]:
    """Token events, then [DONE]; errors become `event: error`. Leaving early cancels the generation."""
    try:
        async for item in stream:
            if isinstance(item, Result):
                yield {"event": "result", "data": _json(dict(item))}
            elif isinstance(item, MemoryNote):
                yield {"event": "memory", "data": _json(dict(item))}
            else:
                yield {"data": _json(item)}
    except UserError as exc:
        yield {"event": "error", "data": _json({"error": str(exc)})}
    except psycopg.OperationalError as exc:          # the database went away mid-stream
        log.warning("stream stopped: database error: %s", str(exc).strip().splitlines()[:1])
        yield {"event": "error", "data": _json({"error": DATABASE_GONE})}
    except Exception:
        error_id = uuid.uuid4().hex[:12]
        log.exception("stream failed (error id %s)", error_id)
        yield {"event": "error", "data": _json({"error": internal_error_message(error_id)})}
    finally:
        stream.cancel.set()
    yield {"data": DONE}


def internal_error_message(error_id: str) -> str:
    return f"internal server error (id {error_id}); the server log has the details"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)
