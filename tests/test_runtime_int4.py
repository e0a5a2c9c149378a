"""The int4 runtime: a GGUF's Q4_1/Q8_0 codes on torch's int4 kernel, bfloat16 activations.

The kernels reproduce every quantised weight exactly (only the bfloat16 scales and the bfloat16
inputs and outputs round); the decoders read the file as llama.cpp's own reader does; the static KV
cache grows, crops and resets without losing a key; a token's logits do not depend on what else is
in the forward, so cached, extended, rolled-back and tree-shaped forwards give the bits of a
forward from scratch and speculative verification decides what step-by-step decoding decides; on
code it picks the float32 reference's token everywhere but at near-ties of the reference; and on a
tiny random llama GGUF it computes what transformers computes from the same file.

Measured on AMD EPYC (2 cores, one torch thread): against the float32 reference on 300 positions
of code, top-1 agreement 0.983, median |Δ logit| 0.057, max 0.96, every divergence at a reference
top-2 gap below 0.19; the tiny model against transformers, max |Δ| 1.5e-2 of the largest logit.
"""

from __future__ import annotations

import inspect
import json.decoder
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hartonomous.errors import UserError
from hartonomous.runtimes.gguf_weights import GGUFWeights, Q4_1, Q8_0, decode_q4_1, decode_q8_0
from hartonomous.runtimes.int4 import Int4Linear, Int4Model, Int4Weights, Q8Head, StaticKVCache, load_int4_weights

BF16_UNIT = 2.0 ** -8                 # bfloat16's unit roundoff (8 significant bits)
KERNEL_REL = 1e-2                     # a bfloat16 matmul's error, relative to the output's scale (measured <= 3.7e-3)
SIBLING_SEEN = 2.0                    # mean |Δ logit| of a sibling seen through a causal mask (measured >= 8.7)
NEAR_TIE = 0.5                        # a top-2 logit gap of the reference that bfloat16 rounding may reorder
AGREEMENT, MEDIAN_DELTA, POSITIONS = 0.93, 0.15, 300
PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py


def top2_gap(logits: torch.Tensor) -> torch.Tensor:
    top = logits.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


def assert_same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    """`a` and `b` are logits of the same tokens after the same context from different forwards
    (one token or many, a chain or a tree): the runtime computes every row alone, so they are equal
    to the bit (a batched attention would differ in the last bits and flip near-ties)."""
    assert a.shape == b.shape and a.dtype == b.dtype == torch.float32
    assert torch.equal(a, b), f"max |Δ| {float((a - b).abs().max())}"


# -- the kernels, on synthetic codes -----------------------------------------------------------------

N, K = 96, 256          # the kernel packs rows in multiples of 16 and reads blocks of 32


def random_q4_1(rng: np.random.Generator, d: np.ndarray | None = None, m: np.ndarray | None = None) -> Q4_1:
    shape = (N, K // 32)
    return Q4_1(rng.integers(0, 16, (N, K)).astype(np.uint8),
                rng.uniform(1e-3, 2e-2, shape).astype(np.float32) if d is None else d,
                rng.uniform(-0.15, 0.0, shape).astype(np.float32) if m is None else m)


def random_q8_0(rng: np.random.Generator, d: np.ndarray | None = None) -> Q8_0:
    codes = rng.integers(-128, 128, (N, K)).astype(np.int8)
    codes[0], codes[1] = -128, 127          # the ends of the nibble split: hi and lo both 0, both 15
    return Q8_0(codes, rng.uniform(1e-3, 2e-2, (N, K // 32)).astype(np.float32) if d is None else d)


def exact_product(x: torch.Tensor, weight: np.ndarray) -> torch.Tensor:
    return x.double() @ torch.from_numpy(weight).double().T


def test_int4_linear_is_the_dequantised_q4_1_product_within_bfloat16_rounding():
    rng = np.random.default_rng(0)
    q = random_q4_1(rng)
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    y = Int4Linear.from_q4_1(q)(x)
    assert y.shape == (5, N) and y.dtype == torch.bfloat16
    ref = exact_product(x, q.dequantize())
    assert float((y.double() - ref).abs().max()) <= KERNEL_REL * float(ref.abs().max())


def test_int4_linear_reproduces_every_q4_1_weight_exactly():
    """With a scale and minimum that bfloat16 holds exactly, the identity's product is the weight
    matrix itself, to the bit: (q - 8) * d + (m + 8d) is d * q + m for every code."""
    rng = np.random.default_rng(1)
    q = random_q4_1(rng, d=np.full((N, K // 32), 2.0 ** -6, np.float32), m=np.full((N, K // 32), -0.125, np.float32))
    identity = torch.eye(K, dtype=torch.bfloat16)
    got = Int4Linear.from_q4_1(q)(identity).T
    assert torch.equal(got.double(), torch.from_numpy(q.dequantize()).double())
    small = torch.from_numpy(rng.integers(-3, 4, (5, K)).astype(np.float32)).to(torch.bfloat16)
    assert torch.equal(Int4Linear.from_q4_1(q)(small), exact_product(small, q.dequantize()).to(torch.bfloat16))


def test_q8_head_is_the_dequantised_q8_0_product_within_bfloat16_rounding():
    rng = np.random.default_rng(2)
    q = random_q8_0(rng)
    x = torch.randn(5, K, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    y = Q8Head.from_q8_0(q)(x)
    assert y.shape == (5, N) and y.dtype == torch.float32
    ref = exact_product(x, q.dequantize())
    assert float((y.double() - ref).abs().max()) <= KERNEL_REL * float(ref.abs().max())
    edge = ref[:, :2]                       # the all -128 and all 127 rows
    assert float((y[:, :2].double() - edge).abs().max()) <= KERNEL_REL * float(edge.abs().max())


def test_the_nibble_split_reproduces_every_q8_0_weight_exactly():
    """code + 128 = 16 hi + lo: with a scale bfloat16 holds exactly, the head's product with the
    identity is the weight matrix to the bit, codes -128 and 127 included; with small integer inputs
    each half is its exact product rounded once to bfloat16, so the sum is within two roundings."""
    rng = np.random.default_rng(3)
    q = random_q8_0(rng, d=np.full((N, K // 32), 2.0 ** -7, np.float32))
    head = Q8Head.from_q8_0(q)
    got = head(torch.eye(K, dtype=torch.bfloat16)).T
    assert torch.equal(got.double(), torch.from_numpy(q.dequantize()).double())
    assert float(got[0].min()) == float(got[0].max()) == -128 * 2.0 ** -7
    assert float(got[1].min()) == float(got[1].max()) == 127 * 2.0 ** -7
    x = torch.from_numpy(rng.integers(-3, 4, (5, K)).astype(np.float32)).to(torch.bfloat16)
    u = q.codes.astype(np.int64) + 128
    d = np.repeat(q.d, 32, axis=1).astype(np.float64)
    hi, lo = exact_product(x, ((u >> 4) - 8) * 16 * d), exact_product(x, (u & 15) * d)
    assert torch.equal(head.hi(x), hi.to(torch.bfloat16)) and torch.equal(head.lo(x), lo.to(torch.bfloat16))
    bound = BF16_UNIT * (hi.abs() + lo.abs())
    assert bool(((head(x).double() - exact_product(x, q.dequantize())).abs() <= bound).all())


def smollm2_gguf() -> Path:
    from hartonomous.model import resolve_source
    from optional_parts import require_smollm2

    require_smollm2()                     # only the wheel's absence skips (fails under CI)
    source = resolve_source("smollm2")
    assert source.gguf_file is not None, source    # the wheel is a GGUF
    return source.directory / source.gguf_file


@pytest.fixture(scope="module")
def smollm2_reader():
    from gguf import GGUFReader

    return GGUFReader(str(smollm2_gguf()))


@pytest.mark.parametrize("kind, decode", [("Q4_1", decode_q4_1), ("Q8_0", decode_q8_0)])
def test_decoders_agree_with_the_gguf_readers_dequantize_on_the_real_file(smollm2_reader, kind, decode):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType[kind]
    tensor = next(t for t in smollm2_reader.tensors if t.tensor_type == qtype)
    raw = np.asarray(tensor.data)[:256]
    assert np.array_equal(decode(raw).dequantize(), dequantize(raw, qtype))


# -- a tiny random llama GGUF (the same forward, seconds faster) ---------------------------------------

DIM, HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB = 64, 128, 2, 1, 2, 256


def write_tiny_gguf(path: Path, seed: int = 0, embedding: str = "Q8_0", projections: str = "Q4_1",
                    arch: str = "llama", vocab: int = VOCAB, token_format: str = "<{}>") -> Path:
    """Random weights of a 2-layer llama in a GGUF as llama.cpp writes one: Q4_1 projections, a Q8_0
    tied embedding/head, F32 norms, and the tokenizer metadata transformers reads the vocabulary and a
    tokenizer from (token i is `token_format.format(i)`)."""
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(2048)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(DIM // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([token_format.format(i) for i in range(vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_scores([0.0] * vocab)
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def weight(name: str, rows: int, cols: int, kind: Q, scale: float) -> None:
        x = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        if kind in (Q.F32, Q.F16):
            w.add_tensor(name, x.astype(np.float32 if kind == Q.F32 else np.float16))
        else:
            w.add_tensor(name, quantize(x, kind), raw_dtype=kind)

    def norm(name: str) -> None:
        w.add_tensor(name, (1 + 0.1 * rng.standard_normal(DIM)).astype(np.float32))

    head_dim = DIM // HEADS
    weight("token_embd.weight", vocab, DIM, Q[embedding], 1.0)
    projection = Q[projections]
    norm("output_norm.weight")
    for i in range(LAYERS):
        b = f"blk.{i}."
        norm(b + "attn_norm.weight")
        norm(b + "ffn_norm.weight")
        weight(b + "attn_q.weight", HEADS * head_dim, DIM, projection, 2 / DIM ** 0.5)
        weight(b + "attn_k.weight", KV_HEADS * head_dim, DIM, projection, 2 / DIM ** 0.5)
        weight(b + "attn_v.weight", KV_HEADS * head_dim, DIM, projection, 1 / DIM ** 0.5)
        weight(b + "attn_output.weight", DIM, DIM, projection, 1 / DIM ** 0.5)
        weight(b + "ffn_gate.weight", HIDDEN, DIM, projection, 1 / DIM ** 0.5)
        weight(b + "ffn_up.weight", HIDDEN, DIM, projection, 1 / DIM ** 0.5)
        weight(b + "ffn_down.weight", DIM, HIDDEN, projection, 1 / HIDDEN ** 0.5)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def tiny(tiny_gguf) -> Int4Model:
    return Int4Model(Int4Weights.from_gguf(GGUFWeights(tiny_gguf)), tokenizer=None, description="tiny")


def random_ids(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, n).tolist()


def assert_tiny_rounding(a: torch.Tensor, b: torch.Tensor) -> None:
    """The tiny model's logits (std ~8, max ~60) of the same positions from forwards of different
    batch shapes or arithmetic: within bfloat16 rounding of the logits' scale."""
    assert a.shape == b.shape
    diff = (a - b).abs()
    assert float(diff.max()) <= 0.03 * float(b.abs().max())
    assert float(diff.median()) <= 0.015 * float(b.std())
    picks_b_at_a = b.gather(-1, a.argmax(-1, keepdim=True))[..., 0]
    assert bool((picks_b_at_a >= b.max(-1).values - 2 * diff.max(-1).values).all())


def test_the_gguf_metadata_is_read_as_written(tiny):
    c = tiny.config
    assert (c.layers, c.dim, c.hidden, c.heads, c.kv_heads) == (LAYERS, DIM, HIDDEN, HEADS, KV_HEADS)
    assert (c.vocab_size, c.head_dim, c.rope_base, c.context_length) == (VOCAB, DIM // HEADS, 1e4, 2048)
    assert (c.bos_token_id, c.eos_token_id) == (1, 2)
    assert c.norm_eps == pytest.approx(1e-5)
    assert tiny.vocab_size == VOCAB and tiny.eos_token_ids() == {2} and tiny.runtime == "int4"


@pytest.mark.parametrize("options, message", [
    ({"embedding": "F32"}, "expects a Q8_0 embedding and head.*--runtime torch"),
    ({"vocab": 200}, "multiple of 16 tokens; use --runtime torch"),            # the kernel packs rows by 16
    ({"projections": "F16"}, "blk.0.attn_q.weight is not Q4_1.*--runtime torch"),
    ({"projections": "Q8_0"}, "blk.0.attn_q.weight is not Q4_1.*--runtime torch"),
])
def test_files_the_runtime_cannot_run_are_refused_with_what_to_do(tmp_path, options, message):
    path = write_tiny_gguf(tmp_path / "other.gguf", **options)
    with pytest.raises(UserError, match=message):
        Int4Weights.from_gguf(GGUFWeights(path))


def test_other_architectures_are_refused_with_what_to_do(tmp_path):
    other = write_tiny_gguf(tmp_path / "qwen.gguf", arch="qwen2")
    with pytest.raises(UserError, match="'qwen2' model.*--runtime torch"):
        GGUFWeights(other)


def test_bad_input_is_refused(tiny):
    cache = tiny.new_cache()
    with pytest.raises(UserError, match="empty"):
        tiny.prefill([], cache)
    with pytest.raises(UserError, match=f"token id {VOCAB} is outside"):
        tiny.prefill([1, VOCAB], cache)
    tiny.prefill([1, 2, 3], cache)
    for keep in (0, 3):
        with pytest.raises(ValueError, match="keep must be between 1 and 2"):
            tiny.extend([4, 5], cache, keep)
    with pytest.raises(ValueError, match="keep must be between 1 and 2"):
        tiny.full_logits_many([4, 5], 3)


def test_prepared_weights_are_cached_on_disk_and_a_damaged_cache_is_prepared_again(tiny_gguf, tmp_path):
    ids = random_ids(5, 20)
    fresh = Int4Model(load_int4_weights(tiny_gguf, tmp_path), None).full_logits_many(ids, 20)
    cached = list((tmp_path / "cache" / "runtimes").glob("int4-tiny-*.pt"))
    assert len(cached) == 1
    assert torch.equal(Int4Model(load_int4_weights(tiny_gguf, tmp_path), None).full_logits_many(ids, 20), fresh)
    cached[0].write_bytes(b"not a torch file")
    assert torch.equal(Int4Model(load_int4_weights(tiny_gguf, tmp_path), None).full_logits_many(ids, 20), fresh)
    assert cached[0].stat().st_size > 1000          # prepared and written again


# -- the static KV cache -----------------------------------------------------------------------------

def test_crop_refuses_lengths_outside_the_cache(tiny):
    cache = tiny.new_cache()
    tiny.prefill(random_ids(1, 6), cache)
    for bad in (-1, 7):
        with pytest.raises(ValueError, match=f"cannot crop a cache of 6 tokens to {bad}"):
            cache.crop(bad)
    assert cache.length == 6
    cache.crop(6)
    cache.crop(0)
    assert cache.length == 0


def test_growth_beyond_the_initial_capacity_keeps_every_earlier_key(tiny):
    ids = random_ids(9, 650)
    cache = tiny.new_cache()
    assert cache.capacity == 512
    rows = [tiny.extend(ids[:300], cache, 300), tiny.extend(ids[300:500], cache, 200)]
    keys, values = cache.k[:, :, :500].clone(), cache.v[:, :, :500].clone()
    rows.append(tiny.extend(ids[500:600], cache, 100))            # past 512: the buffers double
    assert cache.capacity == 1024 and cache.length == 600
    assert torch.equal(cache.k[:, :, :500], keys) and torch.equal(cache.v[:, :, :500], values)
    rows.append(tiny.extend(ids[600:], cache, 50))
    assert_same_bits(torch.cat(rows), tiny.full_logits_many(ids, 650))
    big = StaticKVCache(tiny.config, 4)
    big.reserve(1000)
    assert big.capacity == 1024 and big.length == 0


def test_reset_forgets_every_token(tiny):
    first, second = random_ids(2, 12), random_ids(3, 7)
    cache = tiny.new_cache()
    tiny.prefill(first, cache)
    tiny.decode_one_token(4, cache)
    cache.reset()
    assert cache.length == 0
    assert torch.equal(tiny.extend(second, cache, 7), tiny.extend(second, tiny.new_cache(), 7))
    assert torch.equal(tiny.prefill(first, cache), tiny.prefill(first, tiny.new_cache()))   # prefill resets too
    assert cache.length == len(first)


# -- transformers' own load of the same GGUF -----------------------------------------------------------

def test_the_tiny_gguf_computes_what_transformers_computes_from_it(tiny, tiny_gguf):
    """transformers dequantises the file and undoes llama.cpp's Q/K permutation; the int4 runtime
    keeps the permuted weights and rotates adjacent pairs: the same attention scores, so the logits
    agree within bfloat16 rounding (measured: max 1.5e-2 of the largest logit, median 6e-3 of their std)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name, dtype=torch.float32)
    assert hf.config.vocab_size == VOCAB and hf.config.tie_word_embeddings
    hf.eval()
    for seed, n in ((10, 1), (11, 7), (12, 40), (13, 120)):
        ids = random_ids(seed, n)
        with torch.inference_mode():
            expected = hf(torch.tensor([ids])).logits[0].float()
        assert_tiny_rounding(tiny.full_logits_many(ids, n), expected)
    cache, ids = tiny.new_cache(), random_ids(14, 30)
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0].float()
    got = [tiny.prefill(ids[:20], cache)] + [tiny.decode_one_token(t, cache) for t in ids[20:]]
    assert_tiny_rounding(torch.stack(got), expected[19:])


# -- SmolLM2: the cache and the speculative operations ------------------------------------------------

@pytest.fixture(scope="module")
def smollm2() -> Int4Model:
    from hartonomous.runtimes import load_exact_model

    smollm2_gguf()
    started = time.perf_counter()
    model = load_exact_model("int4", "smollm2", "cpu")
    print(f"\nint4 SmolLM2 loaded in {time.perf_counter() - started:.1f} s")
    return model


@pytest.fixture(scope="module")
def prompt_ids(smollm2) -> list[int]:
    return smollm2.tokenizer.encode(PROMPT)


@pytest.mark.integration
def test_prefill_then_decode_gives_the_logits_of_a_forward_from_scratch(smollm2, prompt_ids):
    ids, cache = prompt_ids, smollm2.new_cache()
    logits = smollm2.prefill(ids[:-3], cache)
    assert logits.shape == (smollm2.vocab_size,) and cache.length == len(ids) - 3
    assert_same_bits(logits, smollm2.full_logits(ids[:-3]))
    for n in range(len(ids) - 3, len(ids)):
        logits = smollm2.decode_one_token(ids[n], cache)
        assert cache.length == n + 1
        assert_same_bits(logits, smollm2.full_logits(ids[:n + 1]))


@pytest.mark.integration
def test_extend_gives_the_logits_after_each_fed_token(smollm2, prompt_ids):
    ids, cache = prompt_ids, smollm2.new_cache()
    smollm2.prefill(ids[:10], cache)
    rows = smollm2.extend(ids[10:], cache, len(ids) - 10)
    assert rows.shape == (len(ids) - 10, smollm2.vocab_size) and cache.length == len(ids)
    assert_same_bits(rows, smollm2.full_logits_many(ids, len(ids) - 10))


@pytest.mark.integration
def test_rollback_then_the_same_tokens_gives_the_same_bits(smollm2, prompt_ids):
    ids, cache = prompt_ids, smollm2.new_cache()
    smollm2.prefill(ids[:8], cache)
    first = smollm2.extend(ids[8:] + [5, 6, 7], cache, len(ids) - 8 + 3)
    cache.crop(10)
    again = smollm2.extend(ids[10:] + [5, 6, 7], cache, len(ids) - 10 + 3)
    assert torch.equal(again, first[2:])
    cache.crop(len(ids))                                # the draft rejected: the next token sees the prompt alone
    assert_same_bits(smollm2.decode_one_token(9, cache), smollm2.full_logits(ids + [9]))


BRANCHES = [[5, 6, 7], [9, 10], [11], []]


@pytest.mark.integration
def test_a_tree_gives_each_branch_the_logits_it_has_fed_alone(smollm2, prompt_ids):
    """extend_tree feeds two pending tokens and the branches flat in one forward; every branch's rows
    are the bits of extending by that branch alone after the same cache: siblings see neither each
    other nor each other's positions (a causal mask over the flat layout would show them, and move
    the logits by far more than nothing)."""
    ids = prompt_ids
    past = len(ids) - 2
    tree_cache, chain_cache = smollm2.new_cache(), smollm2.new_cache()
    smollm2.prefill(ids[:past], tree_cache)
    smollm2.prefill(ids[:past], chain_cache)
    rows = smollm2.extend_tree(ids[past:], BRANCHES, tree_cache)
    fed = 2 + sum(len(b) for b in BRANCHES)
    assert rows.shape == (fed, smollm2.vocab_size) and tree_cache.length == past + fed
    assert_same_bits(rows[:2], smollm2.extend(ids[past:], chain_cache, 2))
    at, flat = 2, []
    for branch in (b for b in BRANCHES if b):
        chain_cache.crop(past)
        alone = smollm2.extend(ids[past:] + branch, chain_cache, len(branch) + 1)
        assert_same_bits(rows[at:at + len(branch)], alone[1:])
        if at > 2:                                      # a later branch, fed after its siblings without the tree mask
            chain_cache.crop(past)
            seen = smollm2.extend(ids[past:] + flat + branch, chain_cache, len(branch))
            assert float((seen - alone[1:]).abs().mean()) > SIBLING_SEEN
        flat += branch
        at += len(branch)


@pytest.mark.integration
def test_after_a_tree_and_a_crop_to_its_first_branch_decoding_goes_on_as_after_that_branch(smollm2, prompt_ids):
    ids = prompt_ids
    cache = smollm2.new_cache()
    smollm2.prefill(ids[:-2], cache)
    smollm2.extend_tree(ids[-2:], BRANCHES, cache)
    cache.crop(len(ids) + len(BRANCHES[0]))
    after_tree = [smollm2.decode_one_token(t, cache) for t in (8, 12)]
    chain = smollm2.new_cache()
    smollm2.prefill(ids + BRANCHES[0], chain)
    after_chain = [smollm2.decode_one_token(t, chain) for t in (8, 12)]
    assert_same_bits(torch.stack(after_tree), torch.stack(after_chain))
    assert_same_bits(after_tree[1], smollm2.full_logits(ids + BRANCHES[0] + [8, 12]))


# -- SmolLM2 against the float32 reference -------------------------------------------------------------

@pytest.mark.integration
def test_teacher_forced_on_held_out_code_it_picks_the_references_token_but_at_near_ties(smollm2):
    from hartonomous.runtimes.reference import ExactModel

    started = time.perf_counter()
    reference = ExactModel.load("smollm2", "cpu")
    loaded = time.perf_counter()
    text = inspect.getsource(json.decoder)[:3000]
    ids = smollm2.tokenizer.encode(text)[:POSITIONS]
    assert len(ids) == POSITIONS and reference.tokenizer.encode(text)[:POSITIONS] == ids
    got = smollm2.full_logits_many(ids, POSITIONS)
    expected = reference.full_logits_many(ids, POSITIONS)
    delta = (got - expected).abs()
    differ = got.argmax(-1) != expected.argmax(-1)
    agreement = 1 - float(differ.float().mean())
    gaps = top2_gap(expected)[differ]
    print(f"\nint4 vs float32 on {POSITIONS} positions of json/decoder.py: top-1 agreement {agreement:.3f}, "
          f"median |Δ logit| {float(delta.median()):.3f}, mean {float(delta.mean()):.3f}, "
          f"max {float(delta.max()):.2f}, "
          f"reference top-2 gaps where they differ {[round(g, 3) for g in gaps.tolist()]} "
          f"(reference loaded in {loaded - started:.1f} s, both forwards {time.perf_counter() - loaded:.1f} s)")
    assert agreement >= AGREEMENT
    assert bool((gaps < NEAR_TIE).all())
    assert float(delta.median()) < MEDIAN_DELTA


# -- speculative verification on the int4 runtime --------------------------------------------------

STEPS = 24
WRONG = {3, 4, 11, 17}          # draft positions corrupted on purpose


def greedy_sampler():
    from hartonomous.generation_config import GenerationConfig

    return GenerationConfig(max_new_tokens=STEPS, temperature=0.0, stop_at_eos=False).sampler


def step_by_step(backend, prompt: list[int]) -> tuple[list[int], list[float]]:
    """Greedy decoding one token per forward: the tokens and the top-2 logit gap at each."""
    sampler, state = greedy_sampler(), backend.start(prompt)
    picks, gaps = [], []
    for _ in range(STEPS):
        picks.append(backend.distribution(state, sampler).token_ids[0])
        gaps.append(float(top2_gap(state.logits)))
        backend.advance(state, picks[-1])
    return picks, gaps


def corrupted(tokens: list[int], start: int, vocab: int) -> list[int]:
    return [(t + 1) % vocab if start + j in WRONG else t for j, t in enumerate(tokens)]


def speculative_chain(backend, prompt: list[int], plain: list[int]) -> tuple[list[int], int, int]:
    """Rounds of `score` + `accept`: the draft is the plain output ahead, with corrupted positions;
    the round keeps the longest prefix the verifier agrees with, then the verifier's own token."""
    sampler, state = greedy_sampler(), backend.begin(prompt)
    out, drafted, kept = [], 0, 0
    while len(out) < STEPS:
        draft = corrupted(plain[len(out):len(out) + 5], len(out), backend.model.vocab_size)
        picks = backend.score(state, draft, sampler).argmax(-1).tolist()
        keep = 0
        while keep < len(draft) and picks[keep] == draft[keep]:
            keep += 1
        tokens = draft[:keep] + [picks[keep]]
        backend.accept(state, draft, tokens)
        assert state.cache.length == len(state.ids) - 1      # the last token waits for the next forward
        out, drafted, kept = out + tokens, drafted + len(draft), kept + keep
    return out[:STEPS], drafted, kept


def speculative_tree(backend, prompt: list[int], plain: list[int]) -> tuple[list[int], int, int]:
    """Rounds of `score_tree` + `accept`: two branches, the plain output ahead and a corrupted copy,
    the right one first or second in turn (a kept second branch is fed again by the next round)."""
    sampler, state = greedy_sampler(), backend.begin(prompt)
    out, drafted, kept, rounds = [], 0, 0, 0
    while len(out) < STEPS:
        right = plain[len(out):len(out) + 4]
        vocab = backend.model.vocab_size
        wrong = [(right[0] + 1) % vocab] + corrupted(right[1:], len(out) + 1, vocab)
        branches = [right, wrong] if rounds % 2 else [wrong, right]
        root, rows = backend.score_tree(state, branches, sampler)
        tokens = [int(root.argmax())]
        rank = next((i for i, b in enumerate(branches) if b[0] == tokens[0]), None)
        if rank is not None:
            branch, picks = branches[rank], rows[rank].argmax(-1).tolist()
            for j in range(1, len(branch) + 1):
                tokens.append(picks[j - 1])
                if j == len(branch) or branch[j] != picks[j - 1]:
                    break
                kept += 1
            kept += 1
        backend.accept(state, branches[0], tokens)
        out, drafted, rounds = out + tokens, drafted + len(right) + len(wrong), rounds + 1
    return out[:STEPS], drafted, kept


@pytest.mark.integration
@pytest.mark.parametrize("verify", [speculative_chain, speculative_tree])
def test_speculative_verification_decides_what_step_by_step_decoding_decides(smollm2, verify):
    """Greedy speculative decoding on this runtime is step-by-step decoding token for token, near-ties
    included (the prompt's continuation has top-2 gaps of 0.03): a draft's rows are the bits one-token
    forwards give. The rounds kept part of their drafts and rejected the rest."""
    from hartonomous.backends.exact import ExactBackend

    backend = ExactBackend(smollm2)
    prompt = smollm2.tokenizer.encode("def fibonacci(n):\n")
    plain, gaps = step_by_step(backend, prompt)
    got, drafted, kept = verify(backend, prompt, plain)
    print(f"\n{verify.__name__}: kept {kept} of {drafted} draft tokens; smallest top-2 gap of the "
          f"step-by-step logits {min(gaps):.2f}")
    assert got == plain
    assert 0 < kept < drafted
