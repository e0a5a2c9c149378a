"""The int4 runtime: SmolLM2's GGUF run on torch's int4 weight-only kernel, bfloat16 activations.

A compact llama forward in the style of gpt-fast (no transformers import): the Q4_1 projections are
packed for `torch._weight_int4pack_mm_for_cpu` exactly (a Q4_1 weight d*q + m is the kernel's
(q - 8)*scale + zero with scale = d, zero = m + 8d), the Q8_0 tied embedding/head is two int4
matmuls of the high and low nibbles of its codes offset by 128 (exact as well), the norms, rotary
embedding, attention and residual stream stay in float32, and only the matmul inputs and outputs are
bfloat16. The kernel wants bfloat16 activations to be fast, so this runtime is the GGUF's model to
within bfloat16 rounding, not float32 arithmetic: docs/runtimes.md measures how often that changes
the argmax against the float32 reference (hartonomous.runtimes.reference).

The KV cache is static (grown by doubling, cropped by moving its length), so speculative rollback
costs nothing, and a tree of drafts is verified in one forward with explicit positions. Attention
runs one row at a time over the keys that row sees, and every other operation computes each row
alone, so a token's logits are bitwise the same whether it is decoded alone or verified in a chain
or a tree: speculative greedy output on this runtime is its own one-token greedy output.
The prompt is the exception, since only its last row gives logits: `prefill` cuts it at absolute
multiples of `prefill_chunk` and computes each chunk's rows together (batched attention, matmuls on
the weights unpacked to bfloat16), so a prompt continued from its cached whole chunks
(hartonomous.runtimes.prefix_cache) gives the bits of the same prompt prefilled cold.
On CPUs without AVX-512 BF16 the same code runs (bfloat16 is emulated, correctly but slowly); the
default runtime is then the float32 one (hartonomous.runtimes.default_runtime).

Two forwards compute this: the native one (hartonomous/runtimes/native/int4_forward.cpp, one call per
forward, everything between the matmuls compiled; built by `make install-native`) where it is built,
else the Python one below. HARTONOMOUS_INT4_FORWARD=python (or `forward="python"`) forces the
Python one; docs/runtimes.md measures both.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hartonomous.runtimes.base import RuntimeModel
from hartonomous.runtimes.cancel import cancel_check
from hartonomous.runtimes.gguf_weights import BLOCK, GGUFWeights, LlamaConfig, Q4_1, Q8_0

PREPARED_VERSION = 3                      # 3: the cache file records its content's CRC-32
INNER_K_TILES = 2
ACT = torch.bfloat16
PREFILL_CHUNK = 128      # a prompt is computed in chunks of positions [128j, 128(j+1)): docs/runtimes.md
EXACT_ROWS = 32          # a chunk of fewer rows is computed as decoding computes it (row-exact)
FORWARD_ENV = "HARTONOMOUS_INT4_FORWARD"     # auto (native where built) | native | python
FORWARDS = ("auto", "native", "python")

log = logging.getLogger("hartonomous.runtimes.int4")


class Int4Linear:
    """y = x @ W.T for W held as 4-bit codes, one bfloat16 scale and zero per 32 weights of a row."""

    def __init__(self, packed: torch.Tensor, scales_zeros: torch.Tensor):
        self.packed = packed
        self.scales_zeros = scales_zeros

    @classmethod
    def from_codes(cls, codes: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> "Int4Linear":
        """codes (N, K) in 0..15; the weight is (code - 8) * scale + zero, scale and zero (N, K/32)."""
        packed = torch._convert_weight_to_int4pack_for_cpu(torch.from_numpy(codes.astype(np.int32)), INNER_K_TILES)
        sz = np.stack([scale.T, zero.T], axis=-1)          # (K/32, N, 2), the kernel's layout
        return cls(packed, torch.from_numpy(np.ascontiguousarray(sz)).to(ACT))

    @classmethod
    def from_q4_1(cls, q: Q4_1) -> "Int4Linear":
        return cls.from_codes(q.codes, q.d, q.m + 8 * q.d)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int4pack_mm_for_cpu(x, self.packed, BLOCK, self.scales_zeros)

    def dense(self) -> torch.Tensor:
        """The weight (N, K) in bfloat16, unpacked once: the prompt's matmuls run on it, where the
        int4 kernel costs as much per row for 256 rows as for one (docs/runtimes.md)."""
        weight = getattr(self, "_dense", None)
        if weight is None:
            n = self.packed.shape[0]
            k = self.scales_zeros.shape[0] * BLOCK
            if n % 64 == 0 and self.packed.shape == (n, k // 2):
                # the CPU packing: per 64 rows and per column, byte j holds row j (low) and row 32+j (high)
                blocks = self.packed.reshape(n // 64, k, 32)
                codes = torch.cat([blocks & 0x0F, blocks >> 4], dim=2).permute(0, 2, 1).reshape(n, k)
                sz = self.scales_zeros.float()                         # (K/32, N, 2)
                scale = sz[..., 0].T.repeat_interleave(BLOCK, dim=1)
                zero = sz[..., 1].T.repeat_interleave(BLOCK, dim=1)
                weight = ((codes.float() - 8) * scale + zero).to(ACT)
            else:                                                      # another layout: ask the kernel itself
                weight = self(torch.eye(k, dtype=ACT)).T.contiguous()
            self._dense = weight
        return weight

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """y = x @ W.T for a chunk of prompt rows, on the unpacked weight."""
        return F.linear(x, self.dense())

    def state(self) -> dict:
        return {"packed": self.packed, "scales_zeros": self.scales_zeros}


class Q8Head:
    """The Q8_0 matrix (V, d) as two int4 matmuls: code + 128 = 16*hi + lo, so
    d*code = (hi - 8)*16d + (lo - 8)*d + 8d, exact in the codes (the scales are rounded to bfloat16)."""

    def __init__(self, hi: Int4Linear, lo: Int4Linear):
        self.hi, self.lo = hi, lo

    @classmethod
    def from_q8_0(cls, q: Q8_0) -> "Q8Head":
        u = q.codes.astype(np.int16) + 128
        hi, lo = (u >> 4).astype(np.int32), (u & 0x0F).astype(np.int32)
        return cls(Int4Linear.from_codes(hi, 16 * q.d, np.zeros_like(q.d)),
                   Int4Linear.from_codes(lo, q.d, 8 * q.d))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.hi(x).float() + self.lo(x).float()


def prefill_chunks(start: int, end: int, chunk: int = PREFILL_CHUNK) -> list[tuple[int, int]]:
    """Positions start..end cut at the multiples of `chunk`: the same cut whatever was cached before,
    so a prompt continued from a cache of k*chunk tokens computes the chunks a cold prefill computes."""
    cuts, at = [], start
    while at < end:
        stop = min((at // chunk + 1) * chunk, end)
        cuts.append((at, stop))
        at = stop
    return cuts


def _concat_q4_1(parts: Sequence[Q4_1]) -> Q4_1:
    return Q4_1(np.concatenate([p.codes for p in parts]), np.concatenate([p.d for p in parts]),
                np.concatenate([p.m for p in parts]))


class Int4Weights:
    """Every tensor of the forward, prepared: fused QKV and gate/up projections, norms, head."""

    def __init__(self, config: LlamaConfig, tensors: dict[str, torch.Tensor]):
        self.config = config
        self.tensors = tensors
        self.layers = []
        for i in range(config.layers):
            self.layers.append({
                "attn_norm": tensors[f"{i}.attn_norm"], "ffn_norm": tensors[f"{i}.ffn_norm"],
                "qkv": Int4Linear(tensors[f"{i}.qkv.packed"], tensors[f"{i}.qkv.scales_zeros"]),
                "out": Int4Linear(tensors[f"{i}.out.packed"], tensors[f"{i}.out.scales_zeros"]),
                "gate_up": Int4Linear(tensors[f"{i}.gate_up.packed"], tensors[f"{i}.gate_up.scales_zeros"]),
                "down": Int4Linear(tensors[f"{i}.down.packed"], tensors[f"{i}.down.scales_zeros"]),
            })
        self.norm = tensors["norm"]
        self.head = Q8Head(Int4Linear(tensors["head.hi.packed"], tensors["head.hi.scales_zeros"]),
                           Int4Linear(tensors["head.lo.packed"], tensors["head.lo.scales_zeros"]))
        self.embed_codes = tensors["embed.codes"]        # (V, d) int8
        self.embed_scales = tensors["embed.scales"]      # (V, d/32) float32

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        codes = self.embed_codes[ids].float().view(len(ids), -1, BLOCK)
        return (codes * self.embed_scales[ids][..., None]).view(len(ids), -1)

    @classmethod
    def from_gguf(cls, gguf: GGUFWeights) -> "Int4Weights":
        c = gguf.config
        t: dict[str, torch.Tensor] = {}

        from hartonomous.errors import UserError

        def put(name: str, linear: Int4Linear) -> None:
            t[f"{name}.packed"], t[f"{name}.scales_zeros"] = linear.packed, linear.scales_zeros

        def q4_1(name: str) -> Q4_1:
            """A projection the kernel can pack: Q4_1 codes, rows in multiples of 16."""
            tensor = gguf.tensor(name)
            if not isinstance(tensor, Q4_1) or tensor.codes.shape[0] % 16:
                raise UserError(f"{gguf.path.name}: tensor {name} is not Q4_1 with a multiple of 16 rows, which the "
                                "int4 runtime needs; use --runtime torch")
            return tensor

        for i in range(c.layers):
            b = f"blk.{i}."
            t[f"{i}.attn_norm"] = torch.from_numpy(gguf.tensor(b + "attn_norm.weight"))
            t[f"{i}.ffn_norm"] = torch.from_numpy(gguf.tensor(b + "ffn_norm.weight"))
            put(f"{i}.qkv", Int4Linear.from_q4_1(_concat_q4_1([q4_1(b + f"attn_{x}.weight") for x in "qkv"])))
            put(f"{i}.out", Int4Linear.from_q4_1(q4_1(b + "attn_output.weight")))
            put(f"{i}.gate_up", Int4Linear.from_q4_1(_concat_q4_1([q4_1(b + "ffn_gate.weight"),
                                                                   q4_1(b + "ffn_up.weight")])))
            put(f"{i}.down", Int4Linear.from_q4_1(q4_1(b + "ffn_down.weight")))
        t["norm"] = torch.from_numpy(gguf.tensor("output_norm.weight"))
        embed = gguf.tensor("token_embd.weight")
        head = gguf.tensor("output.weight") if gguf.has("output.weight") else embed
        if not isinstance(embed, Q8_0) or not isinstance(head, Q8_0) or head.codes.shape[0] % 16:
            raise UserError(f"{gguf.path.name}: the int4 runtime expects a Q8_0 embedding and head, with a multiple of "
                            "16 tokens; use --runtime torch")
        q8 = Q8Head.from_q8_0(head)
        put("head.hi", q8.hi)
        put("head.lo", q8.lo)
        t["embed.codes"] = torch.from_numpy(embed.codes)
        t["embed.scales"] = torch.from_numpy(embed.d)
        return cls(c, t)


def prepared_path(gguf_path: Path, home: Path) -> Path:
    """Where the packed weights of `gguf_path` are cached: keyed by the SHA-256 of the file's bytes (a
    replacement of the same name, size and mtime is another key), the torch version (the packed layout
    is the kernel's) and this module's layout version."""
    from hartonomous.model import file_sha256

    key = f"{file_sha256(gguf_path)}|{torch.__version__}|{PREPARED_VERSION}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(home).expanduser().absolute() / "cache" / "runtimes" / f"int4-{gguf_path.stem}-{digest}.pt"


def _content_crc32(config: dict, tensors: dict[str, torch.Tensor]) -> int:
    """CRC-32 over the configuration and every tensor's name, type, shape and bytes: what a cache file
    records of itself, so that a damaged or truncated one is never taken for the weights. A check
    against damage, not tampering (whoever can write the home can write what the process loads), so
    CRC-32 (0.03 s for SmolLM2's 134 MB) rather than SHA-256 (0.11 s), which keys the GGUF's content."""
    crc = zlib.crc32(json.dumps(config, sort_keys=True).encode())
    for name in sorted(tensors):
        tensor = tensors[name]
        crc = zlib.crc32(f"\n{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode(), crc)
        crc = zlib.crc32(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data, crc)
    return crc


def _read_prepared(target: Path) -> Int4Weights | None:
    """The cached weights when the file is whole and its CRC-32 matches, else None. The file is read
    into memory, not mapped: a cache truncated or rewritten while a process runs on it cannot fault it."""
    if not target.exists():
        return None
    try:
        saved = torch.load(target, weights_only=True)
        if saved.get("crc32") != _content_crc32(saved["config"], saved["tensors"]):
            raise ValueError("its content does not match its CRC-32")
        return Int4Weights(LlamaConfig(**saved["config"]), saved["tensors"])
    except Exception as exc:  # noqa: BLE001 - any damage means: prepare again from the GGUF
        log.warning("the packed-weight cache %s is unusable (%s: %s); preparing the weights again",
                    target, type(exc).__name__, exc)
        return None


def _save_prepared(target: Path, weights: Int4Weights) -> None:
    """Cache the packed weights (atomically). Caching is an optimisation: any failure (a read-only home,
    a full disk, which torch.save reports as RuntimeError) is logged and the load goes on."""
    import dataclasses

    config = dataclasses.asdict(weights.config)
    tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"config": config, "tensors": weights.tensors,
                    "crc32": _content_crc32(config, weights.tensors)}, tmp)
        tmp.replace(target)
    except Exception as exc:  # noqa: BLE001 - the weights are prepared; only their cache failed
        log.warning("could not cache the packed weights in %s (%s: %s); the next start prepares them again",
                    target, type(exc).__name__, exc)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def load_int4_weights(gguf_path: Path, home: Path | None) -> Int4Weights:
    """The prepared weights: read from the cache when it is whole and of this file's content, else packed
    from the GGUF (~5 s) and cached (a home that cannot take the cache only costs the packing on every
    start)."""
    target = prepared_path(gguf_path, home) if home is not None else None
    if target is not None and (cached := _read_prepared(target)) is not None:
        return cached
    weights = Int4Weights.from_gguf(GGUFWeights(gguf_path))
    if target is not None:
        _save_prepared(target, weights)
    return weights


class StaticKVCache:
    """Keys and values of every layer in preallocated float32 buffers; `length` slots are valid."""

    def __init__(self, config: LlamaConfig, capacity: int = 512):
        self._config = config
        self.length = 0
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        c = self._config
        shape = (c.layers, c.kv_heads, capacity, c.head_dim)
        new_k, new_v = torch.empty(shape), torch.empty(shape)      # a slot is read only once written
        if getattr(self, "k", None) is not None and self.length:
            new_k[:, :, :self.length] = self.k[:, :, :self.length]
            new_v[:, :, :self.length] = self.v[:, :, :self.length]
        self.k, self.v, self.capacity = new_k, new_v, capacity

    def reserve(self, extra: int) -> None:
        """Room for `extra` more tokens (doubling the buffers when needed)."""
        need = self.length + extra
        if need > self.capacity:
            capacity = self.capacity
            while capacity < need:
                capacity *= 2
            self._allocate(capacity)

    def reset(self) -> None:
        self.length = 0

    def crop(self, length: int) -> None:
        """Forget every token after the first `length` (speculative decoding's rollback)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} tokens to {length}")
        self.length = length


_said_python = False


def native_forward(weights: Int4Weights, choice: str | None = None):
    """The native forward over `weights` (hartonomous.runtimes.native_build), or None for the Python one:
    `choice` (else HARTONOMOUS_INT4_FORWARD, else auto) 'python' asks for it, 'native' insists (a
    UserError where it is not built), 'auto' takes the native one where it is built and says once in
    the log when it is not."""
    global _said_python
    from hartonomous.errors import UserError

    choice = (choice or os.environ.get(FORWARD_ENV) or "auto").lower()
    if choice not in FORWARDS:
        raise UserError(f"{FORWARD_ENV} must be one of {', '.join(FORWARDS)}, got '{choice}'")
    if choice == "python":
        return None
    from hartonomous.runtimes.native_build import load

    module = load()
    c = weights.config
    fits = c.dim % 32 == 0 and c.hidden % 16 == 0 and c.head_dim in (32, 64, 128) and c.heads % c.kv_heads == 0
    if module is None or not fits:
        why = ("it is not built here (make install-native)" if module is None else
               f"it needs a dim in multiples of 32, a hidden size in multiples of 16 and a head_dim of 32, 64 or "
               f"128 (this model: {c.dim}, {c.hidden}, {c.head_dim})")
        if choice == "native":
            raise UserError(f"the native int4 forward is unavailable: {why}; unset {FORWARD_ENV} for the Python one")
        if not _said_python:
            log.info("the int4 runtime runs its Python forward: the native one %s", why)
            _said_python = True
        return None
    w = weights
    flat = []
    for layer in w.layers:
        flat += [layer["attn_norm"].float().contiguous(), layer["ffn_norm"].float().contiguous()]
        for name in ("qkv", "out", "gate_up", "down"):
            flat += [layer[name].packed, layer[name].scales_zeros]
    return module.Forward(c.dim, c.hidden, c.heads, c.kv_heads, float(c.norm_eps), flat, w.norm.float().contiguous(),
                          w.head.hi.packed, w.head.hi.scales_zeros, w.head.lo.packed, w.head.lo.scales_zeros,
                          w.embed_codes.contiguous(), w.embed_scales.float().contiguous())


def _cancelled(check) -> None:
    """Stop a Python forward between layers when the generation's cancel is set."""
    if check is not None and check():
        from hartonomous.backends.base import Cancelled

        raise Cancelled()


class Int4Model(RuntimeModel):
    """SmolLM2 (any llama GGUF with Q4_1 projections and a Q8_0 head) on the int4 kernel."""

    runtime = "int4"

    def __init__(self, weights: Int4Weights, tokenizer, description: str = "SmolLM2-135M-Instruct",
                 forward: str | None = None):
        self.weights = weights
        self.config = weights.config
        self.tokenizer = tokenizer
        self.use_cache = True
        self.device = torch.device("cpu")
        self.vocab_size = weights.config.vocab_size
        self.name = description
        c = self.config
        inv = 1.0 / (c.rope_base ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        self._inv_freq = inv
        self._rope = self._rope_table(4096)
        self.prefill_chunk = PREFILL_CHUNK          # where a prompt is cut (prefill_chunks)
        self.native = native_forward(weights, forward)

    @property
    def forward_kind(self) -> str:
        """Which forward runs: 'native' (compiled, one call per forward) or 'python'."""
        return "native" if self.native is not None else "python"

    def _rope_upto(self, top: int) -> None:
        if top > self._rope.shape[0]:
            self._rope = self._rope_table(max(top, 2 * self._rope.shape[0]))

    def _rope_table(self, length: int) -> torch.Tensor:
        angles = torch.outer(torch.arange(length, dtype=torch.float64), self._inv_freq)
        return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)   # (length, head_dim/2)

    def _eos_candidates(self) -> list[int | None]:
        return [self.config.eos_token_id]

    def fingerprint(self) -> str:
        c = self.config
        return (f"int4|{c.layers}x{c.dim}x{c.hidden}|{c.heads}/{c.kv_heads}|{c.vocab_size}|{torch.__version__}"
                + ("|native" if self.native is not None else ""))

    def new_cache(self) -> StaticKVCache:
        return StaticKVCache(self.config)

    def context_limit(self) -> int:
        """The model's context in tokens (the GGUF's): positions beyond it are refused."""
        return self.config.context_length

    def _check_room(self, end: int) -> None:
        if end > self.config.context_length:
            from hartonomous.errors import UserError

            raise UserError(f"this model's context is {self.config.context_length} tokens and this forward would "
                            f"reach {end}; shorten the prompt or ask for fewer new tokens")

    # -- the forward ---------------------------------------------------------------------------

    @staticmethod
    def _visible_keys(start: int, n: int, allowed: torch.Tensor | None) -> list:
        """Per fed row, the cache slots it attends to: a slice for a chain (a prefix of the cache), an
        index tensor for a tree row (its own branch after the shared prefix).

        Attention runs one row at a time over exactly these keys, as one-token decoding does: every other
        operation of the forward computes each row alone (the int4 matmul is bitwise the same for 1 row or
        16), so a token's logits do not depend on what else is in the forward. Verifying a draft then gives
        bit for bit the logits decoding would, and speculative greedy output is the runtime's own (batched
        attention would differ in the last bits and flip near-ties)."""
        if allowed is None:
            return [slice(0, start + r + 1) for r in range(n)]
        rows = []
        for r in range(n):
            seen = allowed[r].nonzero().flatten()
            count = len(seen)
            rows.append(slice(0, count) if int(seen[-1]) == count - 1 else seen)
        return rows

    @torch.inference_mode()
    def _forward(self, ids: Sequence[int], cache: StaticKVCache, positions: list[int] | None,
                 allowed: torch.Tensor | None, keep: int | None) -> torch.Tensor:
        """Feed `ids` into cache slots length..length+n; logits (keep or n, V) float32 of the last rows.

        `positions` default to the slots; `allowed` (n, length+n) bool defaults to causal."""
        c, w = self.config, self.weights
        n = len(ids)
        start = cache.length
        end = start + n
        self._check_room(end)
        cache.reserve(n)
        pos = torch.arange(start, end) if positions is None else torch.tensor(positions)
        self._rope_upto(int(pos.max()) + 1)
        check = cancel_check()
        if self.native is not None:
            logits = self._native_call(self.native.rows, torch.as_tensor(list(ids), dtype=torch.long), cache.k,
                                       cache.v, start, pos, allowed, torch.view_as_real(self._rope),
                                       n if keep is None else keep, check)
            cache.length = end
            return logits
        rot = self._rope[pos][:, None, :]                       # (n, 1, hd/2)
        visible = self._visible_keys(start, n, allowed)
        hd, nq, nkv = c.head_dim, c.heads, c.kv_heads
        x = w.embed(torch.as_tensor(list(ids), dtype=torch.long))
        q_end, k_end = nq * hd, (nq + nkv) * hd
        dim, eps, hidden = (c.dim,), c.norm_eps, c.hidden
        for i, layer in enumerate(w.layers):
            _cancelled(check)
            qkv = layer["qkv"](F.rms_norm(x, dim, layer["attn_norm"], eps).to(ACT)).float()
            qk = torch.view_as_real(torch.view_as_complex(qkv[:, :k_end].view(n, nq + nkv, hd // 2, 2)) * rot)
            keys, values = cache.k[i:i + 1], cache.v[i:i + 1]
            keys[0].narrow(1, start, n).copy_(qk[:, nq:].view(n, nkv, hd).transpose(0, 1))
            values[0].narrow(1, start, n).copy_(qkv[:, k_end:].view(n, nkv, hd).transpose(0, 1))
            q = qk[:, :nq].view(n, nq, hd).transpose(0, 1)[None]          # (1, nq, n, hd)
            rows = [F.scaled_dot_product_attention(q[:, :, r:r + 1], keys[:, :, seen], values[:, :, seen],
                                                   enable_gqa=True) for r, seen in enumerate(visible)]
            attn = rows[0] if n == 1 else torch.cat(rows, 2)
            x += layer["out"](attn[0].transpose(0, 1).reshape(n, q_end).to(ACT))
            gate, up = layer["gate_up"](F.rms_norm(x, dim, layer["ffn_norm"], eps).to(ACT)).split(hidden, dim=-1)
            x += layer["down"](F.silu(gate) * up)
        cache.length = end
        last = x if keep is None else x[n - keep:]
        return w.head(F.rms_norm(last, dim, w.norm, eps).to(ACT))

    def _native_call(self, method, *args) -> torch.Tensor:
        """A native forward; its cancel becomes the engine's Cancelled."""
        try:
            return method(*args)
        except self._native_cancelled:
            from hartonomous.backends.base import Cancelled

            raise Cancelled() from None

    @property
    def _native_cancelled(self) -> type[BaseException]:
        from hartonomous.runtimes.native_build import load

        return load().Cancelled

    # -- the prompt: chunks of batched attention ----------------------------------------------

    @torch.inference_mode()
    def _forward_chunks(self, ids: Sequence[int], cache: StaticKVCache,
                        chunks: list[tuple[int, int]]) -> torch.Tensor:
        """Feed consecutive prompt chunks (absolute positions, starting at cache.length), layer by layer
        (each layer's unpacked weight is read once for all of them): a chunk's rows attend in one
        batched call to the keys before them and to each other (causally), its matmuls run on the
        bfloat16 weight. Every operation depends only on the chunk's own rows and the cache before
        it, so a chunk gives the same bits whenever it is computed. Returns the logits (V,) after the
        last row."""
        c, w = self.config, self.weights
        start, end = chunks[0][0], chunks[-1][1]
        check = cancel_check()
        if self.native is not None:
            dense = [layer[name].dense() for layer in w.layers for name in ("qkv", "out", "gate_up", "down")]
            logits = self._native_call(self.native.chunks, torch.as_tensor(list(ids), dtype=torch.long), cache.k,
                                       cache.v, [chunks[0][0]] + [e for _, e in chunks],
                                       torch.view_as_real(self._rope), dense, check)
            cache.length = end
            return logits
        hd, nq, nkv = c.head_dim, c.heads, c.kv_heads
        q_end, k_end = nq * hd, (nq + nkv) * hd
        dim, eps, hidden = (c.dim,), c.norm_eps, c.hidden
        x = w.embed(torch.as_tensor(list(ids), dtype=torch.long))
        rot = self._rope[start:end][:, None, :]
        masks = [torch.arange(e)[None, :] <= torch.arange(s, e)[:, None] for s, e in chunks]
        for i, layer in enumerate(w.layers):
            for (s, e), mask in zip(chunks, masks):
                _cancelled(check)
                n, xs, r = e - s, x[s - start:e - start], rot[s - start:e - start]
                qkv = layer["qkv"].rows(F.rms_norm(xs, dim, layer["attn_norm"], eps).to(ACT)).float()
                qk = torch.view_as_real(torch.view_as_complex(qkv[:, :k_end].view(n, nq + nkv, hd // 2, 2)) * r)
                cache.k[i].narrow(1, s, n).copy_(qk[:, nq:].view(n, nkv, hd).transpose(0, 1))
                cache.v[i].narrow(1, s, n).copy_(qkv[:, k_end:].view(n, nkv, hd).transpose(0, 1))
                q = qk[:, :nq].view(n, nq, hd).transpose(0, 1)[None]          # (1, nq, n, hd)
                # contiguous: the same bits whatever the cache's capacity (a warm cache's may differ)
                keys, values = cache.k[i:i + 1, :, :e].contiguous(), cache.v[i:i + 1, :, :e].contiguous()
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
                xs += layer["out"].rows(attn[0].transpose(0, 1).reshape(n, q_end).to(ACT))
                gate, up = layer["gate_up"].rows(F.rms_norm(xs, dim, layer["ffn_norm"], eps).to(ACT)).split(hidden, -1)
                xs += layer["down"].rows(F.silu(gate) * up)
        cache.length = end
        return w.head(F.rms_norm(x[-1:], dim, w.norm, eps).to(ACT))[0]

    def _prefill_rows(self, ids: Sequence[int], cache: StaticKVCache) -> torch.Tensor:
        """Feed the prompt's `ids` after the cache's tokens; the logits (V,) after the last.

        The prompt is cut at absolute multiples of `prefill_chunk` (prefill_chunks). A chunk of at
        least EXACT_ROWS rows is batched (_forward_chunks): its rows differ from decoded ones in the
        last bits, which nothing compares, since only the prompt's last row gives logits. A shorter
        chunk is computed as decoding computes it (_forward), so a short prompt's rows are the bits
        of decoding it token by token. The cut and the choice depend on positions alone, so a prompt
        continued from a cached prefix of whole chunks gives the bits of the same prompt cold."""
        start = cache.length
        end = start + len(ids)
        self._check_room(end)
        cache.reserve(len(ids))
        self._rope_upto(end)
        logits, batch = None, []

        def flush() -> None:
            nonlocal logits
            if batch:
                logits = self._forward_chunks(ids[batch[0][0] - start:batch[-1][1] - start], cache, list(batch))
                batch.clear()

        for s, e in prefill_chunks(start, end, self.prefill_chunk):
            if e - s >= EXACT_ROWS:
                batch.append((s, e))
                continue
            flush()
            logits = self._forward(ids[s - start:e - start], cache, None, None, 1)[0]
        flush()
        return logits

    # -- the exact model's operations (hartonomous.runtimes.reference.ExactModel) ------------------------------

    def prepare_prefill(self) -> None:
        """Unpack every layer's weights for the prompt's matmuls now (about 0.7 s on one thread, 212 MB
        for SmolLM2) rather than in the first prompt of EXACT_ROWS tokens or more (a server's preload)."""
        for layer in self.weights.layers:
            for name in ("qkv", "out", "gate_up", "down"):
                layer[name].dense()

    def prefill(self, ids: Sequence[int], cache: StaticKVCache) -> torch.Tensor:
        """The logits after the prompt `ids`, fed into an emptied cache (_prefill_rows)."""
        self._check(ids)
        cache.reset()
        return self._prefill_rows(ids, cache)

    def prefill_more(self, ids: Sequence[int], cache: StaticKVCache) -> torch.Tensor:
        """The logits after a prompt whose first cache.length tokens are cached and `ids` follow: the
        bits of prefill(cached + ids) when the cache holds whole chunks a prefill computed
        (hartonomous.runtimes.prefix_cache)."""
        self._check(ids)
        return self._prefill_rows(ids, cache)

    def decode_one_token(self, token_id: int, cache: StaticKVCache) -> torch.Tensor:
        self._check([token_id])
        return self._forward([token_id], cache, None, None, 1)[0]

    def extend(self, ids: Sequence[int], cache: StaticKVCache, keep: int) -> torch.Tensor:
        self._check(ids)
        if not 1 <= keep <= len(ids):
            raise ValueError(f"keep must be between 1 and {len(ids)}, got {keep}")
        return self._forward(ids, cache, None, None, keep)

    def extend_tree(self, pending: Sequence[int], branches: Sequence[Sequence[int]],
                    cache: StaticKVCache) -> torch.Tensor:
        flat = list(pending) + [t for branch in branches for t in branch]
        self._check(flat)
        allowed, positions = self.tree_layout(cache.length, len(pending), [len(b) for b in branches])
        return self._forward(flat, cache, positions, allowed, None)

    def full_logits_many(self, ids: Sequence[int], keep: int) -> torch.Tensor:
        self._check(ids)
        if not 1 <= keep <= len(ids):
            raise ValueError(f"keep must be between 1 and {len(ids)}, got {keep}")
        return self._forward(ids, StaticKVCache(self.config, max(16, len(ids))), None, None, keep)
