"""Deterministic builds (issue 22): the same build command gives the same atom set, bit for bit,
whether the teacher labels come from the label cache, are computed, are partly cached, or are
computed in batches of another size; and teacher forcing gives a chunk the same labels alone as
in any batch.

Only the keys in VOLATILE may differ between two runs of one command: how long the stages took,
how many bytes the atoms partition takes on disk (the GiST's buffering build and the free-space map
vary by a few pages), and how the teacher labels were obtained (cache hits, batch size), never what they are.
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import psycopg
import pytest
import torch
from threadpoolctl import threadpool_info, threadpool_limits

from hartonomous.atomset import AtomRows
from hartonomous.corpus.teacher import teacher_force
from hartonomous.threads import fixed_threads, machine_threads
from projection.build import BuildOptions, build
from projection.reproducibility import atoms_digest
from projection.stages import load_texts
from tiny_model import tiny_model

SENTENCES = [
    "The capital of France is Paris.", "The capital of Italy is Rome.", "Return the sum of the numbers.",
    "Raise ValueError if the list is empty.", "def add(a, b): return a + b", "héllo wörld, 東京 🙂",
    "Return a new list with the items sorted.", "The value of the flag is True.",
]

# Stats that may differ between two runs of the same command ("[]": every element of a list).
VOLATILE = (
    "projection.seconds", "distill.seconds", "distill.tokens_per_second", "distill.cached_tokens",
    "distill.batch_tokens", "learned_positions.seconds", "learned_positions.curve[].seconds",
    "ingest.copy_seconds", "ingest.index_seconds", "ingest.cluster_seconds", "ingest.total_seconds",
    "ingest.atoms_per_second", "stage_seconds", "ingest.disk_bytes", "ingest.bytes_per_million_atoms",
)
NAME = "det"
CONTROL = NAME + ".random-positions"


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    paragraphs = [" ".join(rng.choice(SENTENCES, size=4)) for _ in range(80)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    return path


def command(corpus: Path, cache: Path | None, **extra) -> BuildOptions:
    """One build command: soft labels, full keys, learned positions and the random-positions
    control, so that every seeded or threaded step of a build is in it."""
    base = dict(name=NAME, kind="context", model="tiny", corpus=[corpus], max_tokens=3000, landmarks=32,
                holdout_chars=1500, context_length=64, batch_tokens=512, window=3, decay=0.5, full_keys=True,
                controls=True,
                positions="learned", epochs=3, learning_rate=0.05, replace=True, teacher_cache=cache)
    return BuildOptions(**{**base, **extra})


def without(stats: dict, path: str) -> None:
    """Delete `path` (dotted; "[]" steps into every element of a list) from `stats`, in place."""
    head, _, rest = path.partition(".")
    if head.endswith("[]"):
        for item in stats.get(head[:-2]) or []:
            without(item, rest)
    elif not rest:
        stats.pop(head, None)
    elif isinstance(stats.get(head), dict):
        without(stats[head], rest)


def stable_stats(stats: dict) -> dict:
    stats = copy.deepcopy(stats)
    for path in VOLATILE:
        without(stats, path)
    return stats


def keys_of(value: Any, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in [f"{prefix}{key}", *keys_of(v, f"{prefix}{key}.")]]
    if isinstance(value, list):
        return [k for v in value for k in keys_of(v, prefix)]
    return []


def snapshot(url: str, name: str) -> dict[str, Any]:
    """Everything stored of a set but its id, creation time and default flag; stats without VOLATILE."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT to_jsonb(s) - 'id' - 'created_at' - 'is_default' - 'stats', s.stats, s.id "
                           "FROM atom_sets s WHERE name = %s", (name,)).fetchone()
        set_id = row[2]

        def rows(sql: str) -> list[tuple]:
            return conn.execute(sql, (set_id,)).fetchall()

        return {
            "row": row[0], "stats": stable_stats(row[1]),
            "atoms": rows("SELECT atom_id, token_id, ST_AsEWKB(position), weight, key::text FROM atoms "
                          "WHERE atom_set_id = %s ORDER BY atom_id"),
            "tokens": rows("SELECT token_id, text, ST_AsEWKB(position), embedding::text FROM tokens "
                           "WHERE atom_set_id = %s ORDER BY token_id"),
            "token_blocks": rows("SELECT block, xs::text, ys::text, zs::text FROM token_blocks WHERE atom_set_id = %s ORDER BY block"),
            "landmarks": rows("SELECT landmark_id, embedding::text, ST_AsEWKB(position) FROM landmarks "
                              "WHERE atom_set_id = %s ORDER BY landmark_id"),
        }


def run(url: str, options: BuildOptions) -> tuple[dict, dict, Any]:
    """Build; the set's and its control's snapshots, and the build's result."""
    model, tokenizer = tiny_model(0)
    with psycopg.connect(url) as conn:
        result = build(conn, options, model=model, tokenizer=tokenizer)
    return snapshot(url, NAME), snapshot(url, CONTROL), result


def assert_same(a: dict, b: dict) -> None:
    for part in a:  # part by part, so that a failure names what differs
        assert a[part] == b[part], f"{part} differs"


@pytest.fixture(scope="module")
def reference(server_url: str, corpus_file: Path, tmp_path_factory):
    """The command run once with an empty teacher-label cache (which it fills)."""
    cache = tmp_path_factory.mktemp("cache-reference")
    return (*run(server_url, command(corpus_file, cache)), cache)


def test_the_reference_build_is_complete(reference) -> None:
    main, control, result, _ = reference
    assert main["atoms"] and main["tokens"] and control["atoms"]
    assert main["landmarks"] == []  # learned positions are no projection: no landmarks
    assert main["row"]["projection"] == "learned" and main["row"]["risk_model"] is not None
    assert result.stats.distill.cached_tokens == 0 and result.stats.learned_positions.curve
    assert all(a[4] is not None for a in main["atoms"])  # full keys
    # every timing the build records is in VOLATILE: none is left in what is compared
    left = [k for part in (main, control) for k in keys_of(part["stats"]) if "second" in k]
    assert left == []


def test_the_same_command_twice_with_empty_caches_gives_the_same_set(server_url, corpus_file, reference,
                                                                      tmp_path) -> None:
    main, control, result = run(server_url, command(corpus_file, tmp_path))
    assert result.stats.distill.cached_tokens == 0
    assert_same(reference[0], main)
    assert_same(reference[1], control)


def test_a_warm_cache_gives_the_same_set(server_url, corpus_file, reference) -> None:
    main, control, result = run(server_url, command(corpus_file, reference[3]))
    assert result.stats.distill.cached_tokens == result.stats.distill.tokens > 0  # nothing ran
    assert_same(reference[0], main)
    assert_same(reference[1], control)


def test_a_partly_cached_pass_in_batches_of_another_size_gives_the_same_set(server_url, corpus_file, reference,
                                                                            tmp_path) -> None:
    """Every other chunk is cached by a pass of one chunk per batch; the build runs the rest in
    batches of 3 chunks (192 tokens), so no batch of the reference's comes back."""
    options = command(corpus_file, tmp_path, batch_tokens=192)
    model, tokenizer = tiny_model(0)
    texts = load_texts(options, tokenizer)
    chunks = texts.train_chunks + texts.calibration_chunks
    teacher_force(model, chunks[::2], batch_tokens=1, top_k=options.soft_k, cache_dir=tmp_path)
    main, control, result = run(server_url, options)
    assert 0 < result.stats.distill.cached_tokens < result.stats.distill.tokens
    assert_same(reference[0], main)
    assert_same(reference[1], control)


def test_a_build_without_a_cache_gives_the_same_set(server_url, corpus_file, reference) -> None:
    main, control, _ = run(server_url, command(corpus_file, None, batch_tokens=100_000))
    assert_same(reference[0], main)
    assert_same(reference[1], control)


def test_the_thread_counts_a_caller_left_behind_do_not_change_the_set(server_url, corpus_file, reference) -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            main, control, _ = run(server_url, command(corpus_file, None))
            assert torch.get_num_threads() == 1  # and the build left them as they were
    finally:
        torch.set_num_threads(before)
    assert_same(reference[0], main)
    assert_same(reference[1], control)


def test_the_stats_digest_is_that_of_the_atoms_stored(server_url, reference) -> None:
    with psycopg.connect(server_url) as conn:
        rows = conn.execute("SELECT token_id, ST_X(position), ST_Y(position), ST_Z(position), weight, key::text "
                            "FROM atoms a JOIN atom_sets s ON s.id = a.atom_set_id WHERE s.name = %s "
                            "ORDER BY atom_id", (NAME,)).fetchall()
    stored = AtomRows(np.array([r[0] for r in rows]), np.array([r[1:4] for r in rows]), np.array([r[4] for r in rows]),
                      np.array([json.loads(r[5]) for r in rows], dtype=np.float32))
    record = reference[0]["stats"]["reproducibility"]
    assert record["atoms_sha256"] == atoms_digest(stored)
    assert record["threads"] == machine_threads() and record["versions"]["torch"] == torch.__version__


def test_fixed_threads_pin_torch_and_blas_and_restore_them() -> None:
    before = torch.get_num_threads()
    with threadpool_limits(limits=1):
        with fixed_threads(2) as count:
            assert count == 2 and torch.get_num_threads() == 2
            assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {2}
        assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {1}
    assert torch.get_num_threads() == before


def test_an_eigendecomposition_inside_fixed_threads_ignores_the_callers_thread_count() -> None:
    """LAPACK's eigh rounds differently on 1 and 2 BLAS threads; inside fixed_threads the caller's
    setting no longer matters (on a one-CPU machine both runs use one thread anyway)."""
    x = np.random.default_rng(0).normal(size=(2000, 300))
    cov = np.cov(x, rowvar=False)
    results = []
    for outer in (1, machine_threads()):
        with threadpool_limits(limits=outer), fixed_threads():
            results.append(np.linalg.eigh(cov)[1])
    assert results[0].tobytes() == results[1].tobytes()


def test_volatile_keys_are_removed_and_nothing_else() -> None:
    stats = {"distill": {"seconds": 1.0, "tokens": 5}, "learned_positions": {"curve": [{"seconds": 2, "epoch": 0}]},
             "ingest": {"atoms": 3, "total_seconds": 0.5}, "bandwidth": {"h": 0.1}}
    assert stable_stats(stats) == {"distill": {"tokens": 5}, "learned_positions": {"curve": [{"epoch": 0}]},
                                   "ingest": {"atoms": 3}, "bandwidth": {"h": 0.1}}
    assert stats["distill"]["seconds"] == 1.0  # the input is left alone


# --- teacher forcing: a chunk's labels do not depend on its batch ----------------------------------

@pytest.fixture(scope="module")
def chunks() -> list[np.ndarray]:
    """Chunks of a few lengths, several of each: batches of equal lengths and lone short ones."""
    model, _ = tiny_model(0)
    rng = np.random.default_rng(3)
    lengths = [48, 48, 48, 48, 48, 31, 48, 31, 7, 1, 48]
    return [rng.integers(0, model.config.vocab_size, n) for n in lengths]


def assert_bit_identical(a, b) -> None:
    for name in ("argmax", "top_ids", "top_probs"):
        for x, y in zip(getattr(a, name), getattr(b, name), strict=True):
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name


@pytest.mark.parametrize("batch_tokens", [1, 100, 150, 10_000])
def test_a_chunk_gets_the_same_labels_alone_as_in_any_batch(chunks, batch_tokens: int) -> None:
    model, _ = tiny_model(0)
    batched = teacher_force(model, chunks, batch_tokens, top_k=5)
    for i, chunk in enumerate(chunks):
        alone = teacher_force(model, [chunk], top_k=5)
        assert_bit_identical(alone, replace(batched, argmax=batched.argmax[i:i + 1], top_ids=batched.top_ids[i:i + 1],
                                            top_probs=batched.top_probs[i:i + 1]))


def test_cached_labels_are_the_computed_ones_whatever_was_cached_with_them(chunks, tmp_path) -> None:
    model, _ = tiny_model(0)
    computed = teacher_force(model, chunks, 10_000, top_k=5)
    teacher_force(model, chunks[1::3], 1, top_k=5, cache_dir=tmp_path)      # some alone, in the cache
    partly = teacher_force(model, chunks, 150, top_k=5, cache_dir=tmp_path)  # the rest in other batches
    assert 0 < partly.cached_tokens < partly.tokens
    warm = teacher_force(model, chunks, 100, top_k=5, cache_dir=tmp_path)
    assert warm.cached_tokens == warm.tokens
    assert_bit_identical(computed, partly)
    assert_bit_identical(computed, warm)


class BatchVariantModel(torch.nn.Module):
    """The tiny model with a body whose rows change with the batch size, as some devices' kernels do."""

    def __init__(self, model) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config

    @property
    def base_model(self):
        def body(input_ids, use_cache):
            hidden = self.inner.base_model(input_ids=input_ids, use_cache=use_cache).last_hidden_state
            return SimpleNamespace(last_hidden_state=hidden * (1 + 2.0 ** -12 * (len(input_ids) - 1)))

        return body

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()


def test_where_batches_change_a_row_chunks_run_one_by_one(chunks) -> None:
    model = BatchVariantModel(tiny_model(0)[0])
    batched = teacher_force(model, chunks, 150, top_k=5)
    assert model._hartonomous_batch_invariant and not any(model._hartonomous_batch_invariant.values())
    for i, chunk in enumerate(chunks):
        alone = teacher_force(model, [chunk], top_k=5)
        assert alone.top_probs[0].tobytes() == batched.top_probs[i].tobytes()
        assert alone.top_ids[0].tobytes() == batched.top_ids[i].tobytes()
