"""The shared teacher-forcing pass (hartonomous.corpus.teacher): batched over chunks of any length, it gives
what one plain forward pass per chunk gives: argmax, top-k probabilities, full log-probabilities."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hartonomous.corpus.teacher import argmax_labels, max_context, teacher_force, windows
from tiny_model import tiny_model

TEXT = "The capital of France is Paris. def add(a, b): return a + b. héllo wörld 東京 " * 3


def plain_log_probs(model, chunk: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return torch.log_softmax(model(torch.from_numpy(chunk)[None]).logits[0].float(), -1).numpy()


@pytest.fixture(scope="module")
def chunks() -> list[np.ndarray]:
    _, tokenizer = tiny_model(0)
    ids = np.asarray(tokenizer(TEXT)["input_ids"], dtype=np.int64)
    # lengths out of order, one a single token: the results come back in order
    return [ids[:7], ids[7:40], ids[40:41], ids[41:61], ids[61:90]]


@pytest.mark.parametrize("batch_tokens", [1, 40, 10_000])
def test_batched_pass_equals_one_forward_pass_per_chunk(chunks, batch_tokens: int) -> None:
    model, _ = tiny_model(0)
    seen: list[int] = []
    forced = teacher_force(model, chunks, batch_tokens, top_k=4, log_probs=True, advance=seen.append)
    assert sum(seen) == forced.tokens == sum(map(len, chunks))
    assert [c.tolist() for c in forced.chunks] == [c.tolist() for c in chunks]
    for chunk, best, ids, probs, rows in zip(chunks, forced.argmax, forced.top_ids, forced.top_probs,
                                             forced.log_probs):
        expected = plain_log_probs(model, chunk)
        assert rows.shape == expected.shape and rows.dtype == np.float32
        assert rows == pytest.approx(expected, abs=1e-5)
        assert best.tolist() == expected.argmax(-1).tolist()
        assert ids.shape == probs.shape == (len(chunk), 4)
        assert ids[:, 0].tolist() == best.tolist()
        assert probs == pytest.approx(np.exp(np.take_along_axis(expected, ids, 1)), abs=1e-6)
        assert np.all(np.diff(probs, axis=1) <= 0)  # most probable first
        assert np.sort(expected, axis=1)[:, -4:][:, ::-1] == pytest.approx(np.log(probs), abs=1e-5)


def test_only_the_argmax_unless_asked_and_top_k_capped_at_the_vocabulary(chunks) -> None:
    model, _ = tiny_model(0)
    plain = teacher_force(model, chunks)
    assert plain.top_ids is None and plain.top_probs is None and plain.log_probs is None
    wide = teacher_force(model, chunks[:1], top_k=10_000)
    assert wide.top_ids[0].shape == (len(chunks[0]), model.config.vocab_size)
    assert wide.top_probs[0].sum(axis=1) == pytest.approx(1.0, abs=1e-4)


def test_argmax_labels_restart_the_context_at_every_window(chunks) -> None:
    model, _ = tiny_model(0)
    ids = np.concatenate(chunks)  # 90 tokens: windows of 16, the last one 10 tokens long
    labels = argmax_labels(model, ids, window=16, batch_tokens=32)
    expected = np.concatenate([plain_log_probs(model, w).argmax(-1) for w in windows(ids, 16)])
    assert labels.tolist() == expected.tolist() and len(labels) == len(ids)
    assert len(argmax_labels(model, ids[:17], window=16)) == 17  # a last window of one token is labelled too
    assert windows(ids, 1000)[0].tolist() == ids.tolist()
    assert max_context(model) == model.config.max_position_embeddings


def test_bad_arguments_are_refused(chunks) -> None:
    model, _ = tiny_model(0)
    with pytest.raises(ValueError, match="batch_tokens"):
        teacher_force(model, chunks, 0)
    with pytest.raises(ValueError, match="at least one token"):
        teacher_force(model, [chunks[0], chunks[0][:0]])
    with pytest.raises(ValueError, match="top_k"):
        teacher_force(model, chunks, top_k=-1)
    with pytest.raises(ValueError, match="window length"):
        windows(chunks[0], 0)


# --- the teacher-label cache ------------------------------------------------------------------

class CountingModel(torch.nn.Module):
    """Wraps a model and counts the token positions its body is asked to run."""

    def __init__(self, model) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config
        self.positions = 0

    @property
    def base_model(self):
        outer = self

        def body(input_ids, use_cache):
            outer.positions += int(input_ids.numel())
            return outer.inner.base_model(input_ids=input_ids, use_cache=use_cache)

        return body

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()


def test_a_cache_hit_returns_identical_arrays_without_running_the_model(chunks, tmp_path) -> None:
    model = CountingModel(tiny_model(0)[0])
    first = teacher_force(model, chunks, top_k=4, cache_dir=tmp_path)
    ran = model.positions
    assert ran == sum(map(len, chunks)) and first.cached_tokens == 0
    seen: list[int] = []
    again = teacher_force(model, chunks, top_k=4, cache_dir=tmp_path, advance=seen.append)
    assert model.positions == ran                       # nothing ran
    assert again.cached_tokens == again.tokens == sum(seen) and again.tokens_per_second is None
    for name in ("argmax", "top_ids", "top_probs"):
        for a, b in zip(getattr(first, name), getattr(again, name)):
            assert a.dtype == b.dtype and np.array_equal(a, b)
    # fewer top tokens, or the argmax alone, are answered by the same entries
    fewer = teacher_force(model, chunks, top_k=2, cache_dir=tmp_path)
    assert model.positions == ran
    assert all(np.array_equal(a[:, :2], b) for a, b in zip(first.top_ids, fewer.top_ids))
    stored = len(list(tmp_path.rglob("*.npz")))
    labels = argmax_labels(model, np.concatenate(chunks[:2]), window=len(chunks[0]), cache_dir=tmp_path)
    later = windows(np.concatenate(chunks[:2]), len(chunks[0]))[1:]  # only the first window is a cached chunk
    assert len(list(tmp_path.rglob("*.npz"))) == stored + len({w.tobytes() for w in later})
    assert labels[:len(chunks[0])].tolist() == first.argmax[0].tolist()


def test_a_different_key_misses(chunks, tmp_path) -> None:
    model = CountingModel(tiny_model(0)[0])
    base = teacher_force(model, chunks[:2], top_k=2, cache_dir=tmp_path)
    ran = model.positions
    # a chunking that differs (the same tokens cut elsewhere): each new chunk runs
    teacher_force(model, [np.concatenate(chunks[:2])], top_k=2, cache_dir=tmp_path)
    assert model.positions == ran + len(chunks[0]) + len(chunks[1])
    ran = model.positions
    # more top tokens than stored: recomputed (and stored), then a hit
    wider = teacher_force(model, chunks[:2], top_k=3, cache_dir=tmp_path)
    assert model.positions == ran + len(chunks[0]) + len(chunks[1]) and wider.cached_tokens == 0
    assert teacher_force(model, chunks[:2], top_k=3, cache_dir=tmp_path).cached_tokens == wider.tokens
    assert np.array_equal(wider.top_ids[0][:, :2], base.top_ids[0])
    # other weights (another seed, same architecture and names): a miss, and their own answer
    other = CountingModel(tiny_model(1)[0])
    forced = teacher_force(other, chunks[:2], top_k=2, cache_dir=tmp_path)
    assert other.positions == len(chunks[0]) + len(chunks[1]) and forced.cached_tokens == 0
    expected = teacher_force(tiny_model(1)[0], chunks[:2], top_k=2)
    assert all(np.array_equal(a, b) for a, b in zip(forced.argmax, expected.argmax))


def test_log_probs_bypass_the_cache_and_a_torn_entry_is_recomputed(chunks, tmp_path) -> None:
    model = CountingModel(tiny_model(0)[0])
    teacher_force(model, chunks[:1], cache_dir=tmp_path)
    ran = model.positions
    full = teacher_force(model, chunks[:1], log_probs=True, cache_dir=tmp_path)
    assert model.positions == 2 * ran and full.log_probs is not None
    for entry in tmp_path.rglob("*.npz"):
        entry.write_bytes(b"not an npz")
    again = teacher_force(model, chunks[:1], cache_dir=tmp_path)
    assert model.positions == 3 * ran and again.argmax[0].tolist() == full.argmax[0].tolist()


def test_an_interrupted_pass_keeps_the_groups_it_finished(chunks, tmp_path) -> None:
    """With a cache the chunks run in groups of CACHE_GROUP_BATCHES batches, each stored when done."""
    model = CountingModel(tiny_model(0)[0])

    first_group = len(chunks[0]) + len(chunks[1])  # batch_tokens=1: groups close after 8+ tokens: 7 + 33

    def stop_after_the_first_group(n: int) -> None:
        if model.positions > first_group:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        teacher_force(model, chunks, batch_tokens=1, cache_dir=tmp_path, advance=stop_after_the_first_group)
    assert len(list(tmp_path.rglob("*.npz"))) == 2
    again = teacher_force(model, chunks, batch_tokens=1, cache_dir=tmp_path)
    assert again.cached_tokens == first_group < again.tokens
