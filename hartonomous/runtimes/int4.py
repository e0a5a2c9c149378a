"""The int4 runtime: SmolLM2's GGUF run on torch's int4 weight-only kernel, bfloat16 activations.

A compact llama forward in the style of gpt-fast (no transformers import): the Q4_1 projections are
packed for `torch._weight_int4pack_mm_for_cpu` exactly (a Q4_1 weight d*q + m is the kernel's
(q - 8)*scale + zero with scale = d, zero = m + 8d), the Q8_0 tied embedding/head is two int4
matmuls of the high and low nibbles of its codes offset by 128 (exact as well), the norms, rotary
embedding, attention and residual stream stay in float32, and only the matmul inputs and outputs are
bfloat16. The kernel wants bfloat16 activations to be fast, so this runtime is the GGUF's model to
within bfloat16 rounding, not float32 arithmetic: docs/runtimes.md measures how often that changes
the argmax against the float32 reference (hartonomous.exact).

The KV cache is static (grown by doubling, cropped by moving its length), so speculative rollback
costs nothing, and a tree of drafts is verified in one forward with explicit positions. Attention
runs one row at a time over the keys that row sees, and every other operation computes each row
alone, so a token's logits are bitwise the same whether it is decoded alone or verified in a chain
or a tree: speculative greedy output on this runtime is its own one-token greedy output.
On CPUs without AVX-512 BF16 the same code runs (bfloat16 is emulated, correctly but slowly); the
default runtime is then the float32 one (hartonomous.runtimes.default_runtime).
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
from hartonomous.runtimes.gguf_weights import BLOCK, GGUFWeights, LlamaConfig, Q4_1, Q8_0

PREPARED_VERSION = 3                      # 3: the cache file records its content's CRC-32
INNER_K_TILES = 2
ACT = torch.bfloat16

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
        new_k, new_v = torch.zeros(shape), torch.zeros(shape)
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


class Int4Model(RuntimeModel):
    """SmolLM2 (any llama GGUF with Q4_1 projections and a Q8_0 head) on the int4 kernel."""

    runtime = "int4"

    def __init__(self, weights: Int4Weights, tokenizer, description: str = "SmolLM2-135M-Instruct"):
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

    def _rope_table(self, length: int) -> torch.Tensor:
        angles = torch.outer(torch.arange(length, dtype=torch.float64), self._inv_freq)
        return torch.polar(torch.ones_like(angles), angles).to(torch.complex64)   # (length, head_dim/2)

    def _eos_candidates(self) -> list[int | None]:
        return [self.config.eos_token_id]

    def fingerprint(self) -> str:
        c = self.config
        return f"int4|{c.layers}x{c.dim}x{c.hidden}|{c.heads}/{c.kv_heads}|{c.vocab_size}|{torch.__version__}"

    def new_cache(self) -> StaticKVCache:
        return StaticKVCache(self.config)

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
        cache.reserve(n)
        start = cache.length
        end = start + n
        pos = torch.arange(start, end) if positions is None else torch.tensor(positions)
        top = int(pos.max()) + 1
        if top > self._rope.shape[0]:
            self._rope = self._rope_table(max(top, 2 * self._rope.shape[0]))
        rot = self._rope[pos][:, None, :]                       # (n, 1, hd/2)
        visible = self._visible_keys(start, n, allowed)
        hd, nq, nkv = c.head_dim, c.heads, c.kv_heads
        x = w.embed(torch.as_tensor(list(ids), dtype=torch.long))
        q_end, k_end = nq * hd, (nq + nkv) * hd
        dim, eps, hidden = (c.dim,), c.norm_eps, c.hidden
        for i, layer in enumerate(w.layers):
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

    # -- the exact model's operations (hartonomous.exact.ExactModel) ------------------------------

    def prefill(self, ids: Sequence[int], cache: StaticKVCache) -> torch.Tensor:
        self._check(ids)
        cache.reset()
        return self._forward(ids, cache, None, None, 1)[0]

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
