"""Atom building blocks without a database: corpus split, distillation, keys, merging, calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hartonomous.errors import UserError
from hartonomous.kernel import token_logits
from projection.atoms import context_atoms, merge_atoms, token_atoms
from projection.calibrate import calibrate_bandwidth, nearest_atoms, score
from hartonomous.corpus.sources import Document, segments, split_corpus, stdlib_documents
from projection.distill import chunk_ids, distill
from hartonomous.atomset import AtomRows
from tiny_model import tiny_model

POS = np.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 4.0]])


def test_context_atom_keys_are_the_prefix_centroids_and_values_the_next_token() -> None:
    chunk = np.array([1, 2, 3])
    argmax = [np.array([3, 0, 2])]
    atoms = context_atoms([chunk], argmax, POS, window=2, decay=0.5)
    # t=0: p1; t=1: (p2 + 0.5 p1) / 1.5  (the last position has no next token in the chunk)
    assert atoms.positions == pytest.approx(np.array([[1.0, 0.0, 0.0], [0.5 / 1.5, 2.0 / 1.5, 0.0]]))
    assert atoms.token_ids.tolist() == [3, 0]
    corpus = context_atoms([chunk], None, POS, window=2, decay=0.5, target="corpus")
    assert corpus.token_ids.tolist() == [2, 3]
    with pytest.raises(UserError, match="--target"):
        context_atoms([chunk], argmax, POS, 2, 0.5, target="bogus")


def test_full_dimensional_keys_use_the_same_centroid() -> None:
    emb = np.arange(20, dtype=np.float32).reshape(4, 5)
    atoms = context_atoms([np.array([0, 3, 1])], [np.array([1, 1, 1])], POS, None, 1.0, token_embeddings=emb)
    assert atoms.keys == pytest.approx(np.stack([emb[0], (emb[0] + emb[3]) / 2]))


def test_token_atoms_are_one_per_token_at_its_position() -> None:
    atoms = token_atoms(POS)
    assert atoms.token_ids.tolist() == [0, 1, 2, 3]
    assert atoms.positions == pytest.approx(POS)


def test_merge_exact_duplicates_sums_weights_and_keeps_points() -> None:
    p, q = [0.1, 0.2, 0.3], [1.0, 1.0, 1.0]
    atoms = AtomRows(np.array([1, 1, 2, 1]), np.array([p, p, p, q]), None,
                     np.array([[1.0], [3.0], [5.0], [7.0]], dtype=np.float32))
    merged = merge_atoms(atoms, 0.0)
    rows = sorted(zip(merged.token_ids.tolist(), map(tuple, merged.positions.tolist()), merged.weights.tolist(),
                      merged.keys[:, 0].tolist()))
    assert rows == [(1, tuple(p), 2.0, 2.0), (1, tuple(q), 1.0, 7.0), (2, tuple(p), 1.0, 5.0)]


def test_merge_radius_merges_near_atoms_of_one_token_into_their_weighted_mean() -> None:
    atoms = AtomRows(np.array([4, 4, 4, 5]), np.array([[0.0, 0, 0], [0.01, 0, 0], [5.0, 0, 0], [0.0, 0, 0]]),
                     np.array([1.0, 3.0, 1.0, 1.0]))
    merged = merge_atoms(atoms, 0.5)
    assert len(merged.token_ids) == 3
    i = [k for k in range(3) if merged.token_ids[k] == 4 and merged.weights[k] == 4.0][0]
    assert merged.positions[i] == pytest.approx([0.0075, 0.0, 0.0])
    assert merged.weights.sum() == pytest.approx(6.0)
    with pytest.raises(UserError, match="--merge-radius"):
        merge_atoms(atoms, -1.0)


def test_score_matches_the_kernel_reference_and_a_hand_computed_case() -> None:
    # query at the origin; token 5 at distance 1, token 7 at distances 1 and 2; h = 1 (gaussian)
    atoms = np.array([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 2.0]])
    nb = nearest_atoms(atoms, np.array([5, 7, 7]), None, np.zeros((1, 3)), k=3)
    s = score(nb, np.array([7]), 1.0, "gaussian", vocab_size=10, smoothing=0.0)
    expected = (math.exp(-1) + math.exp(-4)) / (2 * math.exp(-1) + math.exp(-4))
    assert math.exp(s.log_probs[0]) == pytest.approx(expected)
    assert s.argmax.tolist() == [7] and s.top1 == 1.0 and s.coverage == 1.0

    rng = np.random.default_rng(0)
    pos, tok, w = rng.normal(size=(200, 3)), rng.integers(0, 12, 200), rng.uniform(0.5, 3, 200)
    queries = rng.normal(size=(25, 3))
    nb = nearest_atoms(pos, tok, w, queries, k=30)
    for kernel, h in (("gaussian", 0.7), ("exponential", 0.3)):
        targets = tok[nb_first := np.argsort(((pos[None] - queries[:, None]) ** 2).sum(-1), axis=1)[:, 0]]
        s = score(nb, targets, h, kernel, vocab_size=12, smoothing=0.0)
        for q in range(len(queries)):
            d = np.sqrt(((pos - queries[q]) ** 2).sum(1))
            near = np.argsort(d)[:30]
            ids, logits = token_logits(tok[near], d[near], w[near], kernel, h)
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            assert s.log_probs[q] == pytest.approx(np.log(probs[list(ids).index(targets[q])]), abs=1e-9)
            assert s.argmax[q] == ids[np.argmax(logits)]
        assert nb_first is not None


def test_an_absent_target_costs_the_smoothing_floor() -> None:
    nb = nearest_atoms(np.eye(3), np.array([0, 1, 2]), None, np.zeros((1, 3)), k=2)
    s = score(nb, np.array([9]), 1.0, "gaussian", vocab_size=10, smoothing=1e-3)
    assert s.coverage == 0.0
    assert s.log_probs[0] == pytest.approx(math.log(1e-3 / 10))


def test_calibration_finds_the_bandwidth_with_the_known_optimum() -> None:
    # Token A at 0 and B at 1 on a line; every query sits at 0; 80% of targets are A.
    # p(A) = 1 / (1 + exp(-1/h^2)) = 0.8 at h = 1 / sqrt(ln 4).
    atoms = np.array([[0.0, 0, 0], [1.0, 0, 0]])
    targets = np.array([0] * 800 + [1] * 200)
    nb = nearest_atoms(atoms, np.array([0, 1]), None, np.zeros((1000, 3)), k=2)
    result = calibrate_bandwidth(nb, targets, "gaussian", vocab_size=2)
    assert result["h"] == pytest.approx(1 / math.sqrt(math.log(4)), rel=0.01)
    assert result["top1"] == pytest.approx(0.8)
    assert max(c["log_likelihood"] for c in result["curve"]) == result["log_likelihood"]


def test_segments_split_at_paragraphs_and_the_holdout_is_disjoint_and_seeded() -> None:
    docs = [Document("a", "\n\n".join(f"paragraph {i} " + "x" * 300 for i in range(40)))]
    segs = segments(docs, max_chars=1000)
    assert all(len(s) <= 1000 for s in segs) and len(segs) == 14
    first = split_corpus(docs, "test", holdout_chars=2000, max_train_chars=None, seed=1)
    again = split_corpus(docs, "test", holdout_chars=2000, max_train_chars=None, seed=1)
    assert (first.holdout_text, first.train_text) == (again.holdout_text, again.train_text)
    held = set(first.holdout_text.split("\n\n"))
    train = set(first.train_text.split("\n\n"))
    assert held and train and not held & train
    assert len(held | train) == 40
    holdouts = {split_corpus(docs, "test", 2000, None, seed=s).holdout_text for s in range(5)}
    assert len(holdouts) > 1


def test_the_default_corpus_is_deterministic_stdlib_docstrings() -> None:
    docs = stdlib_documents()
    modules = [d.source.split(".")[0] for d in docs]  # in sorted file order, so deterministic
    assert modules == sorted(modules)
    by_source = {d.source: d.text for d in docs}
    assert by_source["json.dumps"].startswith("Serialize ``obj`` to a JSON formatted ``str``.")
    assert len(docs) > 1000 and len({d.text for d in docs}) == len(docs)


def test_chunking_and_batched_distillation_equal_one_forward_pass_per_chunk() -> None:
    import torch

    model, tokenizer = tiny_model(0)
    ids = np.asarray(tokenizer("The capital of France is Paris. def add(a, b): return a + b " * 3)["input_ids"])
    chunks = chunk_ids(ids, 16)
    assert [len(c) for c in chunks[:-1]] == [16] * (len(chunks) - 1)
    assert np.concatenate(chunks).tolist() == ids[:sum(map(len, chunks))].tolist()
    small = distill(model, chunks, batch_tokens=16)
    large = distill(model, chunks, batch_tokens=10_000)
    with torch.no_grad():
        expected = [model(torch.from_numpy(c)[None]).logits[0].argmax(-1).numpy() for c in chunks]
    for a, b, e in zip(small.argmax, large.argmax, expected):
        assert a.tolist() == e.tolist() and b.tolist() == e.tolist()
    assert small.tokens == sum(map(len, chunks))
    with pytest.raises(UserError, match="--context-length"):
        chunk_ids(ids, 1)
