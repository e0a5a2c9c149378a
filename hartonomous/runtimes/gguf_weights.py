"""A llama-architecture GGUF file read into NumPy arrays, without transformers.

The `gguf` package (llama.cpp's own reader) maps the file; this module turns its blocks into what a
forward needs: the hyper-parameters from the metadata, F32 tensors as they are, Q4_1 tensors as
their 4-bit codes with one scale and one minimum per 32 weights, Q8_0 tensors as int8 codes with
one scale per 32. Dequantising is left to the caller, so a runtime can keep the codes (the int4
runtime packs them for torch's int4 kernel) or widen them.

Block layouts (ggml-common.h): Q4_1 is f16 d, f16 m, then 16 bytes whose low nibbles are weights
0..15 and high nibbles weights 16..31, weight = d * q + m; Q8_0 is f16 d then 32 int8, weight = d * q.

The Q and K projections of a llama GGUF are stored permuted for ggml's rotary embedding, which
rotates adjacent pairs (x[2i], x[2i+1]); a forward over these weights must rotate the same way
(hartonomous.runtimes.int4 does), and then every attention score equals the original model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hartonomous.errors import UserError

BLOCK = 32


@dataclass(frozen=True)
class LlamaConfig:
    """The hyper-parameters a llama forward needs, read from the GGUF metadata."""

    layers: int
    dim: int
    hidden: int
    heads: int
    kv_heads: int
    vocab_size: int
    rope_base: float
    norm_eps: float
    context_length: int
    bos_token_id: int | None
    eos_token_id: int | None

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


@dataclass(frozen=True)
class Q4_1:
    """4-bit codes (N, K) uint8 in 0..15 with per-32 scales d and minima m (N, K/32), float32."""

    codes: np.ndarray
    d: np.ndarray
    m: np.ndarray

    def dequantize(self) -> np.ndarray:
        n, k = self.codes.shape
        blocks = self.codes.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
        return (blocks * self.d[..., None] + self.m[..., None]).reshape(n, k)


@dataclass(frozen=True)
class Q8_0:
    """int8 codes (N, K) with per-32 scales d (N, K/32), float32."""

    codes: np.ndarray
    d: np.ndarray

    def dequantize(self) -> np.ndarray:
        n, k = self.codes.shape
        blocks = self.codes.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
        return (blocks * self.d[..., None]).reshape(n, k)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., start:start + 2]).view(np.float16)[..., 0].astype(np.float32)


def decode_q4_1(raw: np.ndarray) -> Q4_1:
    """Q4_1 rows (N, K/32 * 20 bytes) into codes, scales and minima."""
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, 20)
    qs = blocks[..., 4:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(n, -1)
    return Q4_1(np.ascontiguousarray(codes), _f16(blocks, 0), _f16(blocks, 2))


def decode_q8_0(raw: np.ndarray) -> Q8_0:
    """Q8_0 rows (N, K/32 * 34 bytes) into int8 codes and scales."""
    n = raw.shape[0]
    blocks = raw.reshape(n, -1, 34)
    codes = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(n, -1)
    return Q8_0(codes, _f16(blocks, 0))


class GGUFWeights:
    """The tensors and hyper-parameters of one llama GGUF file."""

    def __init__(self, path: Path):
        from gguf import GGUFReader

        self.path = Path(path)
        self._reader = GGUFReader(str(self.path))
        self._tensors = {t.name: t for t in self._reader.tensors}
        arch = self._field("general.architecture")
        if arch != "llama":
            raise UserError(f"{self.path.name} is a '{arch}' model; the int4 runtime runs llama GGUF files only "
                            "(use --runtime torch)")
        self.config = self._config()

    def _field(self, key: str, default=None):
        field = self._reader.fields.get(key)
        return default if field is None else field.contents()

    def _config(self) -> LlamaConfig:
        embd = self._tensors["token_embd.weight"]
        return LlamaConfig(
            layers=int(self._field("llama.block_count")), dim=int(self._field("llama.embedding_length")),
            hidden=int(self._field("llama.feed_forward_length")),
            heads=int(self._field("llama.attention.head_count")),
            kv_heads=int(self._field("llama.attention.head_count_kv", self._field("llama.attention.head_count"))),
            vocab_size=int(embd.shape[1]), rope_base=float(self._field("llama.rope.freq_base", 10000.0)),
            norm_eps=float(self._field("llama.attention.layer_norm_rms_epsilon")),
            context_length=int(self._field("llama.context_length", 2048)),
            bos_token_id=self._field("tokenizer.ggml.bos_token_id"),
            eos_token_id=self._field("tokenizer.ggml.eos_token_id"))

    def has(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> np.ndarray | Q4_1 | Q8_0:
        """One tensor by its GGUF name: float32 array, Q4_1 or Q8_0."""
        from gguf import GGMLQuantizationType as Q

        t = self._tensors[name]
        raw = np.asarray(t.data)
        if t.tensor_type == Q.F32:
            return raw.astype(np.float32)
        if t.tensor_type == Q.F16:
            return raw.astype(np.float32)
        if t.tensor_type == Q.Q4_1:
            return decode_q4_1(raw)
        if t.tensor_type == Q.Q8_0:
            return decode_q8_0(raw)
        raise UserError(f"{self.path.name}: tensor {name} is {t.tensor_type.name}; the int4 runtime reads "
                        "F32, F16, Q4_1 and Q8_0 (use --runtime torch)")
