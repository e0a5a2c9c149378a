"""The llama runtime: the GGUF run by llama.cpp itself (llama-cpp-python, the optional `llama` extra).

The reference runtime for GGUF files: whatever llama.cpp computes for the file is what this returns,
float32 logits on the CPU, sampled by hartonomous.sampling like every other runtime. The forward is
driven through llama.cpp's low-level batch API so that logits are computed and copied only for the
rows asked for (the last one after a prompt, the last `keep` after a draft), not for every position.

llama.cpp keeps one KV cache per context, so the caches handed out here are token lists bound to
the model, which tracks the tokens its context holds (sequence 0) and which cache they belong to.
Feeding a cache the context holds appends to it; feeding another one first removes what the two do
not share (`llama_memory_seq_rm`) and feeds the rest of that cache's tokens in the same forward.
Cropping the cache the context holds is the same removal, so speculative rollback costs nothing.
With one sequence there is no tree attention: the runtime verifies chains only (`supports_trees`).

llama.cpp rounds differently in its one-token kernels than in its batched ones: a token fed alone
and the same token fed in a batch give logits that differ about as much as either differs from the
float32 reference (max ~1.1 logits, median ~0.6 per position on SmolLM2), while batched forwards of
any split agree to the last bit. Greedy decoding here is therefore `Llama.generate`'s token for
token, and a chain verified by `extend` may part from it at near-ties.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from hartonomous.errors import UserError
from hartonomous.runtimes.base import RuntimeModel
from hartonomous.threads import machine_threads

MAX_CONTEXT = 8192
BATCH = 512
SEQ = 0


class LlamaCache:
    """The tokens one sequence has fed, in order; their keys and values live in the model's context
    while it holds this cache, and are fed again when another cache has used the context since."""

    def __init__(self, model: "LlamaCppModel"):
        self._model = model
        self.tokens: list[int] = []

    @property
    def length(self) -> int:
        """Number of tokens whose keys/values are cached."""
        return len(self.tokens)

    def reset(self) -> None:
        self._model._truncate(self, 0)

    def crop(self, length: int) -> None:
        """Forget every token after the first `length` (speculative decoding's rollback)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        self._model._truncate(self, length)


def _shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if len(differ) else n


class LlamaCppModel(RuntimeModel):
    """A llama GGUF on llama.cpp (CPU only): the exact model's operations, chains only."""

    runtime = "llama"
    supports_trees = False
    one_sequence = True             # one KV sequence per context: the server runs one generation at a time

    def __init__(self, path: Path | str, tokenizer, description: str = "SmolLM2-135M-Instruct",
                 *, n_ctx: int = MAX_CONTEXT, n_batch: int = BATCH, threads: int | None = None):
        import llama_cpp

        self._lib = llama_cpp
        self.path = Path(path)
        self.tokenizer = tokenizer
        self.use_cache = True
        self.device = torch.device("cpu")
        self.name = description
        self.n_threads = threads or machine_threads()
        try:
            self.llama = llama_cpp.Llama(
                str(self.path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=self.n_threads,
                n_threads_batch=self.n_threads, n_gpu_layers=0, logits_all=False, verbose=False)
        except ValueError as e:
            raise UserError(f"llama.cpp cannot load {self.path}: {e}; check the file or use --runtime torch") from e
        train = self.llama._model.n_ctx_train()      # the file's own context, when it is shorter
        self.n_ctx = min(self.llama.n_ctx(), train) if train > 0 else self.llama.n_ctx()
        self.vocab_size = int(self.llama.n_vocab())
        self._ctx = self.llama._ctx
        self.n_batch = min(n_batch, int(llama_cpp.llama_n_batch(self._ctx.ctx)))   # tokens per llama_decode
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        weakref.finalize(self, llama_cpp.llama_batch_free, self._batch)
        for i in range(n_batch):                   # every token of a batch is in sequence 0
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = SEQ
        self._tokens = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._wants = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        self._held: list[int] = []                # the tokens sequence 0 of the context holds
        self._owner: LlamaCache | None = None     # the cache they are (None: no cache's)
        self._lock = threading.RLock()            # one context: one forward at a time

    def _eos_candidates(self) -> list[int | None]:
        return [int(self.llama.token_eos())]

    def fingerprint(self) -> str:
        return (f"llama|{self.path.name}|{self.path.stat().st_size}|{self._lib.__version__}"
                f"|threads={self.n_threads}")

    def new_cache(self) -> LlamaCache:
        return LlamaCache(self)

    # -- the context's sequence ---------------------------------------------------------------

    def _drop_from(self, position: int) -> None:
        """Remove the context's tokens from `position` on (a KV cell bookkeeping change, no compute)."""
        if position < len(self._held):
            self._ctx.kv_cache_seq_rm(SEQ, position, -1)
            del self._held[position:]

    def _truncate(self, cache: LlamaCache, length: int) -> None:
        with self._lock:
            if self._owner is cache:
                self._drop_from(length)
            del cache.tokens[length:]

    def _forget(self) -> None:
        self._ctx.kv_cache_seq_rm(SEQ, 0, -1)
        self._held.clear()
        self._owner = None

    def _decode(self, ids: list[int], start: int, keep: int) -> torch.Tensor:
        """Feed `ids` at positions start.. after the held tokens; logits (keep, V) of the last rows."""
        n, V = len(ids), self.vocab_size
        out = np.empty((keep, V), dtype=np.float32)
        first_kept = n - keep
        for lo in range(0, n, self.n_batch):
            hi = min(n, lo + self.n_batch)
            m = hi - lo
            self._tokens[:m] = ids[lo:hi]
            self._pos[:m] = np.arange(start + lo, start + hi)
            self._wants[:m] = np.arange(lo, hi) >= first_kept
            self._batch.n_tokens = m
            rc = self._lib.llama_decode(self._ctx.ctx, self._batch)
            if rc != 0:
                self._forget()
                raise RuntimeError(f"llama_decode returned {rc} feeding {m} tokens at position {start + lo}")
            self._held.extend(ids[lo:hi])
            for i in range(max(lo, first_kept), hi):
                row = self._lib.llama_get_logits_ith(self._ctx.ctx, i - lo)
                out[i - first_kept] = np.ctypeslib.as_array(row, shape=(V,))
        return torch.from_numpy(out)

    def _fits(self, total: int) -> None:
        if total > self.n_ctx:
            raise UserError(f"{total} tokens do not fit the llama runtime's context of {self.n_ctx}; "
                            "shorten the prompt or ask for fewer new tokens")

    def _run(self, cache: LlamaCache, ids: Sequence[int], keep: int) -> torch.Tensor:
        """Feed `ids` after `cache`'s tokens, first bringing the context in line with `cache`."""
        if cache._model is not self:
            raise ValueError("this cache belongs to another model; use the model's own new_cache()")
        ids = [int(i) for i in ids]
        with self._lock:
            start = len(cache.tokens) if self._owner is cache else _shared_prefix(self._held, cache.tokens)
            self._fits(len(cache.tokens) + len(ids))
            self._drop_from(start)
            self._owner = None
            refeed = cache.tokens[start:]
            logits = self._decode(refeed + ids, start, keep)
            cache.tokens.extend(ids)
            self._owner = cache
            return logits

    # -- the exact model's operations (hartonomous.runtimes.reference.ExactModel) ----------------------------

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int], cache: LlamaCache) -> torch.Tensor:
        """Run the prompt through the model, filling `cache`; logits (V,) for the next token."""
        self._check(ids)
        cache.reset()
        return self._run(cache, ids, 1)[0]

    @torch.inference_mode()
    def decode_one_token(self, token_id: int, cache: LlamaCache) -> torch.Tensor:
        """Feed one token against the cache; logits (V,) for the token after it."""
        self._check([token_id])
        return self._run(cache, [token_id], 1)[0]

    @torch.inference_mode()
    def extend(self, ids: Sequence[int], cache: LlamaCache, keep: int) -> torch.Tensor:
        """Feed several tokens in one forward; logits (keep, V) after each of the last `keep`."""
        self._check(ids)
        if not 1 <= keep <= len(ids):
            raise ValueError(f"keep must be between 1 and {len(ids)}, got {keep}")
        return self._run(cache, ids, keep)

    def extend_tree(self, pending: Sequence[int], branches: Sequence[Sequence[int]],
                    cache: LlamaCache) -> torch.Tensor:
        raise NotImplementedError("the llama runtime holds one KV sequence and verifies chains only, not "
                                  "draft trees; use extend, or --runtime int4 / torch for trees")

    @torch.inference_mode()
    def full_logits_many(self, ids: Sequence[int], keep: int) -> torch.Tensor:
        """Logits (keep, V) of the last `keep` positions, recomputed from scratch (no cache). The
        context is reused: a cache that held it is fed again on its next use."""
        self._check(ids)
        if not 1 <= keep <= len(ids):
            raise ValueError(f"keep must be between 1 and {len(ids)}, got {keep}")
        self._fits(len(ids))
        with self._lock:
            self._forget()
            return self._decode([int(i) for i in ids], 0, keep)
