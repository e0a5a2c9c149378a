"""A live uvicorn server on a free loopback port, in a thread, for the HTTP and browser tests."""

from __future__ import annotations

import threading
import time

import uvicorn

from hartonomous.runtimes.reference import ExactModel
from hartonomous.server import Runtime, ServerConfig, create_app
from tiny_model import tiny_model, tiny_tokenizer

WAIT_S = 30          # generous deadlines for things that must happen; never asserted as timings


class LiveServer:
    """`with LiveServer(app) as url:` serves `app` on 127.0.0.1 (the OS picks the port)."""

    def __init__(self, app):
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", log_config=None,
                                lifespan="on", timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True, name="test-uvicorn")

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start; see the log above")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def tiny_exact_model(model=None) -> ExactModel:
    """The tiny random Llama as the exact path's model (no download)."""
    tiny, tokenizer = tiny_model(0)
    return ExactModel(model or tiny, tokenizer)


def tiny_runtime(database_url: str, atom_set: str, exact_model=None, **config) -> Runtime:
    """A Runtime over the test database with the tiny model and tokenizer on both paths."""
    return Runtime(ServerConfig(database_url=database_url, atom_set=atom_set, **config),
                   exact_model=exact_model or tiny_exact_model(), spatial_tokenizer=tiny_tokenizer())


def live_app(database_url: str, atom_set: str, exact_model=None, **config) -> tuple[LiveServer, Runtime]:
    runtime = tiny_runtime(database_url, atom_set, exact_model, **config)
    return LiveServer(create_app(runtime)), runtime


class GatedModel:
    """The tiny exact model, but each decode step waits for a permit from the test."""

    def __init__(self):
        self._model = tiny_exact_model()
        self.permits = threading.Semaphore(0)
        self.decoded = 0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def decode_one_token(self, *args, **kwargs):
        if not self.permits.acquire(timeout=WAIT_S):
            raise RuntimeError("the test never released this step")
        self.decoded += 1
        return self._model.decode_one_token(*args, **kwargs)
