"""The KNN baseline's NumPy search returns what pgvector's full scan returns: the same neighbours in
the same order at the same distances, ties broken by atom_id, rounding near-ties in pgvector's order."""

from __future__ import annotations

import numpy as np
import pytest

from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, load_atom_set, write_atom_set
from hartonomous.centroid import context_centroid
from hartonomous.compare import baselines, knn
from hartonomous.compare.spatial import KNN_KEYS, knn_distribution

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _write(conn, name: str, keys: np.ndarray, *, window: int | None = None, decay: float = 1.0,
           embeddings: np.ndarray | None = None) -> int:
    """A context set with one token per atom (the token id names the atom) and these keys."""
    n, dim = keys.shape
    vocab = max(n, 0 if embeddings is None else len(embeddings))
    spec = AtomSetSpec(name=name, model="test", vocab_size=vocab, embedding_dim=dim, projection="hand-made",
                       kind="context", kernel="gaussian", bandwidth=1.0, centroid_window=window,
                       centroid_decay=decay)
    rng = np.random.default_rng(1)
    tokens = TokenRows(np.arange(vocab), [None] * vocab, rng.random((vocab, 3)))
    order = rng.permutation(n)                      # atom ids not in key order
    atoms = AtomRows(order, rng.random((n, 3)), rng.uniform(0.5, 2.0, n), keys[order].astype(np.float32))
    return write_atom_set(conn, spec, tokens, atoms).atom_set_id


def _full_scan(conn, literal: str, set_id: int, k: int) -> list[tuple]:
    return conn.execute(KNN_KEYS, (literal, set_id, literal, k)).fetchall()


def _searched(conn, search: knn.KeySearch, literals: list[str], set_id: int, k: int) -> list[list[tuple]]:
    found = search.candidates(np.stack([knn.literal_values(q) for q in literals]), k)
    return [knn.ranked(conn, q, set_id, c, k) for q, c in zip(literals, found)]


def test_the_keys_come_back_whole(conn) -> None:
    keys = np.random.default_rng(0).standard_normal((40, 7)).astype(np.float32)
    set_id = _write(conn, "knn-load", keys)
    search = knn.load_keys(conn, set_id)
    stored = dict(conn.execute("SELECT atom_id, key::real[] FROM atoms WHERE atom_set_id = %s", (set_id,)).fetchall())
    assert len(search) == len(stored) == 40 and search.dim == 7
    for atom_id, key in zip(search.atom_ids.tolist(), search.keys):
        assert key.tolist() == [float(np.float32(v)) for v in stored[atom_id]]


def test_random_keys_with_shared_keys_match_the_full_scan(conn) -> None:
    """Groups of atoms at one key (a soft-labelled position's k atoms) cut by K, and queries sitting on
    a key (distance 0): the lowest atom ids win, as in the full scan."""
    rng = np.random.default_rng(2)
    distinct = rng.standard_normal((300, 48))
    keys = np.concatenate([distinct, np.repeat(distinct[:150], 4, axis=0)])   # 150 keys shared by 5 atoms
    set_id = _write(conn, "knn-random", keys)
    search = knn.load_keys(conn, set_id)
    queries = np.concatenate([rng.standard_normal((25, 48)), distinct[:5], distinct[:5] + 1e-3])
    literals = [knn.vector_literal(q) for q in queries]
    for k in (1, 7, 50):
        assert _searched(conn, search, literals, set_id, k) == [_full_scan(conn, q, set_id, k) for q in literals]


def test_rounding_near_ties_come_in_pgvectors_order(conn) -> None:
    """Permutations of one vector are all at one real distance from a constant query; pgvector's float32
    sums tell them apart by rounding, and that order is the one returned."""
    rng = np.random.default_rng(3)
    base = (rng.standard_normal(96) * rng.choice([1e-3, 1.0, 1e2], 96)).astype(np.float32)
    keys = np.stack([rng.permutation(base) for _ in range(120)] + [base + 50.0] * 10)
    set_id = _write(conn, "knn-near-ties", keys)
    literal = knn.vector_literal(np.full(96, 0.37))
    scanned = _full_scan(conn, literal, set_id, 60)
    assert len({d for _, _, d in scanned}) > 1                  # pgvector's rounding does order them
    assert _searched(conn, knn.load_keys(conn, set_id), [literal], set_id, 60) == [scanned]


def test_the_predictor_scores_every_prefix_as_the_full_scan_does(conn) -> None:
    """KeyKnn (prepared on the text, and unprepared) against knn_distribution, position by position."""
    rng = np.random.default_rng(4)
    vocab, dim, window, decay = 30, 16, 3, 0.5
    emb = rng.standard_normal((vocab, dim))
    contexts = [rng.integers(0, vocab, window) for _ in range(80)]
    centroids = np.stack([context_centroid(emb[c], window, decay) for c in contexts])
    set_id = _write(conn, "knn-predictor", np.repeat(centroids, 3, axis=0), window=window, decay=decay,
                    embeddings=emb)
    info = load_atom_set(conn, "knn-predictor")
    predict = baselines.knn_predictor(conn, info, emb, k=10)
    text = rng.integers(0, vocab, 40).tolist()
    predict.prepare(text)
    for t in range(len(text) - 1):
        ours = predict(text[: t + 1])
        query = context_centroid(emb[np.asarray(text[max(t + 1 - window, 0): t + 1])], window, decay)
        theirs, _ = knn_distribution(conn, query, set_id, 10, info.stats.key_bandwidth)
        assert ours.ids.tolist() == theirs.ids.tolist() and ours.probs.tolist() == theirs.probs.tolist()
    unprepared = baselines.knn_predictor(conn, info, emb, k=10)
    assert unprepared(text[:5]).probs.tolist() == predict(text[:5]).probs.tolist()
