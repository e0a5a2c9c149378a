"""Self-distilled training text: the exact model's own continuations of prompts cut from the corpus.

What a drafter must predict is what the model will say. Issue 25's probe measured it: 2.6·10^4
tokens of the model's own greedy continuations predicted its next free-generation tokens better
than 10^6 tokens of corpus (0.36 against 0.19 agreement). `build --self-distill N` therefore lets
the model write N tokens and keys atoms on them:

- prompts of PROMPT_TOKENS tokens are cut from the training tokens at seeded positions;
- the model continues them CONTINUATION_TOKENS tokens at a time in batches of BATCH (64; prompts of
  equal length need no padding), with transformers' `generate`: even batches greedy, odd ones
  sampled at `temperature` (SAMPLE_TEMPERATURE by default; plain temperature sampling, no
  top-k/top-p), so the set holds both the path greedy decoding takes and the spread of sampled
  text; temperature 0 makes every batch greedy;
- a continuation ends at the model's first EOS (kept: it is the model's word too); the last one is
  cut so that exactly N tokens are generated;
- each batch's output is kept in the teacher cache's folder (`<cache>/self-distill/`), keyed by
  the model's fingerprint, the prompts, the decoding settings and the torch version, so a rebuild
  does not generate again.

Atoms are made at the continuation's positions only (projection/stages.py): their labels are the
model's tokens, while the prompt's text is corpus the other atoms already count. `compare` gives
the counting baselines the same continuations (the cache answers; hartonomous/compare/labels.py),
so a baseline learns from what the atoms hold.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hartonomous.errors import UserError

PROMPT_TOKENS = 32
CONTINUATION_TOKENS = 64
BATCH = 64              # SmolLM2 on 2 cores: 81 tokens/s at 16 sequences, 217 at 32, 272 at 64
SAMPLE_TEMPERATURE = 0.8
CACHE_VERSION = 1


@dataclass(frozen=True)
class Distilled:
    """Prompt + continuation per sequence; atoms come from positions prompt_tokens - 1 onwards."""

    sequences: list[np.ndarray]
    prompt_tokens: int
    greedy_sequences: int
    sampled_sequences: int
    seconds: float
    cached_batches: int
    seed: int = 0
    eos_token_ids: tuple[int, ...] = ()
    temperature: float = SAMPLE_TEMPERATURE

    @property
    def generated(self) -> int:
        return int(sum(len(s) - self.prompt_tokens for s in self.sequences))

    def stats(self) -> dict:
        """atom_sets.stats.self_distill."""
        run = self.seconds if self.cached_batches == 0 else None
        return {"tokens": self.generated, "sequences": len(self.sequences), "prompt_tokens": self.prompt_tokens,
                "continuation_tokens": CONTINUATION_TOKENS, "batch": BATCH, "greedy_sequences": self.greedy_sequences,
                "sampled_sequences": self.sampled_sequences, "sample_temperature": self.temperature,
                "seconds": self.seconds, "cached_batches": self.cached_batches,
                "tokens_per_second": self.generated / run if run else None,
                "seed": self.seed, "eos_token_ids": list(self.eos_token_ids),
                "prompts": "seeded windows of the training tokens", "decoder": "transformers generate"}


def prompts(train_ids: np.ndarray, count: int, seed: int, length: int = PROMPT_TOKENS) -> np.ndarray:
    """`count` windows of `length` training tokens at seeded start positions, (count, length) int64."""
    ids = np.asarray(train_ids, dtype=np.int64)
    if len(ids) < length:
        raise UserError(f"--self-distill cuts prompts of {length} tokens from the training text, which has only "
                        f"{len(ids)}; raise --max-tokens")
    starts = np.random.default_rng([seed, 25]).integers(0, len(ids) - length + 1, count)
    return np.stack([ids[s:s + length] for s in starts])


def self_distill(model, train_ids: np.ndarray, tokens: int, *, seed: int, eos_token_ids: set[int],
                 advance: Callable[[int], None] | None = None, cache_dir: Path | None = None,
                 temperature: float = SAMPLE_TEMPERATURE) -> Distilled:
    """Let `model` continue prompts cut from `train_ids` until `tokens` new tokens exist (odd batches
    sampled at `temperature`; 0: all greedy)."""
    import torch

    if tokens < 1:
        raise UserError(f"--self-distill must be at least 1 token, got {tokens}")
    if not 0 <= temperature <= 10:
        raise UserError(f"--self-distill-temperature must be between 0 (all greedy) and 10, got {temperature}")
    advance = advance or (lambda _n: None)
    sequences: list[np.ndarray] = []
    greedy = sampled = cached = 0
    produced, batch_no = 0, 0
    started = time.perf_counter()
    # Enough prompts for the worst case (every continuation ends at once): drawn once, so the
    # prompts of a larger N begin with those of a smaller one.
    batches_needed = -(-tokens // (BATCH * CONTINUATION_TOKENS))
    pool = prompts(train_ids, BATCH * batches_needed * 4, seed)
    while produced < tokens:
        if (batch_no + 1) * BATCH > len(pool):
            pool = np.concatenate([pool, prompts(train_ids, len(pool), seed + batch_no)])
        batch = pool[batch_no * BATCH:(batch_no + 1) * BATCH]
        sample = batch_no % 2 == 1 and temperature > 0
        path = _cache_path(cache_dir, model, batch, sample, temperature, seed, batch_no)
        outputs = _load(path, len(batch))
        if outputs is None:
            outputs = _generate(model, batch, sample, temperature, seed, batch_no, torch)
            _save(path, outputs)
        else:
            cached += 1
        for prompt, continuation in zip(batch, outputs):
            continuation = _until_eos(continuation, eos_token_ids)[:tokens - produced]
            if len(continuation) == 0:
                continue
            sequences.append(np.concatenate([prompt, continuation]))
            produced += len(continuation)
            greedy += not sample
            sampled += sample
            advance(len(continuation))
            if produced >= tokens:
                break
        batch_no += 1
    return Distilled(sequences, PROMPT_TOKENS, greedy, sampled, time.perf_counter() - started, cached, seed,
                     tuple(sorted(eos_token_ids)), temperature)


def _generate(model, batch: np.ndarray, sample: bool, temperature: float, seed: int, batch_no: int,
              torch) -> np.ndarray:
    """(len(batch), CONTINUATION_TOKENS) new tokens. After a sequence's EOS, generate fills in the pad
    id (EOS where the model sets none); columns past the point where every sequence had ended hold -1.
    `_until_eos` cuts both off."""
    device = next(model.parameters()).device
    ids = torch.as_tensor(batch, dtype=torch.long, device=device)
    options = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if sample else \
        dict(do_sample=False)
    pad = _pad_id(model)
    generator_seed = int.from_bytes(hashlib.sha256(f"{seed}|{batch_no}".encode()).digest()[:4], "little")
    torch.manual_seed(generator_seed)
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=CONTINUATION_TOKENS,
                         min_new_tokens=0, pad_token_id=pad, num_beams=1, repetition_penalty=1.0, **options)
    new = out[:, ids.shape[1]:].cpu().numpy().astype(np.int64)
    full = np.full((len(batch), CONTINUATION_TOKENS), -1, dtype=np.int64)
    full[:, :new.shape[1]] = new
    return full


def _pad_id(model) -> int:
    eos = model.generation_config.eos_token_id
    eos = eos[0] if isinstance(eos, (list, tuple)) else eos
    pad = model.generation_config.pad_token_id
    return int(pad if pad is not None else eos if eos is not None else 0)


def _until_eos(continuation: np.ndarray, eos_token_ids: set[int]) -> np.ndarray:
    """The continuation up to and including its first EOS (generate pads what follows)."""
    continuation = continuation[continuation >= 0]
    for i, token in enumerate(continuation.tolist()):
        if token in eos_token_ids:
            return continuation[:i + 1]
    return continuation


def _cache_path(cache_dir: Path | None, model, batch: np.ndarray, sample: bool, temperature: float, seed: int,
                batch_no: int) -> Path | None:
    if cache_dir is None:
        return None
    import torch

    from hartonomous.corpus.teacher import model_fingerprint

    fingerprint = model_fingerprint(model)
    device = next(model.parameters()).device.type
    settings = (f"{CACHE_VERSION}|{fingerprint}|{device}|{torch.__version__}|{CONTINUATION_TOKENS}|"
                f"{'sample|' + repr(temperature) if sample else 'greedy'}|{seed}|{batch_no}|")
    key = hashlib.sha256(settings.encode() + np.asarray(batch, dtype=np.int64).tobytes()).hexdigest()
    return Path(cache_dir).parent / "self-distill" / fingerprint[:16] / f"{key}.npy"


def _load(path: Path | None, rows: int) -> np.ndarray | None:
    """A cached batch of `rows` continuations, or None (absent, unreadable, or of another shape)."""
    if path is None or not path.is_file():
        return None
    try:
        outputs = np.load(path)
    except (OSError, ValueError):
        return None
    return outputs if outputs.shape == (rows, CONTINUATION_TOKENS) else None


def _save(path: Path | None, outputs: np.ndarray) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, outputs)
    tmp.replace(path)
