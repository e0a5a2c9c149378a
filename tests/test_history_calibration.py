"""The build's NumPy side of history atoms and soft atoms, without a database: history pairs
equal hartonomous.centroid.history_atoms, scoring with history atoms equals the kernel reference,
weight 0 is exactly the stored-only score, and the weight grid picks the better weight."""

from __future__ import annotations

import numpy as np
import pytest

from hartonomous.atomset import AtomRows
from hartonomous.centroid import context_centroid, history_atoms, prefix_centroids
from hartonomous.kernel import token_logits
from projection.atoms import merge_atoms, soft_context_atoms
from projection.calibrate import nearest_atoms, score, with_history
from projection.history import (HISTORY_GRID, TOP1_TOLERANCE, candidate_points, choose_history_weight,
                                history_pairs, select_top1)


@pytest.mark.parametrize("window,decay,history_window", [(3, 0.5, 512), (None, 1.0, 4), (2, 0.01, 1)])
def test_history_pairs_are_the_history_atoms_of_every_prefix(window, decay, history_window) -> None:
    rng = np.random.default_rng(0)
    positions = rng.normal(size=(30, 3))
    chunks = [rng.integers(0, 30, 12), rng.integers(0, 30, 7)]
    pairs = history_pairs(chunks, positions, window, decay, history_window)
    offset = 0
    for chunk in chunks:
        for t in range(len(chunk) - 1):
            context = chunk[: t + 1]
            keys, tokens = history_atoms(context, positions[context], window, decay, history_window)
            query = context_centroid(positions[context], window, decay)
            mine = pairs.query == offset + t
            assert sorted(pairs.tokens[mine].tolist()) == sorted(tokens.tolist())
            expected = sorted(zip(tokens.tolist(), np.linalg.norm(keys - query, axis=1)))
            got = sorted(zip(pairs.tokens[mine].tolist(), pairs.distances[mine]))
            assert [g[0] for g in got] == [e[0] for e in expected]
            assert [g[1] for g in got] == pytest.approx([e[1] for e in expected], abs=1e-12)
        offset += len(chunk) - 1
    assert pairs.query.max() == offset - 1


def test_scoring_with_history_atoms_is_the_kernel_over_stored_and_history_atoms() -> None:
    rng = np.random.default_rng(1)
    pos, tok, w = rng.normal(size=(60, 3)), rng.integers(0, 9, 60), rng.uniform(0.2, 2, 60)
    token_positions = rng.normal(size=(9, 3))
    chunk = rng.integers(0, 9, 10)
    queries = prefix_centroids(token_positions[chunk], 2, 0.5)[:-1]
    pairs = history_pairs([chunk], token_positions, 2, 0.5, 512)
    nb = with_history(nearest_atoms(pos, tok, w, queries, k=60), pairs.query, pairs.tokens, pairs.distances)
    for h, weight in ((0.5, 3.0), (1.3, 0.3)):
        targets = rng.integers(0, 9, len(queries))
        s = score(nb, targets, h, "gaussian", vocab_size=9, smoothing=0.0, history_weight=weight)
        for q in range(len(queries)):
            mine = pairs.query == q
            ids_all = np.concatenate([tok, pairs.tokens[mine]])
            dist = np.concatenate([np.linalg.norm(pos - queries[q], axis=1), pairs.distances[mine]])
            weights = np.concatenate([w, np.full(mine.sum(), weight)])
            ids, logits = token_logits(ids_all, dist, weights, "gaussian", h)
            probs = np.exp(logits - logits.max())
            probs /= probs.sum()
            p = probs[list(ids).index(targets[q])] if targets[q] in ids else 0.0
            assert np.exp(s.log_probs[q]) == pytest.approx(p, abs=1e-12)
            assert s.argmax[q] == ids[np.argmax(logits)]


def test_history_weight_zero_is_exactly_the_stored_only_score() -> None:
    rng = np.random.default_rng(2)
    pos, tok = rng.normal(size=(80, 3)), rng.integers(0, 7, 80)
    token_positions = rng.normal(size=(7, 3))
    chunk = rng.integers(0, 7, 20)
    queries = prefix_centroids(token_positions[chunk], 3, 0.3)[:-1]
    stored = nearest_atoms(pos, tok, None, queries, k=10)
    pairs = history_pairs([chunk], token_positions, 3, 0.3, 512)
    targets = chunk[1:]
    plain = score(stored, targets, 0.8, "gaussian", 7)
    off = score(with_history(stored, pairs.query, pairs.tokens, pairs.distances), targets, 0.8, "gaussian", 7,
                history_weight=0.0)
    assert np.array_equal(plain.log_probs, off.log_probs) and np.array_equal(plain.argmax, off.argmax)
    assert plain.coverage == off.coverage


def test_the_grid_picks_history_when_the_text_repeats_itself() -> None:
    """Stored atoms know nothing (one far atom of token 0); the text repeats a cycle, so the
    history atoms predict its next token and a positive weight must win; weight 0 is in the grid."""
    rng = np.random.default_rng(3)
    token_positions = rng.normal(size=(6, 3))
    chunk = np.tile(np.arange(1, 6), 8)
    queries = prefix_centroids(token_positions[chunk], 2, 0.5)[:-1]
    targets = chunk[1:]
    stored = nearest_atoms(np.array([[50.0, 50, 50]]), np.array([0]), None, queries, k=1)
    stored_record = {"h": 1.0, "top1": 0.0, "log_likelihood": score(stored, targets, 1.0, "gaussian", 6).log_likelihood,
                     "coverage": 0.0}
    pairs = history_pairs([chunk], token_positions, 2, 0.5, 512)
    choice = choose_history_weight(stored, stored_record, pairs, targets, "gaussian", 6, "log-likelihood")
    assert [r["history_weight"] for r in choice.grid] == list(HISTORY_GRID)
    assert choice.weight > 0
    best = max(choice.grid, key=lambda r: r["log_likelihood"])
    assert best["history_weight"] == choice.weight and best["top1"] > 0.8


def point(weight: float, h: float, top1: float, log_likelihood: float) -> dict:
    return {"history_weight": weight, "h": h, "top1": top1, "log_likelihood": log_likelihood}


def test_top1_selection_prefers_top1_and_breaks_near_ties_by_log_likelihood() -> None:
    """A synthetic grid shaped like the 20K calibration: a light weight with a wide h has the best
    log-likelihood but worse top-1; the top1 criterion must not take it."""
    grid = [point(0.0, 0.058, 0.276, -6.46), point(0.3, 0.70, 0.249, -5.25), point(30.0, 0.058, 0.266, -5.98),
            point(100.0, 0.05, 0.279, -6.80)]
    # 0.276 is within the tolerance of the best (0.279) and has the better log-likelihood
    assert select_top1(grid) == grid[0]
    # without a tolerance the best top-1 wins outright
    assert select_top1(grid, tolerance=0.0) == grid[3]
    # a point just outside the tolerance never wins on log-likelihood
    far = point(1.0, 0.3, 0.279 - TOP1_TOLERANCE - 0.001, -1.0)
    assert select_top1([*grid, far]) == grid[0]
    # exact ties on both: the smaller weight, then the smaller h
    tied = [point(3.0, 0.2, 0.3, -5.0), point(1.0, 0.4, 0.3, -5.0), point(1.0, 0.1, 0.3, -5.0)]
    assert select_top1(tied) == tied[2]
    with pytest.raises(ValueError):
        select_top1([])


def test_candidates_are_every_point_of_every_weights_curve_unless_h_was_given() -> None:
    records = [{"history_weight": 0.0, "h": 1.0, "top1": 0.2, "log_likelihood": -3.0,
                "curve": [{"h": 0.5, "top1": 0.25, "log_likelihood": -3.5}, {"h": 1.0, "top1": 0.2, "log_likelihood": -3.0}]},
               {"history_weight": 10.0, "h": 0.7, "top1": 0.3, "log_likelihood": -2.0,
                "curve": [{"h": 0.7, "top1": 0.3, "log_likelihood": -2.0}]}]
    assert candidate_points(records, fixed_h=False) == [point(0.0, 0.5, 0.25, -3.5), point(0.0, 1.0, 0.2, -3.0),
                                                        point(10.0, 0.7, 0.3, -2.0)]
    assert candidate_points(records, fixed_h=True) == [point(0.0, 1.0, 0.2, -3.0), point(10.0, 0.7, 0.3, -2.0)]


def cycle_case():
    """Stored atoms of one token that never comes next, near every query, and a text that repeats a cycle."""
    rng = np.random.default_rng(3)
    token_positions = rng.normal(size=(6, 3))
    chunk = np.tile(np.arange(1, 6), 8)
    queries = prefix_centroids(token_positions[chunk], 2, 0.5)[:-1]
    targets = chunk[1:]
    stored = nearest_atoms(np.array([[50.0, 50, 50]]), np.array([0]), None, queries, k=1)
    from projection.calibrate import calibrate_bandwidth
    stored_record = calibrate_bandwidth(stored, targets, "gaussian", 6)
    return stored, stored_record, history_pairs([chunk], token_positions, 2, 0.5, 512), targets


def test_the_top1_criterion_chooses_weight_and_h_among_all_scored_points() -> None:
    stored, stored_record, pairs, targets = cycle_case()
    choice = choose_history_weight(stored, stored_record, pairs, targets, "gaussian", 6, "log-likelihood",
                                   criterion="top1")
    assert choice.criterion == "top1" and [r["history_weight"] for r in choice.grid] == list(HISTORY_GRID)
    # every weight's whole bandwidth curve is a candidate, and the choice is select_top1 over them
    assert len(choice.candidates) == sum(len(r["curve"]) for r in choice.records)
    chosen = select_top1(choice.candidates)
    assert (choice.weight, choice.final["h"]) == (chosen["history_weight"], chosen["h"]) and choice.weight > 0
    # the final record is the chosen point rescored: the same top-1 and log-likelihood
    assert (choice.final["top1"], choice.final["log_likelihood"]) == pytest.approx((chosen["top1"],
                                                                                  chosen["log_likelihood"]))
    assert choice.final["top1"] == max(c["top1"] for c in choice.candidates) > 0.8
    # a given weight: the criterion picks only its h
    fixed = choose_history_weight(stored, stored_record, pairs, targets, "gaussian", 6, "log-likelihood",
                                  grid=(0.0, 3.0), criterion="top1", only=3.0)
    assert fixed.weight == 3.0 and fixed.final["history_weight"] == 3.0
    assert fixed.final["h"] == select_top1([c for c in fixed.candidates if c["history_weight"] == 3.0])["h"]
    # history off: only the stored atoms' curve, no history pairs needed
    off = choose_history_weight(stored, stored_record, None, targets, "gaussian", 6, "log-likelihood",
                                grid=(0.0,), criterion="top1", only=0.0)
    assert off.weight == 0.0 and len(off.candidates) == len(stored_record["curve"])


def test_the_loglik_criterion_is_the_previous_choice() -> None:
    stored, stored_record, pairs, targets = cycle_case()
    choice = choose_history_weight(stored, stored_record, pairs, targets, "gaussian", 6, "log-likelihood",
                                   criterion="loglik")
    best = max(choice.records, key=lambda r: (r["log_likelihood"], r["top1"], -r["history_weight"]))
    assert choice.weight == best["history_weight"] and choice.final is best and choice.candidates == []
    with pytest.raises(ValueError, match="criterion"):
        choose_history_weight(stored, stored_record, pairs, targets, "gaussian", 6, "log-likelihood",
                              criterion="pearson")


def test_soft_atoms_are_the_top_k_at_each_key_and_identical_pairs_sum() -> None:
    positions = np.array([[0.0, 0, 0], [1.0, 0, 0], [0, 1.0, 0]])
    chunk = np.array([1, 1, 1])  # window 1: every prefix has the same centroid
    ids = [np.array([[2, 0], [2, 1], [0, 2]])]
    probs = [np.array([[0.6, 0.3], [0.5, 0.4], [0.9, 0.1]], dtype=np.float32)]
    raw = soft_context_atoms([chunk], ids, probs, positions, 1, 1.0)
    assert raw.token_ids.tolist() == [2, 0, 2, 1]  # the last position has no next token in the chunk
    assert raw.weights == pytest.approx([0.6, 0.3, 0.5, 0.4])
    assert raw.positions == pytest.approx(np.tile(positions[1], (4, 1)))
    merged = merge_atoms(raw, 0.0)
    assert dict(zip(merged.token_ids.tolist(), merged.weights.tolist())) == pytest.approx({0: 0.3, 1: 0.4, 2: 1.1})
    zero = soft_context_atoms([chunk], ids, [np.array([[0.6, 0.0], [0.5, 0.4], [0, 0]], dtype=np.float32)],
                              positions, 1, 1.0)
    assert isinstance(zero, AtomRows) and zero.token_ids.tolist() == [2, 2, 1]
