"""What the server shares between requests: the connection pool, the exact model, the workers.

psycopg connections are not shared between threads: every spatial request borrows its own
connection from a pool for as long as it generates. The exact model is loaded once (on first
use, or in the background at start-up) and shared; its forward passes are serialised by a lock,
so concurrent generations interleave step by step instead of fighting over the CPU cores.
Work runs in two bounded thread pools, and the event loop never blocks on either: requests that use
the exact model (MODEL_PATHS) run in the model executor and borrow their connection (speculative,
hybrid, augmented) from the model pool; spatial and SQL-only requests run in the database executor on
the database pool. Neither can occupy the other's threads or connections, so database-only work never
waits behind a generation on the model. Each pool has as many connections as its executor has threads
and a worker holds at most one, so a generation never waits for a connection, however many streams are
open (the rest wait in line for a worker). Short lookups (model ids, atom sets, /healthz) borrow from a
small pool of their own, so they never wait behind generations either (docs/server.md: the sizes).
With `remember` on, completed exact and speculative generations (the exact model's words; never
the spatial, hybrid or augmented path's) are written into the atom set's memory (hartonomous/memory.py)
through one writer connection of the owner's, kept apart from the reader pool, and speculative
drafts read that memory, under the sampler settings each set's memory policy admits (by default
greedy and the sampler's defaults: a request at temperature 100 is answered, not remembered; the
response's `memory` says so). `memory_max_atoms` and `memory_policy`, when set, are written as the
bound and the policy of each set's memory before the server writes there; the database enforces both.
With `memory` on and `remember` off, drafts read the memory and nothing is written: a second server on
the same database drafts from what another one remembers, as soon as it is committed (every draft
reads it in SQL; nothing of it is cached in the process).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hartonomous.errors import UserError
from hartonomous.paths import model_paths
from hartonomous.speculative.learned import DraftLearning

log = logging.getLogger("hartonomous.server")

MODEL_PATHS = model_paths()    # the paths that run the exact model (their declarations say so)


class ServiceUnavailable(UserError):
    """The server cannot answer now (database busy or down, model not loadable): HTTP 503."""


@dataclass
class ServerConfig:
    """Server settings; `database_url` defaults to the least-privilege reader role."""

    database_url: str | None = None
    atom_set: str | None = None           # default atom set (the database's default if None)
    model: str | None = None              # exact model: 'smollm2' or a local folder (settings if None)
    device: str | None = None             # auto | cpu | cuda (settings if None)
    dtype: str = "float32"
    runtime: str | None = None            # auto | torch | int4 | llama (settings if None)
    pool_size: int = 4                    # database-only requests at once, each on its own connection
    lookup_pool_size: int = 2             # short lookups at once (model ids, atom sets, /healthz), a pool apart
    pool_timeout_s: float = 30.0          # wait this long for a free connection, then 503
    max_concurrent: int = 8               # requests on the exact model at once (more wait in line), one
                                          # connection each at most, from a pool of their own
    ping_seconds: float = 15.0            # SSE keep-alive comment interval
    preload_exact: bool = False           # load the exact model in the background at start-up
    remember: bool = False                # write completed generations to the set's memory; drafts read it
    memory: bool = False                  # drafts read the sets' memory without writing it (what other
                                          # servers on the database remember, as they remember it)
    memory_max_atoms: int | None = None   # the bound this server sets on each set's memory (None: the sets' own)
    memory_weight: float | None = None    # a remembered atom's weight (None: the set's history_weight)
    memory_policy: Any = None             # the sampler policy this server sets on each set's memory
                                          # (a hartonomous.memory.MemoryPolicy; None: the sets' own)
    writer_url: str | None = None         # the memory writer's (owner) connection; None: the owner's default
    prefix_cache_mb: int = 256            # recent prompts' KV prefixes kept for reuse, MiB (0: none);
                                          # hartonomous.runtimes.prefix_cache
    threads: int | None = None            # torch threads for the forwards (None: all cores less the busy
                                          # neighbours, chosen before each prompt; runtimes.threads)


class SharedModel:
    """An ExactModel whose forward passes take a lock; everything else is passed through. With a
    ThreadPolicy, each prompt's prefill first sets the thread count the generation runs with."""

    def __init__(self, model: Any, threads: Any = None):
        self._model = model
        self._lock = threading.Lock()
        self.threads = threads

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def prefill(self, *args, **kwargs):
        with self._lock:
            if self.threads is not None:
                self.threads.apply()
            return self._model.prefill(*args, **kwargs)

    def decode_one_token(self, *args, **kwargs):
        with self._lock:
            return self._model.decode_one_token(*args, **kwargs)

    def full_logits(self, *args, **kwargs):
        with self._lock:
            return self._model.full_logits(*args, **kwargs)

    def extend(self, *args, **kwargs):          # speculative verification
        with self._lock:
            return self._model.extend(*args, **kwargs)

    def full_logits_many(self, *args, **kwargs):
        with self._lock:
            return self._model.full_logits_many(*args, **kwargs)

    def extend_tree(self, *args, **kwargs):     # speculative verification of a draft tree
        with self._lock:
            return self._model.extend_tree(*args, **kwargs)


class Runtime:
    """Shared resources of one server; `open()` before use, `close()` at shutdown."""

    def __init__(self, config: ServerConfig | None = None, *, exact_model: Any = None,
                 spatial_tokenizer: Any = None):
        self.config = config or ServerConfig()
        self.spatial_tokenizer = spatial_tokenizer
        self._exact = self._shared(exact_model) if exact_model is not None else None
        self._exact_given = exact_model is not None    # then config.model (if set) names it
        self._exact_error: str | None = None
        self._exact_lock = threading.Lock()
        self.pool = None                                    # database-only work (the database executor's)
        self.model_pool = None                              # the connections of requests on the model
        self.lookup_pool = None                             # short lookups: model ids, /healthz, /api/atom_sets
        self.database_executor: ThreadPoolExecutor | None = None
        self.model_executor: ThreadPoolExecutor | None = None
        self.active: dict[int, Any] = {}                    # id(session) -> running Session
        self.finished: deque = deque(maxlen=100)            # recent GenerationResults
        self.memory_writer = None                           # a MemoryWriter when config.remember
        self._registry_lock = threading.Lock()
        self._one_sequence = threading.Lock()               # generations on a runtime with one KV sequence
        self.draft_learning = DraftLearning()               # what speculative requests learned, for the next ones

    # -- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        """Create the pools (connecting in the background) and the worker threads."""
        from psycopg_pool import ConnectionPool

        if self._needs_transformers():
            _warm_imports()

        url = self.config.database_url
        if url is None:
            from hartonomous.db.connection import reader_url

            url = reader_url()
        database, model = max(1, self.config.pool_size), max(1, self.config.max_concurrent)
        options = dict(open=False, kwargs={"autocommit": True, "connect_timeout": 10},
                       check=ConnectionPool.check_connection)
        lookup = max(1, self.config.lookup_pool_size)
        # As many connections as threads that hold one: no worker ever waits for a connection.
        self.pool = ConnectionPool(url, min_size=0, max_size=database, name="hartonomous-database", **options)
        self.model_pool = ConnectionPool(url, min_size=0, max_size=model, name="hartonomous-model", **options)
        self.lookup_pool = ConnectionPool(url, min_size=1, max_size=lookup, name="hartonomous-lookup", **options)
        for pool in self._pools().values():
            pool.open(wait=False)
        if self.config.remember:
            from hartonomous.memory import MemoryWriter

            self.memory_writer = MemoryWriter(self.config.writer_url, max_atoms=self.config.memory_max_atoms,
                                              weight=self.config.memory_weight, policy=self.config.memory_policy)
        self.database_executor = ThreadPoolExecutor(max_workers=database, thread_name_prefix="hartonomous-database")
        self.model_executor = ThreadPoolExecutor(max_workers=model, thread_name_prefix="hartonomous-model")
        if self.config.preload_exact and self._exact is None:
            self.model_executor.submit(self._preload)

    def close(self) -> None:
        with self._registry_lock:
            running = list(self.active.values())
        for session in running:
            session.cancel()
        for executor in (self.model_executor, self.database_executor):
            if executor is not None:
                executor.shutdown(wait=True, cancel_futures=True)
        for pool in self._pools().values():
            pool.close()
        if self.memory_writer is not None:
            self.memory_writer.close()

    @property
    def reads_memory(self) -> bool:
        """Whether speculative drafts and the augmented store read the sets' memory: with `memory`, or
        `remember` (a server reads what it writes)."""
        return self.config.memory or self.memory_writer is not None

    # -- resources -----------------------------------------------------------------------

    def executor_for(self, path: str) -> Executor:
        """The executor of a request on `path`: the model's for MODEL_PATHS, else the database's."""
        executor = self.model_executor if path in MODEL_PATHS else self.database_executor
        if executor is None:
            raise RuntimeError("Runtime.open() was not called")
        return executor

    def _pools(self) -> dict[str, Any]:
        pools = {"model": self.model_pool, "database": self.pool, "lookup": self.lookup_pool}
        return {name: pool for name, pool in pools.items() if pool is not None}

    def pool_stats(self) -> dict[str, dict]:
        """Each pool's size and what its borrowers met since start-up: connections open and in use,
        requests, how many waited and for how long in all, and how many timed out (a 503). GET /healthz
        reports it; benchmarks/openai_load.py reads it before and after a run."""
        out = {}
        for name, pool in self._pools().items():
            s = pool.get_stats()
            out[name] = {"max": s.get("pool_max", 0), "open": s.get("pool_size", 0),
                         "in_use": s.get("pool_size", 0) - s.get("pool_available", 0),
                         "requests": s.get("requests_num", 0), "waited": s.get("requests_queued", 0),
                         "wait_ms": s.get("requests_wait_ms", 0), "timeouts": s.get("requests_errors", 0)}
        return out

    @contextmanager
    def connection(self, timeout: float | None = None, *, use: str = "lookup") -> Iterator[Any]:
        """A pooled connection for this thread only: `use` "lookup" (a short query), "database" (a
        database worker's generation) or "model" (a model worker's); 503 when none frees up in time."""
        from psycopg_pool import PoolTimeout

        if self.lookup_pool is None:
            raise RuntimeError("Runtime.open() was not called")
        pool = self._pools()[use]
        try:
            conn = pool.getconn(timeout=self.config.pool_timeout_s if timeout is None else timeout)
        except PoolTimeout as exc:
            raise ServiceUnavailable("the database is busy or unreachable; try again shortly, and check "
                                     "GET /healthz") from exc
        try:
            yield conn
        finally:
            pool.putconn(conn)

    def exact_model(self) -> SharedModel:
        """The exact model, loaded once (callers wait while another thread loads it)."""
        if self._exact is not None:
            return self._exact
        with self._exact_lock:
            if self._exact is None:
                from hartonomous.config import get_settings
                from hartonomous.runtimes import load_exact_model

                settings = get_settings()
                name = self.config.model or settings.model
                log.info("loading the exact model %s", name)
                try:
                    model = load_exact_model(self.config.runtime or settings.runtime, name,
                                             self.config.device or settings.device, self.config.dtype)
                    self._exact = self._shared(model)
                except Exception as exc:
                    self._exact_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    raise ServiceUnavailable(f"the exact model '{name}' could not be loaded "
                                             f"({self._exact_error}); the spatial path still works") from exc
                self._exact_error = None
                log.info("exact model loaded on the %s runtime", model.runtime)
        return self._exact

    def _shared(self, model: Any) -> SharedModel:
        """The exact model behind the forwards' lock, with this server's thread policy and its prefix
        cache where the runtime can use one."""
        from hartonomous.runtimes.prefix_cache import with_prefix_cache
        from hartonomous.runtimes.threads import ThreadPolicy

        return SharedModel(with_prefix_cache(model, self.config.prefix_cache_mb), ThreadPolicy(self.config.threads))

    def prefix_cache_stats(self) -> dict | None:
        """The prefix cache's hits, misses and bytes (None before the model loads or without one)."""
        cache = getattr(self._exact, "prefix_cache", None) if self._exact is not None else None
        return cache.stats() if cache is not None else None

    def exact_model_key(self) -> str | None:
        """The exact model's load name ('smollm2' or a folder), which the augmented path checks atom
        sets against: the one this server loads, or config.model beside a handed-in model (else None)."""
        if self._exact_given:
            return self.config.model
        from hartonomous.config import get_settings

        return self.config.model or get_settings().model

    def _needs_transformers(self) -> bool:
        """Whether this server loads anything through transformers (then its lazy imports are resolved
        once, before the workers start): not for SmolLM2 on the int4 or llama runtime, whose generation
        path never imports it (docs/runtimes.md)."""
        from hartonomous.config import get_settings
        from hartonomous.model import SMOLLM2, pick_device
        from hartonomous.runtimes import resolve_runtime

        settings = get_settings()
        model = self.config.model or settings.model
        if self._exact is not None or model != SMOLLM2:
            return True
        try:
            runtime = resolve_runtime(self.config.runtime or settings.runtime,
                                      pick_device(self.config.device or settings.device), model, self.config.dtype)
        except UserError:
            return True
        return runtime == "torch"

    @contextmanager
    def _exclusive(self, model: Any) -> Iterator[None]:
        """One generation at a time on a runtime with a single KV sequence (llama.cpp): interleaved
        requests would re-feed each other's contexts, and the re-fed keys come from other kernels."""
        if model is not None and getattr(model, "one_sequence", False):
            with self._one_sequence:
                yield
        else:
            yield

    def exact_status(self) -> str:
        if self._exact is not None:
            forward = getattr(self._exact, "forward_kind", None)      # the int4 runtime: native or python
            return f"loaded ({getattr(self._exact, 'runtime', 'torch')} runtime{f', {forward} forward' if forward else ''})"
        if self._exact_lock.locked():
            return "loading"
        return f"failed: {self._exact_error}" if self._exact_error else "not loaded (loads on first use)"

    def _preload(self) -> None:
        try:
            model = self.exact_model()
            prepare = getattr(model, "prepare_prefill", None)   # the int4 runtime's unpacked weights
            if callable(prepare):
                prepare()
        except Exception:
            log.warning("could not preload the exact model: %s", self._exact_error)

    @contextmanager
    def engine(self, path: str, options: Any = None, atom_set: str | None = None, *,
               in_database: bool = False) -> Iterator[Any]:
        """The engine of one request on `path`, built by its declaration (hartonomous.paths) with
        `options` (a PathOptions; None: the defaults) over its own pooled connection (a path on an
        atom set), the shared model (a path on the exact model), or both."""
        from contextlib import ExitStack

        from hartonomous.paths import declaration
        from hartonomous.paths.context import PathResources, build_engine

        declared = declaration(path)
        exact = self.exact_model() if declared.uses_model else None
        resources = dict(options=options, atom_set=atom_set or self.config.atom_set, exact_model=exact,
                         memory=self.reads_memory, draft_learning=self.draft_learning)
        with self._exclusive(exact), ExitStack() as stack:
            if declared.needs_atom_set:    # the exact path's risk source connects only when asked for signals
                conn = stack.enter_context(self.connection(use="model" if exact is not None else "database"))
                resources.update(connection=conn, spatial_tokenizer=self.spatial_tokenizer,
                                 model=self.exact_model_key() if exact is not None else None)
            shared = PathResources(**resources)
            stack.callback(shared.close)
            engine = build_engine(path, shared, in_database=in_database, writer=self.memory_writer)
            stack.callback(engine.close)
            yield engine

    # -- bookkeeping ---------------------------------------------------------------------

    @contextmanager
    def tracking(self, session: Any) -> Iterator[None]:
        """Register a running session; log and remember its result when it ends."""
        with self._registry_lock:
            self.active[id(session)] = session
        try:
            yield
        finally:
            with self._registry_lock:
                self.active.pop(id(session), None)
            result = session.result
            if result is not None:
                self.finished.append(result)
                log.info("generation path=%s tokens=%d state=%s reason=%s", result.path, len(result.token_ids),
                         result.state.value, result.finish_reason)


def _warm_imports() -> None:
    """Resolve transformers' lazy attributes once, on this thread, before the workers start.

    Two threads touching `transformers.AutoTokenizer` for the first time at once (a request and
    the model preload) can make one of them fail with ImportError.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedTokenizerFast  # noqa: F401
