"""The caches of a GGUF's packed int4 weights and of its tokenizer: keyed by the file's content, never
trusted when damaged, and never the reason a load fails.

A replacement of the same name, size and mtime is its own key (the key was name, size and whole-second
mtime); a cache file truncated, bit-flipped or without its recorded CRC-32 is refused and written again;
a cache truncated while a process runs on it cannot fault that process (it is read, not mapped); a save
that fails (torch.save reports a full disk as RuntimeError) is logged and the load returns the weights.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from hartonomous.model import load_fast_tokenizer, load_tokenizer
from hartonomous.runtimes.int4 import Int4Weights, load_int4_weights, prepared_path
from test_runtime_int4 import write_tiny_gguf

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py


def same_weights(a: Int4Weights, b: Int4Weights) -> bool:
    return (a.config == b.config and a.tensors.keys() == b.tensors.keys()
            and all(torch.equal(a.tensors[k], b.tensors[k]) for k in a.tensors))


def replace_keeping_size_and_mtime(target: Path, replacement: Path, in_place: bool) -> None:
    """`target` gets `replacement`'s bytes and keeps its name, size and mtime: rewritten in place, or
    renamed over (what an installer does)."""
    before = target.stat()
    assert replacement.stat().st_size == before.st_size
    if in_place:
        target.write_bytes(replacement.read_bytes())
    else:
        os.replace(replacement, target)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = target.stat()
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory) -> tuple[Path, Path]:
    """Two tiny GGUFs of the same size and different weights."""
    folder = tmp_path_factory.mktemp("ggufs")
    return write_tiny_gguf(folder / "a.gguf", seed=0), write_tiny_gguf(folder / "b.gguf", seed=1)


@pytest.mark.parametrize("in_place", [True, False], ids=["rewritten-in-place", "renamed-over"])
def test_a_replacement_of_the_same_name_size_and_mtime_gets_its_own_weights(tiny_ggufs, tmp_path, in_place,
                                                                             monkeypatch):
    a, b = tiny_ggufs
    model = tmp_path / "model.gguf"
    model.write_bytes(a.read_bytes())
    first = load_int4_weights(model, tmp_path)
    assert same_weights(first, load_int4_weights(a, None))
    copy_of_b = tmp_path / "b-copy.gguf"
    copy_of_b.write_bytes(b.read_bytes())
    replace_keeping_size_and_mtime(model, copy_of_b, in_place)

    replaced = load_int4_weights(model, tmp_path)
    assert same_weights(replaced, load_int4_weights(b, None))
    assert not same_weights(replaced, first)
    assert len(list((tmp_path / "cache" / "runtimes").glob("int4-model-*.pt"))) == 2

    def no_packing(*args):
        raise AssertionError("packed again although its cache is whole")

    monkeypatch.setattr(Int4Weights, "from_gguf", no_packing)
    assert same_weights(load_int4_weights(model, tmp_path), replaced)          # each content hits its cache


def flip_a_weight_byte(path: Path) -> None:
    """Flip one byte in the middle of the largest tensor's bytes (not in the archive's padding)."""
    with zipfile.ZipFile(path) as archive:
        record = max(archive.infolist(), key=lambda info: info.file_size)
    data = bytearray(path.read_bytes())
    name_length = int.from_bytes(data[record.header_offset + 26:record.header_offset + 28], "little")
    extra_length = int.from_bytes(data[record.header_offset + 28:record.header_offset + 30], "little")
    start = record.header_offset + 30 + name_length + extra_length
    data[start + record.file_size // 2] ^= 0x5A
    path.write_bytes(bytes(data))


def truncate_to_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def drop_the_recorded_digest(path: Path) -> None:
    """A cache file as the previous layout wrote it: whole, but without its CRC-32."""
    saved = torch.load(path, weights_only=True)
    del saved["crc32"]
    torch.save(saved, path)


@pytest.mark.parametrize("damage", [flip_a_weight_byte, truncate_to_half, drop_the_recorded_digest],
                         ids=lambda f: f.__name__)
def test_a_damaged_cache_file_is_refused_logged_and_written_again(tiny_ggufs, tmp_path, damage, caplog):
    a, _ = tiny_ggufs
    fresh = load_int4_weights(a, tmp_path)
    cache = prepared_path(a, tmp_path)
    whole = cache.read_bytes()
    damage(cache)
    assert cache.read_bytes() != whole

    with caplog.at_level(logging.WARNING, logger="hartonomous.runtimes.int4"):
        loaded = load_int4_weights(a, tmp_path)
    assert same_weights(loaded, fresh)
    assert "is unusable" in caplog.text and str(cache) in caplog.text
    assert same_weights(load_int4_weights(a, tmp_path), fresh)      # the cache written again is whole
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1


RUN_ON_A_TRUNCATED_CACHE = """
import os, sys, torch
from pathlib import Path
from hartonomous.runtimes.int4 import Int4Model, load_int4_weights, prepared_path
gguf, home = Path(sys.argv[1]), Path(sys.argv[2])
model = Int4Model(load_int4_weights(gguf, home), None)
os.truncate(prepared_path(gguf, home), 0)         # another process truncates the file it was read from
logits = model.full_logits_many([1, 5, 9, 12], 4)
print("ok", bool(torch.isfinite(logits).all()))
"""


def test_a_cache_truncated_while_a_process_runs_on_it_does_not_fault_the_process(tiny_ggufs, tmp_path):
    a, _ = tiny_ggufs
    load_int4_weights(a, tmp_path)                                      # the cache exists
    run = subprocess.run([sys.executable, "-c", RUN_ON_A_TRUNCATED_CACHE, str(a), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"exit {run.returncode} (-7 is SIGBUS): {run.stderr[-2000:]}"
    assert run.stdout.split() == ["ok", "True"]


def test_a_failing_save_is_logged_and_the_load_still_returns_the_weights(tiny_ggufs, tmp_path, monkeypatch,
                                                                          caplog):
    a, _ = tiny_ggufs
    expected = load_int4_weights(a, None)

    def full_disk(obj, f, *args, **kwargs):
        Path(f).write_bytes(b"PK\x03\x04 partial")                       # what a full disk leaves behind
        raise RuntimeError("[enforce fail at inline_container.cc:783] . PytorchStreamWriter failed writing "
                           "file data/7: file write failed")

    monkeypatch.setattr(torch, "save", full_disk)
    with caplog.at_level(logging.WARNING, logger="hartonomous.runtimes.int4"):
        loaded = load_int4_weights(a, tmp_path)
    assert same_weights(loaded, expected)
    assert "could not cache the packed weights" in caplog.text and "RuntimeError" in caplog.text
    assert list((tmp_path / "cache" / "runtimes").iterdir()) == []      # no partial file left


# -- the tokenizer cache -------------------------------------------------------------------------------

def decode_in_a_new_process(folder: Path, ids: list[int]) -> str:
    """What load_fast_tokenizer decodes for a fresh process (its in-process caches forgotten)."""
    load_fast_tokenizer.cache_clear()
    load_tokenizer.cache_clear()
    return load_fast_tokenizer(str(folder)).decode(ids)


@pytest.mark.parametrize("in_place", [True, False], ids=["rewritten-in-place", "renamed-over"])
def test_the_tokenizer_of_a_replacement_of_the_same_size_and_mtime_is_its_own(tmp_path, in_place):
    folder = tmp_path / "model"
    folder.mkdir()
    model = write_tiny_gguf(folder / "model.gguf", token_format="<{}>")
    assert decode_in_a_new_process(folder, [5, 6]) == "<5><6>"            # read from the GGUF, cached
    assert decode_in_a_new_process(folder, [5, 6]) == "<5><6>"            # read from the cache
    replacement = write_tiny_gguf(tmp_path / "other.gguf", token_format="[{}]")
    replace_keeping_size_and_mtime(model, replacement, in_place)
    assert decode_in_a_new_process(folder, [5, 6]) == "[5][6]"


def test_a_failing_tokenizer_save_is_logged_and_the_tokenizer_still_loads(tmp_path, monkeypatch, caplog):
    from transformers import PreTrainedTokenizerBase

    folder = tmp_path / "unsaved"
    folder.mkdir()
    write_tiny_gguf(folder / "model.gguf", token_format="{{{}}}")

    def full_disk(self, directory, *args, **kwargs):
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "tokenizer.json").write_text('{"partial')
        raise RuntimeError("No space left on device")

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", full_disk)
    with caplog.at_level(logging.WARNING, logger="hartonomous.model"):
        assert decode_in_a_new_process(folder, [5, 6]) == "{5}{6}"
    assert "could not cache the tokenizer" in caplog.text and "RuntimeError" in caplog.text
    from hartonomous.config import get_settings

    left = [p.name for p in (get_settings().home / "cache" / "tokenizers").iterdir() if p.name.startswith("unsaved-")]
    assert left == []                                                    # no partial cache to be read later
