"""Which exact runtime `--runtime` and `auto` choose, and the one-line refusals (docs/runtimes.md)."""

from __future__ import annotations

import pytest

import hartonomous.runtimes as runtimes
from hartonomous.errors import UserError
from hartonomous.runtimes import resolve_runtime


@pytest.fixture
def cpu(monkeypatch):
    """Pin what this machine's CPU and torch report: (native bfloat16, the int4 kernel)."""
    def pin(bf16: bool, int4_kernel: bool) -> None:
        monkeypatch.setattr(runtimes, "cpu_has_bf16", lambda: bf16)
        monkeypatch.setattr(runtimes, "int4_kernel_available", lambda: int4_kernel)
    return pin


@pytest.mark.parametrize("bf16, int4_kernel, want", [
    (True, True, "int4"),
    (True, False, "torch"),           # an older torch: no int4 kernel
    (False, True, "torch"),           # bfloat16 emulated: correct, but slow
    (False, False, "torch"),
])
def test_auto_is_int4_only_for_smollm2_in_float32_on_a_cpu_with_bfloat16(cpu, bf16, int4_kernel, want):
    cpu(bf16, int4_kernel)
    assert resolve_runtime("auto", "cpu", "smollm2") == want
    assert resolve_runtime(None, "cpu", "smollm2") == want
    assert resolve_runtime("AUTO", "cpu", "smollm2", "fp32") == want


@pytest.mark.parametrize("device, dtype", [("cpu", "bfloat16"), ("cpu", "float16"), ("cuda", "float32"),
                                           ("cuda:0", "float32")])
def test_auto_is_the_reference_on_cuda_and_for_another_dtype_even_on_the_fastest_cpu(cpu, device, dtype):
    cpu(True, True)
    assert resolve_runtime("auto", device, "smollm2", dtype) == "torch"


def test_an_explicit_int4_on_a_torch_without_the_kernel_is_refused_in_one_line(cpu):
    cpu(True, False)
    with pytest.raises(UserError, match=r"the int4 runtime needs torch >= 2\.6") as caught:
        resolve_runtime("int4", "cpu", "smollm2")
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("flags, want", [
    ("fpu sse2 avx2 avx512f avx512_bf16", True),
    ("fpu sse2 avx2 amx_tile amx_bf16 amx_int8", True),
    ("fpu sse2 avx2 avx512f avx512_vnni", False),
    ("fpu sse2 avx2 avx512_bf16x", False),                      # a flag name, not a prefix of one
])
def test_native_bfloat16_is_read_from_the_cpu_flags(monkeypatch, tmp_path, flags, want):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\n")
    real_open = open
    monkeypatch.setattr(runtimes, "open", lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo"
                                                                          else path, *a, **k), raising=False)
    assert runtimes.cpu_has_bf16() is want


def test_auto_keeps_a_model_folder_on_the_reference(cpu, tmp_path):
    cpu(True, True)
    (tmp_path / "model.gguf").write_bytes(b"GGUF")              # a GGUF the int4 runtime was never measured on
    assert resolve_runtime("auto", "cpu", str(tmp_path)) == "torch"


@pytest.mark.parametrize("runtime, device, model, message", [
    ("fast", "cpu", "smollm2", "runtime must be one of auto, torch, int4, llama, got 'fast'"),
    ("int4", "cuda", "smollm2", "the int4 runtime runs on the CPU; use --runtime torch with --device cuda"),
    ("int4", "cpu", "/nonexistent-model-folder", "runs GGUF files"),
])
def test_a_runtime_that_cannot_run_is_refused_in_one_line(runtime, device, model, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(")) as caught:
        resolve_runtime(runtime, device, model)
    assert "\n" not in str(caught.value)


def test_the_llama_runtime_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(runtimes, "llama_cpp_installed", lambda: False)
    with pytest.raises(UserError, match="make install-llama|pip install -e '.\\[llama\\]'"):
        resolve_runtime("llama", "cpu", "smollm2")


def test_the_cli_refuses_an_unknown_runtime_in_one_line(capsys):
    from generation_helpers import run_cli

    code, _, err = run_cli(capsys, "generate", "hi", "--path", "exact", "--runtime", "fast")
    assert code == 1 and err.count("\n") == 1 and "runtime must be one of" in err
