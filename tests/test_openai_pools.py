"""The pool sizing rule under concurrent OpenAI streams: a generation never waits for a connection.

A speculative or augmented generation holds one pooled connection for its whole length. Each pool
has as many connections as its executor has threads, so streams beyond the workers wait in line for
a worker, never for a connection (hartonomous/server/runtime.py). Here 16 streams meet two model
workers with two model connections, on a model slowed so that every stream outlasts the pool's
timeout: a stream that waited for another's connection would wait for a whole stream and fail.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack

import httpx
import openai
from server_helpers import WAIT_S, live_app, tiny_exact_model
from test_augmented_path import corpus_set, tiny_dir  # noqa: F401 - fixtures: a set with corpus labels and a gate

STREAMS = 16
WORKERS = 2                # max_concurrent: model workers, and the model pool's connections
POOL_TIMEOUT_S = 0.3       # far shorter than one stream (MAX_TOKENS steps of STEP_S each, at the least)
STEP_S = 0.08
MAX_TOKENS = 6


class SlowModel:
    """The tiny exact model, each forward STEP_S slower: a stream lasts at least MAX_TOKENS * STEP_S."""

    FORWARDS = ("prefill", "decode_one_token", "extend", "extend_tree", "full_logits", "full_logits_many")

    def __init__(self):
        self._model = tiny_exact_model()

    def __getattr__(self, name):
        attr = getattr(self._model, name)
        if name not in self.FORWARDS:
            return attr

        def slow(*args, **kwargs):
            time.sleep(STEP_S)
            return attr(*args, **kwargs)
        return slow


async def _stream(client: openai.AsyncOpenAI, model: str) -> tuple[str | None, int]:
    """One streamed completion: its finish_reason and how many text chunks it had."""
    reason, chunks = None, 0
    stream = await client.completions.create(model=model, prompt="def add(a, b):", max_tokens=MAX_TOKENS,
                                             temperature=0, stream=True)
    async for chunk in stream:
        if chunk.choices:
            chunks += bool(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
    return reason, chunks


async def _all_at_once(url: str, models: list[str]) -> list:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=2 * WAIT_S) as c:
        return await asyncio.gather(*(_stream(c, models[i % len(models)]) for i in range(STREAMS)),
                                    return_exceptions=True)


def test_sixteen_streams_on_two_model_workers_never_wait_for_a_connection(reader_url, corpus_set):
    models = [f"exact:augmented:{corpus_set}", f"exact:speculative:{corpus_set}"]
    # Lookups (each request's model id) get a connection per stream, all opened before the run: under
    # this short timeout 16 lookups could queue past it on fewer, or on a pool still growing.
    server, runtime = live_app(reader_url, corpus_set, exact_model=SlowModel(), pool_size=1,
                               lookup_pool_size=STREAMS, max_concurrent=WORKERS, pool_timeout_s=POOL_TIMEOUT_S)
    with server as url:
        with ExitStack() as held:                   # every connection open before the run: a pool grows one
            for use, count in (("model", WORKERS), ("lookup", STREAMS)):   # at a time, which is not the
                for _ in range(count):                                      # rule tested here
                    held.enter_context(runtime.connection(WAIT_S, use=use))
        before = runtime.pool_stats()["model"]
        results = asyncio.run(_all_at_once(url, models))
        after = httpx.get(url + "/healthz", timeout=WAIT_S).json()["pools"]["model"]
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert all(reason in ("stop", "length") for reason, _ in results), results
    assert sum(chunks for _, chunks in results) > 0
    assert after["max"] == WORKERS and after["open"] == WORKERS
    assert after["requests"] - before["requests"] == STREAMS       # each stream borrowed one connection
    assert after["waited"] == before["waited"] and after["timeouts"] == 0


def test_healthz_reports_each_pools_size_and_use(reader_url, corpus_set):
    server, runtime = live_app(reader_url, corpus_set, pool_size=3, lookup_pool_size=2, max_concurrent=5)
    with server as url:
        with runtime.connection(WAIT_S, use="database"), runtime.connection(WAIT_S, use="model"):
            held = httpx.get(url + "/healthz", timeout=WAIT_S).json()["pools"]
        idle = httpx.get(url + "/healthz", timeout=WAIT_S).json()["pools"]
    assert {name: p["max"] for name, p in held.items()} == {"lookup": 2, "database": 3, "model": 5}
    assert held["database"]["in_use"] == held["model"]["in_use"] == 1
    assert idle["database"]["in_use"] == idle["model"]["in_use"] == 0
    assert idle["lookup"]["requests"] == held["lookup"]["requests"] + 1      # each /healthz borrows a lookup's
    assert all(p["timeouts"] == 0 for p in idle.values())
