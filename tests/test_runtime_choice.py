"""Which exact runtime `--runtime` and `auto` choose, and the one-line refusals (docs/runtimes.md)."""

from __future__ import annotations

import pytest

from hartonomous.errors import UserError
from hartonomous.runtimes import cpu_has_bf16, int4_kernel_available, llama_cpp_installed, resolve_runtime


def test_auto_is_int4_only_for_smollm2_in_float32_on_a_cpu_with_bfloat16():
    fast = cpu_has_bf16() and int4_kernel_available()
    assert resolve_runtime("auto", "cpu", "smollm2") == ("int4" if fast else "torch")
    assert resolve_runtime(None, "cpu", "smollm2") == resolve_runtime("auto", "cpu", "smollm2")
    assert resolve_runtime("auto", "cpu", "smollm2", "bfloat16") == "torch"     # --dtype is the torch runtime's
    assert resolve_runtime("auto", "cuda", "smollm2") == "torch"
    assert resolve_runtime("auto", "cuda:0", "smollm2") == "torch"


def test_auto_keeps_a_model_folder_on_the_reference(tmp_path):
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


@pytest.mark.skipif(llama_cpp_installed(), reason="llama-cpp-python is installed here")
def test_the_llama_runtime_says_how_to_install_it():
    with pytest.raises(UserError, match="make install-llama|pip install -e '.\\[llama\\]'"):
        resolve_runtime("llama", "cpu", "smollm2")


def test_the_cli_refuses_an_unknown_runtime_in_one_line(capsys):
    from generation_helpers import run_cli

    code, _, err = run_cli(capsys, "generate", "hi", "--path", "exact", "--runtime", "fast")
    assert code == 1 and err.count("\n") == 1 and "runtime must be one of" in err
