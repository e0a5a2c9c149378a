"""Exact runtimes: interchangeable implementations of the exact model's operations.

- `torch`: transformers in float32 (hartonomous.runtimes.reference.ExactModel), the reference: the oracle in
  tests, the teacher for build labels and self-distillation, the labels of `compare`, and the CUDA path.
- `int4`: the GGUF's Q4_1/Q8_0 codes on torch's int4 kernel with bfloat16 activations
  (hartonomous.runtimes.int4); no transformers import.
- `llama`: llama.cpp through llama-cpp-python (hartonomous.runtimes.llama_cpp; the optional `llama`
  extra), the reference runtime for GGUF files; chains only, no draft trees.

Every runtime returns float32 logits and the engine samples them with hartonomous.sampling, so the
sampler is the same on each; what differs is the arithmetic of the forward, measured against the
reference in docs/runtimes.md. `default_runtime` picks what `--runtime auto` means.
"""

from __future__ import annotations

from functools import lru_cache

from hartonomous.errors import UserError

RUNTIMES = ("torch", "int4", "llama")
RUNTIME_CHOICES = ("auto",) + RUNTIMES


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 or AMX), where the int4 kernel is fast."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool({"avx512_bf16", "amx_bf16"} & flags)
    except OSError:
        pass
    return False


def llama_cpp_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def int4_kernel_available() -> bool:
    """Whether this torch has the int4 CPU kernel and the ops the int4 forward uses (torch >= 2.6)."""
    import torch

    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch.nn.functional, "rms_norm")


def default_runtime(device: str = "cpu", model: str = "smollm2", dtype: str = "float32") -> str:
    """What `auto` means: int4 for SmolLM2's GGUF (the file it is measured on, docs/runtimes.md) in
    float32 on a CPU with native bfloat16 and a torch that has the int4 kernel; the float32 reference
    everywhere else (CUDA, another dtype, a model folder or another GGUF, a CPU where bfloat16 is
    emulated: correct there, but slow)."""
    from hartonomous.model import SMOLLM2

    if device != "cpu" or model != SMOLLM2 or dtype not in ("float32", "fp32"):
        return "torch"
    return "int4" if cpu_has_bf16() and int4_kernel_available() else "torch"


def is_gguf_model(model: str) -> bool:
    from hartonomous.model import resolve_source

    try:
        return resolve_source(model).gguf_file is not None
    except UserError:
        return False


def resolve_runtime(runtime: str | None, device: str = "cpu", model: str = "smollm2",
                    dtype: str = "float32") -> str:
    """A runtime name from a user's choice ('auto' or None means default_runtime), checked."""
    runtime = (runtime or "auto").lower()
    if runtime not in RUNTIME_CHOICES:
        raise UserError(f"runtime must be one of {', '.join(RUNTIME_CHOICES)}, got '{runtime}'")
    if runtime == "auto":
        return default_runtime(device, model, dtype)
    if runtime != "torch":
        if device != "cpu":
            raise UserError(f"the {runtime} runtime runs on the CPU; use --runtime torch with --device {device}")
        if not is_gguf_model(model):
            raise UserError(f"the {runtime} runtime runs GGUF files; '{model}' is not one (use --runtime torch)")
        if runtime == "int4" and not int4_kernel_available():
            raise UserError("the int4 runtime needs torch >= 2.6 (its int4 CPU kernel); use --runtime torch")
        if runtime == "llama" and not llama_cpp_installed():
            raise UserError("the llama runtime needs llama-cpp-python: pip install -e '.[llama]' "
                            "(compiles llama.cpp, ~6-10 minutes on 2 cores), or use --runtime int4")
    return runtime


def load_exact_model(runtime: str | None = "auto", model: str = "smollm2", device: str = "auto",
                     dtype: str = "float32"):
    """The exact model for a user's --runtime/--model/--device/--dtype (the torch runtime alone
    takes another dtype than float32)."""
    from hartonomous.model import pick_device

    device = pick_device(device)
    name = resolve_runtime(runtime, device, model, dtype)
    if name == "torch":
        from hartonomous.runtimes.reference import ExactModel

        return ExactModel.load(model, device, dtype)
    if dtype not in ("float32", "fp32"):
        raise UserError(f"--dtype {dtype} applies to the torch runtime; the {name} runtime has its own arithmetic "
                        "(docs/runtimes.md): drop --dtype or use --runtime torch")
    return _load_fast(name, model)


def runtime_summary(runtime: str | None = None, model: str | None = None, device: str | None = None) -> str:
    """One line for `db status` and logs: the runtime the exact path would use here, and why."""
    from hartonomous.config import get_settings
    from hartonomous.model import pick_device

    settings = get_settings()
    chosen = runtime or settings.runtime
    model = model or settings.model
    try:
        name = resolve_runtime(chosen, pick_device(device or settings.device), model)
    except UserError as exc:
        return f"unavailable ({exc})"
    why = ("chosen" if chosen != "auto" else
           "auto: CPU with native bfloat16" if name == "int4" else "auto: the float32 reference")
    extra = "llama.cpp installed" if llama_cpp_installed() else "llama.cpp not installed (make install-llama)"
    if name == "int4":
        extra = f"{int4_forward_summary()}; {extra}"
    return f"{name} ({why}; {extra})"


def int4_forward_summary() -> str:
    """Which forward the int4 runtime runs here: 'native forward', or 'python forward (why)'."""
    import os

    from hartonomous.runtimes import native_build
    from hartonomous.runtimes.int4 import FORWARD_ENV

    if (os.environ.get(FORWARD_ENV) or "auto").lower() == "python":
        return f"python forward: {FORWARD_ENV}=python"
    return "native forward" if native_build.load() is not None else "python forward: the native one is not built (make install-native)"


@lru_cache(maxsize=4)
def _load_fast(name: str, model: str):
    """The int4 or llama runtime of `model` (one instance per process)."""
    from hartonomous.config import get_settings
    from hartonomous.model import load_fast_tokenizer, resolve_source

    source = resolve_source(model)
    path = source.directory / source.gguf_file
    if name == "int4":
        from hartonomous.runtimes.int4 import Int4Model, load_int4_weights

        return Int4Model(load_int4_weights(path, get_settings().home), load_fast_tokenizer(model), source.name)
    from hartonomous.runtimes.llama_cpp import LlamaCppModel

    return LlamaCppModel(path, load_fast_tokenizer(model), source.name)
