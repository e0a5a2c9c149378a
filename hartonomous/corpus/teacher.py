"""Teacher forcing with the exact model: batched forward passes over token chunks.

Each chunk is one context: the model sees its tokens 0..t and predicts token t+1, and the
context restarts at every chunk. A chunk's labels are those of the chunk run alone, bit for bit,
whatever else is in the pass, how it is batched and which chunks came from the label cache
(issue 22: the same build gives the same atoms whether its labels were cached or computed):

- Only chunks of the same length share a batch (about `batch_tokens` tokens), unpadded and with no
  attention mask: each row is computed exactly as the chunk alone, as long as the device's kernels
  give a row the same bits whatever the batch size. That is checked once per (device, batch shape,
  threads) and model: the batch's last chunk is run alone too and compared bit for bit; where they
  differ, chunks of that shape are run one at a time (never padded).
- The language-model head runs per chunk, in slices of HEAD_SLICE positions, so the full
  (positions x vocab) logits never exist at once and no slice mixes chunks.
- torch runs on a fixed number of threads (hartonomous.threads).

From each slice the pass keeps what the caller asks for: always the argmax, optionally the top-k
probabilities (soft labels) and the full log-probabilities (the comparison's exact distribution),
all from the same logits.

The build's distillation (projection/distill.py) and `hartonomous compare` both use it.

Label cache. With `cache_dir` set (the CLI passes `cache_dir(home)`, i.e.
`$HARTONOMOUS_HOME/cache/teacher/`), argmax and top-k results are kept on disk per chunk, so a
build's teacher pass is not repeated by `compare`'s n-gram labels or by a re-build of the same
corpus with other options. One file per (model, chunk):

    <cache_dir>/<model fingerprint[:16]>/<sha256(CACHE_VERSION | fingerprint | device type | torch version |
                                                chunk ids as int64)>.npz

holding `argmax` (n,) int64 and `top_ids` / `top_probs` (n, k). The model fingerprint
(`model_fingerprint`) is a sha256 over every parameter's name, dtype, shape and bytes, so two
different weights never share an entry whatever their names; the device type (cpu, cuda, ...)
and the torch version are in the key because the kernels that compute the labels are. A chunk
is one context (the context restarts at every chunk), so the chunk's own tokens are its whole
input: the chunking is part of the key because the chunk is. An entry with k' stored top tokens answers any request
with k <= k' (the first k columns: the top-k are sorted, most probable first); a request for
more recomputes the chunk and overwrites the entry. Full log-probability rows are never cached
(positions x vocabulary floats); a pass that asks for them runs the model.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HEAD_SLICE = 2048
DEFAULT_BATCH_TOKENS = 4096
CACHE_VERSION = 2  # 2: labels of the chunk alone (1 mixed in padded batches)
CACHE_GROUP_BATCHES = 8  # with a cache, chunks are run and stored in groups of about this many batches


@dataclass(frozen=True)
class Forced:
    """Per chunk (in the caller's order), what the exact model predicts after each position.

    argmax[i][t] is the argmax after chunk i's tokens 0..t; top_ids/top_probs[i][t] are the k
    most probable next tokens and their probabilities (descending), log_probs[i][t] the whole
    log-softmax row. top_* and log_probs are None unless asked for.
    """

    chunks: list[np.ndarray]
    argmax: list[np.ndarray]                   # (n,) int64 each
    top_ids: list[np.ndarray] | None           # (n, k) int64 each
    top_probs: list[np.ndarray] | None         # (n, k) float32 each
    log_probs: list[np.ndarray] | None         # (n, V) float32 each
    seconds: float
    cached_tokens: int = 0                     # of `tokens`, answered from the label cache

    @property
    def tokens(self) -> int:
        return int(sum(len(c) for c in self.chunks))

    @property
    def tokens_per_second(self) -> float | None:
        """Forward-pass speed over the tokens the model actually ran (None when all were cached)."""
        computed = self.tokens - self.cached_tokens
        if computed == 0:
            return None
        return computed / self.seconds if self.seconds > 0 else float("inf")


def cache_dir(home: Path) -> Path:
    """Where the teacher-label cache lives under a Hartonomous home ($HARTONOMOUS_HOME)."""
    return Path(home) / "cache" / "teacher"


def model_fingerprint(model) -> str:
    """sha256 over every parameter's name, dtype, shape and bytes (computed once per model object)."""
    import torch

    known = getattr(model, "_hartonomous_fingerprint", None)
    if known is not None:
        return known
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        values = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{values.dtype}|{tuple(values.shape)}|".encode())
        digest.update(values.view(-1).view(torch.uint8).numpy().tobytes())
    fingerprint = digest.hexdigest()
    try:
        model._hartonomous_fingerprint = fingerprint
    except AttributeError:  # a model object that refuses attributes: hash again next time
        pass
    return fingerprint


def _kernels(model) -> str:
    """What decides which kernels compute the labels besides the weights: device type, torch version."""
    import torch

    return f"{next(model.parameters()).device.type}|{torch.__version__}"


def _entry_path(directory: Path, fingerprint: str, kernels: str, chunk: np.ndarray) -> Path:
    key = hashlib.sha256(f"{CACHE_VERSION}|{fingerprint}|{kernels}|".encode() + chunk.astype(np.int64).tobytes())
    return directory / fingerprint[:16] / f"{key.hexdigest()}.npz"


def _load_entry(path: Path, length: int, top_k: int) -> dict[str, np.ndarray] | None:
    """The cached arrays of one chunk when the entry exists and holds at least top_k columns."""
    if not path.is_file():
        return None
    try:
        with np.load(path) as stored:
            entry = {name: stored[name] for name in stored.files}
    except (OSError, ValueError, KeyError):  # a torn or foreign file: recompute and overwrite it
        return None
    if not {"argmax", "top_ids", "top_probs"} <= entry.keys():
        return None
    if len(entry["argmax"]) != length or entry["top_ids"].shape[1] < top_k:
        return None
    return {"argmax": entry["argmax"], "top_ids": entry["top_ids"][:, :top_k],
            "top_probs": entry["top_probs"][:, :top_k]}


def _save_entry(path: Path, argmax: np.ndarray, top_ids: np.ndarray, top_probs: np.ndarray) -> None:
    """Write one entry atomically (a temporary file renamed), so concurrent readers see all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            np.savez(handle, argmax=argmax, top_ids=top_ids, top_probs=top_probs)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def max_context(model) -> int:
    """The longest sequence the model accepts (positions it was configured for)."""
    return int(getattr(model.config, "max_position_embeddings", 2048) or 2048)


def windows(ids: Sequence[int] | np.ndarray, length: int) -> list[np.ndarray]:
    """Consecutive non-overlapping windows of at most `length` tokens (the last may be shorter)."""
    if length < 1:
        raise ValueError(f"window length must be positive, got {length}")
    ids = np.asarray(ids, dtype=np.int64)
    return [ids[lo:lo + length] for lo in range(0, len(ids), length)]


def teacher_force(model, chunks: Sequence[np.ndarray], batch_tokens: int = DEFAULT_BATCH_TOKENS, *,
                  top_k: int = 0, log_probs: bool = False,
                  advance: Callable[[int], None] | None = None, cache_dir: Path | None = None) -> Forced:
    """Run the model over every chunk (teacher forcing, T = 1) and keep what is asked for.

    `top_k` > 0 keeps the k most probable next tokens per position (soft labels; k is capped at
    the vocabulary); `log_probs` keeps the full float32 log-softmax rows (positions x vocabulary:
    memory grows with both).
    `advance(n)` is called after each batch with its number of tokens (cached chunks included).
    With `cache_dir` (and no `log_probs`) chunks found in the label cache are not run, and the
    chunks that are run are stored there (see the module docstring).
    """
    if cache_dir is None or log_probs:
        return _run(model, chunks, batch_tokens, top_k, log_probs, advance)
    start = time.perf_counter()
    chunks = _checked(chunks, batch_tokens, top_k)
    top_k = min(top_k, _vocabulary(model))
    fingerprint, kernels = model_fingerprint(model), _kernels(model)
    paths = [_entry_path(Path(cache_dir), fingerprint, kernels, c) for c in chunks]
    found = [_load_entry(p, len(c), top_k) for p, c in zip(paths, chunks)]
    missing = [i for i, entry in enumerate(found) if entry is None]
    cached_tokens = int(sum(len(chunks[i]) for i, entry in enumerate(found) if entry is not None))
    if advance and cached_tokens:
        advance(cached_tokens)
    for group in _groups(missing, [len(c) for c in chunks], CACHE_GROUP_BATCHES * batch_tokens):
        ran = _run(model, [chunks[i] for i in group], batch_tokens, top_k, False, advance)
        for j, i in enumerate(group):
            ids = ran.top_ids[j] if top_k else np.empty((len(chunks[i]), 0), np.int64)
            probs = ran.top_probs[j] if top_k else np.empty((len(chunks[i]), 0), np.float32)
            _save_entry(paths[i], ran.argmax[j], ids, probs)
            found[i] = {"argmax": ran.argmax[j], "top_ids": ids, "top_probs": probs}
    return Forced(chunks, [e["argmax"] for e in found],
                  [e["top_ids"] for e in found] if top_k else None,
                  [e["top_probs"] for e in found] if top_k else None,
                  None, time.perf_counter() - start, cached_tokens)


def _groups(indices: list[int], lengths: list[int], tokens: int) -> list[list[int]]:
    """`indices` in consecutive groups of about `tokens` tokens, so that an interrupted pass keeps
    what its finished groups stored."""
    groups: list[list[int]] = []
    size = tokens
    for i in indices:
        if size >= tokens:
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += lengths[i]
    return groups


def _vocabulary(model) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def _checked(chunks: Sequence[np.ndarray], batch_tokens: int, top_k: int) -> list[np.ndarray]:
    if batch_tokens < 1:
        raise ValueError(f"batch_tokens must be positive, got {batch_tokens}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    chunks = [np.asarray(c, dtype=np.int64) for c in chunks]
    if any(len(c) == 0 for c in chunks):
        raise ValueError("every chunk needs at least one token")
    return chunks


def _run(model, chunks: Sequence[np.ndarray], batch_tokens: int, top_k: int, log_probs: bool,
         advance: Callable[[int], None] | None) -> Forced:
    """The forward pass itself (no cache): batches of equal-length chunks, the head per chunk."""
    import torch

    from hartonomous.threads import fixed_threads

    chunks = _checked(chunks, batch_tokens, top_k)
    head = model.get_output_embeddings()
    top_k = min(top_k, _vocabulary(model))
    kept: dict[str, list] = {}  # output name -> one array per chunk, in the caller's order
    start = time.perf_counter()
    with torch.inference_mode(), fixed_threads() as threads:
        for batch in _batches([len(c) for c in chunks], batch_tokens):
            hidden = _hidden_states(model, [chunks[i] for i in batch], threads)
            for i, rows in zip(batch, hidden):
                for name, values in _head_outputs(head, rows, top_k, log_probs).items():
                    kept.setdefault(name, [None] * len(chunks))[i] = values
            if advance:
                advance(int(sum(len(chunks[i]) for i in batch)))

    def output(name: str, wanted: bool = True) -> list[np.ndarray] | None:
        return kept.get(name, []) if wanted else None

    return Forced(chunks, output("argmax"), output("top_ids", top_k > 0), output("top_probs", top_k > 0),
                  output("log_probs", log_probs), time.perf_counter() - start)


def _batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices of chunks of one length per batch, at most max(1, batch_tokens // length) of them;
    longest first, then in the caller's order."""
    batches: list[list[int]] = []
    for length in sorted(set(lengths), reverse=True):
        same = [i for i, n in enumerate(lengths) if n == length]
        size = max(1, batch_tokens // length)
        batches += [same[lo:lo + size] for lo in range(0, len(same), size)]
    return batches


def _forward(body, chunks: list[np.ndarray], device):
    """The body's last hidden states of equal-length chunks, (chunks, length, d): no padding, no mask."""
    import torch

    ids = torch.from_numpy(np.stack(chunks)).to(device)
    return body(input_ids=ids, use_cache=False).last_hidden_state


def _hidden_states(model, chunks: list[np.ndarray], threads: int) -> list:
    """Each chunk's hidden states as if it ran alone: batched where the device's kernels are batch
    invariant for this shape (checked once per model, device, shape and thread count), else one by one."""
    device = next(model.parameters()).device
    body = model.base_model
    if len(chunks) == 1:
        return [_forward(body, chunks, device)[0]]
    shape = (str(device), len(chunks), len(chunks[0]), threads)
    invariant = _batch_invariant_shapes(model)
    if invariant.get(shape) is False:
        return [_forward(body, [c], device)[0] for c in chunks]
    hidden = _forward(body, chunks, device)
    if shape not in invariant:
        invariant[shape] = _same_bits(hidden[-1], _forward(body, chunks[-1:], device)[0])
        if not invariant[shape]:
            return [_forward(body, [c], device)[0] for c in chunks]
    return [rows.clone() for rows in hidden]  # each in its own allocation, as a chunk run alone


def _same_bits(a, b) -> bool:
    """Whether two tensors hold the same bits (unlike torch.equal, 0.0 and -0.0 differ, equal NaNs match)."""
    import torch

    return a.shape == b.shape and a.dtype == b.dtype and bool(
        torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))


def _batch_invariant_shapes(model) -> dict:
    """The model's record of which batch shapes gave a row the bits of the chunk alone."""
    record = getattr(model, "_hartonomous_batch_invariant", None)
    if record is None:
        record = {}
        try:
            model._hartonomous_batch_invariant = record
        except AttributeError:  # a model object that refuses attributes: check again next time
            pass
    return record


def _head_outputs(head, hidden, top_k: int, log_probs: bool) -> dict[str, np.ndarray]:
    """The head over `hidden` (positions x d) in slices; argmax [+ top-k] [+ log-softmax rows]."""
    import torch

    n = hidden.shape[0]
    out: dict[str, np.ndarray] = {"argmax": np.empty(n, dtype=np.int64)}
    if top_k:
        out["top_ids"] = np.empty((n, top_k), dtype=np.int64)
        out["top_probs"] = np.empty((n, top_k), dtype=np.float32)
    for lo in range(0, n, HEAD_SLICE):
        logits = head(hidden[lo:lo + HEAD_SLICE])
        out["argmax"][lo:lo + len(logits)] = logits.argmax(-1).cpu().numpy()
        if top_k:  # the k largest logits, normalised without materialising the log-softmax
            x = logits.float()
            values, idx = x.topk(top_k, dim=-1)
            out["top_ids"][lo:lo + len(x)] = idx.cpu().numpy()
            out["top_probs"][lo:lo + len(x)] = (values - torch.logsumexp(x, -1, keepdim=True)).exp().cpu().numpy()
        if log_probs:
            lp = torch.log_softmax(logits.float(), dim=-1)
            if "log_probs" not in out:
                out["log_probs"] = np.empty((n, lp.shape[-1]), dtype=np.float32)
            out["log_probs"][lo:lo + len(lp)] = lp.cpu().numpy()
    return out


def argmax_labels(model, ids: Sequence[int] | np.ndarray, window: int = 512,
                  batch_tokens: int = DEFAULT_BATCH_TOKENS,
                  progress: Callable[[int], None] | None = None, cache_dir: Path | None = None) -> np.ndarray:
    """The exact argmax after every prefix of a long text, in non-overlapping windows.

    Each window restarts the context, as the builder's teacher forcing does when it distils a
    corpus longer than one forward pass; a last window of one token is kept (its label too).
    """
    if len(ids) == 0:
        return np.empty(0, dtype=np.int64)
    forced = teacher_force(model, windows(ids, min(window, max_context(model))), batch_tokens, advance=progress,
                           cache_dir=cache_dir)
    return np.concatenate(forced.argmax)
