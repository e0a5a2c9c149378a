"""A prefix cache for a server: a prompt that begins as a recent one did reuses that prefix's KV cache.

An editor sends the file so far with every keystroke, a chat sends the whole conversation with every
turn: the prompt grows at its end, and a cold prefill recomputes what the last request computed. The
cache keeps, per recent prompt, the keys and values of its whole prefill chunks (the runtime cuts a
prompt at absolute multiples of its `prefill_chunk`, hartonomous.runtimes.int4.prefill_chunks), and a
later prompt that shares a prefix copies the longest shared run of whole chunks into its own cache and
prefills only the rest (`prefill_more`). Because the chunks a warm request computes are the chunks a
cold one computes, on the same inputs, a hit gives the bits a cold prefill gives: the same tokens,
greedily or for a seed. Keys and values of generated tokens are never kept (decoding computes a row
alone, a prompt's chunk computes rows together, and their bits differ).

Bounded in bytes (least recently used entries go first; a prefix longer than the bound is not kept),
safe under concurrent requests: an entry's tensors are written once, when it is stored, and only ever
copied from, so a request that reuses one never changes it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

DEFAULT_MAX_MB = 256


@dataclass(frozen=True)
class _Entry:
    tokens: np.ndarray          # (length,) int64, a multiple of the chunk
    keys: torch.Tensor          # (layers, kv_heads, length, head_dim), never written after it is stored
    values: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes + self.tokens.nbytes


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """Recent prompts' KV prefixes in whole chunks, at most `max_bytes` in all, least recent evicted."""

    def __init__(self, chunk: int, max_bytes: int = DEFAULT_MAX_MB << 20):
        if chunk < 1 or max_bytes < 0:
            raise ValueError("a prefix cache needs a chunk >= 1 and max_bytes >= 0")
        self.chunk = chunk
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, _Entry] = OrderedDict()     # id -> entry, least recent first
        self._next = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self.tokens_reused = 0
        self.bytes = 0

    def lookup(self, ids: Sequence[int]) -> tuple[_Entry | None, int]:
        """The entry sharing the longest run of whole chunks with `ids`, and that length (a multiple of
        the chunk, leaving at least the prompt's last token to compute, whose logits are the answer)."""
        want = np.asarray(ids, dtype=np.int64)
        limit = (len(want) - 1) // self.chunk * self.chunk
        best, best_len = None, 0
        with self._lock:
            if limit > 0:
                for key, entry in self._entries.items():
                    n = min(_shared(entry.tokens, want), limit) // self.chunk * self.chunk
                    if n > best_len:
                        best, best_len, best_key = entry, n, key
            if best is None:
                self.misses += 1
            else:
                self._entries.move_to_end(best_key)
                self.hits += 1
                self.tokens_reused += best_len
        return best, best_len

    def store(self, ids: Sequence[int], keys: torch.Tensor, values: torch.Tensor) -> None:
        """Keep the whole chunks of a prompt just prefilled: `keys`/`values` (layers, kv_heads, >= its
        length, head_dim) are its cache's buffers, copied here. Entries this one extends are dropped."""
        length = len(ids) // self.chunk * self.chunk
        if length == 0:
            return
        tokens = np.asarray(ids[:length], dtype=np.int64)
        size = 2 * keys[:, :, :1].nbytes * length + tokens.nbytes
        if size > self.max_bytes:
            return
        with self._lock:
            for key, entry in list(self._entries.items()):
                shared = _shared(entry.tokens, tokens)
                if shared == length:                          # already kept, as long or longer
                    self._entries.move_to_end(key)
                    return
                if shared == len(entry.tokens):               # a prefix of this one: superseded
                    del self._entries[key]
                    self.bytes -= entry.nbytes
        entry = _Entry(tokens, keys[:, :, :length].clone(), values[:, :, :length].clone())
        with self._lock:
            self._entries[self._next] = entry
            self._next += 1
            self.bytes += entry.nbytes
            while self.bytes > self.max_bytes:
                _, old = self._entries.popitem(last=False)
                self.bytes -= old.nbytes

    def stats(self) -> dict:
        """What /healthz shows: hits, misses, tokens reused, entries, bytes held and the bound."""
        with self._lock:
            return {"chunk": self.chunk, "hits": self.hits, "misses": self.misses,
                    "tokens_reused": self.tokens_reused, "entries": len(self._entries),
                    "bytes": self.bytes, "max_bytes": self.max_bytes}


class PrefixCachedModel:
    """A runtime whose `prefill` consults a PrefixCache; everything else is the runtime's own."""

    def __init__(self, model: Any, cache: PrefixCache):
        self._model = model
        self.prefix_cache = cache

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def prefill(self, ids: Sequence[int], cache: Any) -> torch.Tensor:
        """The runtime's prefill of `ids`, computing only what no recent prompt's whole chunks hold."""
        self._model._check(ids)
        entry, reused = self.prefix_cache.lookup(ids)
        if entry is None:
            logits = self._model.prefill(ids, cache)
        else:
            cache.reset()
            cache.reserve(len(ids))                 # the capacity a cold prefill of ids reserves
            cache.k[:, :, :reused].copy_(entry.keys[:, :, :reused])
            cache.v[:, :, :reused].copy_(entry.values[:, :, :reused])
            cache.length = reused
            logits = self._model.prefill_more(ids[reused:], cache)
        self.prefix_cache.store(ids, cache.k, cache.v)
        return logits


def with_prefix_cache(model: Any, max_mb: int = DEFAULT_MAX_MB) -> Any:
    """`model` with a prefix cache of at most `max_mb` MiB when its runtime can continue a prefill
    from cached chunks (the int4 runtime), else `model` itself (also for max_mb 0)."""
    chunk = getattr(model, "prefill_chunk", None)
    if max_mb <= 0 or chunk is None or not callable(getattr(model, "prefill_more", None)):
        return model
    return PrefixCachedModel(model, PrefixCache(chunk, max_mb << 20))
