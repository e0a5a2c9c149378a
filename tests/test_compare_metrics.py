"""Comparison metrics, entropy signals, n-gram baselines: hand-computed values (no database)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hartonomous.compare import metrics as m
from hartonomous.compare.fidelity import Fidelity, by_position, distribution, evaluate_text, summarise_path
from hartonomous.compare.infinigram import InfiniGram
from hartonomous.compare.labels import from_sequences
from hartonomous.compare.ngram import NGram, fit_all
from hartonomous.compare.signals import signals

LN2 = math.log(2.0)


def sparse(mapping: dict[int, float]) -> m.Sparse:
    return m.Sparse.of(list(mapping), list(mapping.values()))


def as_dict(dist: m.Sparse) -> dict[int, float]:
    return dict(zip(dist.ids.tolist(), dist.probs.tolist()))


def test_identical_distributions_js_zero_pearson_one():
    p = np.array([0.30, 0.20, 0.15, 0.10, 0.08, 0.06, 0.04, 0.03, 0.02, 0.01, 0.006, 0.004])
    q = sparse(dict(enumerate(p)))
    assert m.js_to_exact(p, q) == pytest.approx(0.0, abs=1e-12)
    assert m.js_divergence(p, p) == pytest.approx(0.0, abs=1e-12)
    assert m.pearson_union(p, q) == pytest.approx(1.0)
    assert m.pearson_full_vocab(p, q) == pytest.approx(1.0)
    assert m.top1_agreement(p, q)
    assert m.top_k_overlap(p, q) == 1.0
    assert m.mass_covered(p, q) == pytest.approx(1.0)
    assert m.exact_prob_of_argmax(p, q) == pytest.approx(0.30)


def test_disjoint_supports_js_is_ln2_nats():
    p = np.array([0.5, 0.5, 0.0, 0.0])
    q = sparse({2: 0.5, 3: 0.5})
    assert m.js_to_exact(p, q) == pytest.approx(LN2)
    assert m.js_divergence(p, q.dense(4)) == pytest.approx(LN2)
    assert m.mass_covered(p, q) == 0.0
    assert m.exact_prob_of_argmax(p, q) == 0.0  # q's argmax is token 2 (tie -> lower id)
    assert not m.top1_agreement(p, q)


def test_half_overlap_js_by_hand():
    # p = [.5, .5, 0], q = [.5, 0, .5]: m = [.5, .25, .25]; KL(p||m) = KL(q||m) = .5 ln 2
    p = np.array([0.5, 0.5, 0.0])
    q = sparse({0: 0.5, 2: 0.5})
    assert m.js_to_exact(p, q) == pytest.approx(0.5 * LN2)


def test_sparse_js_equals_dense_formula():
    p = np.array([0.4, 0.3, 0.2, 0.1])
    q = sparse({1: 0.5, 3: 0.5})
    # m = [.2, .4, .1, .3]
    kl_pm = 0.4 * math.log(2) + 0.3 * math.log(0.75) + 0.2 * math.log(2) + 0.1 * math.log(1 / 3)
    kl_qm = 0.5 * math.log(0.5 / 0.4) + 0.5 * math.log(0.5 / 0.3)
    assert m.js_to_exact(p, q) == pytest.approx(0.5 * kl_pm + 0.5 * kl_qm)
    assert m.js_divergence(p, q.dense(4)) == pytest.approx(0.5 * kl_pm + 0.5 * kl_qm)


def test_pearson_by_hand():
    # deviations from 1/3: x = [11, -4, -7]/30, y = [-7, -4, 11]/30 -> r = -138 / 186
    x = np.array([0.7, 0.2, 0.1])
    y = sparse({0: 0.1, 1: 0.2, 2: 0.7})
    assert m.pearson(x, y.dense(3)) == pytest.approx(-138 / 186)
    assert m.pearson_full_vocab(x, y) == pytest.approx(-138 / 186)


def test_pearson_union_uses_candidates_and_exact_nucleus():
    exact = np.array([0.995, 0.003, 0.001, 0.001])
    assert m.nucleus(exact).tolist() == [0]  # 0.995 >= 0.99 already
    q = sparse({1: 1.0})
    assert m.union_support(exact, q).tolist() == [0, 1]
    assert m.pearson_union(exact, q) == pytest.approx(-1.0)  # two points, opposite order
    # full vocabulary: compare with numpy's own correlation
    assert m.pearson_full_vocab(exact, q) == pytest.approx(np.corrcoef(exact, q.dense(4))[0, 1])


def test_pearson_undefined_when_union_has_one_token():
    exact = np.array([1.0, 0.0, 0.0])
    assert math.isnan(m.pearson_union(exact, sparse({0: 1.0})))
    assert math.isnan(m.pearson_full_vocab(exact, m.Sparse.empty()))


def test_top10_overlap_and_ties():
    exact = np.arange(20, 0, -1, dtype=float)
    exact /= exact.sum()  # token 0 most probable, ..., token 19 least
    half = sparse({**{i: 0.1 for i in range(5)}, **{i: 0.1 for i in range(15, 20)}})
    assert m.top_k_overlap(exact, half) == 0.5
    assert m.top_k_overlap(exact, sparse({0: 0.5, 1: 0.3, 2: 0.2})) == pytest.approx(0.3)
    assert m.argmax(sparse({5: 0.5, 3: 0.5})) == 3
    assert m.ranked(np.array([7, 2, 9]), np.array([0.2, 0.4, 0.4])).tolist() == [2, 9, 7]
    tied = np.array([0.25, 0.25, 0.25, 0.25])
    assert m.exact_ranked(tied, 2).tolist() == [0, 1]
    flat_ids = np.arange(100, 0, -1)  # 100 equal probabilities: the top 3 are the lowest ids
    assert m.ranked(flat_ids, np.full(100, 0.01), 3).tolist() == [1, 2, 3]
    assert m.argmax(m.Sparse(flat_ids, np.full(100, 0.01))) == 1


def test_smoothing_and_perplexity():
    q = sparse({1: 0.5, 2: 0.5})
    assert m.smoothed_prob(q, 1, 4, eps=0.1) == pytest.approx(0.9 * 0.5 + 0.1 / 4)
    assert m.smoothed_prob(q, 0, 4, eps=0.1) == pytest.approx(0.025)
    assert m.in_support(q, 2) and not m.in_support(q, 0)
    assert m.perplexity(np.array([LN2, math.log(8)])) == pytest.approx(4.0)


def test_entropy_signals_by_hand():
    uniform = signals(np.full(4, 0.25), nll=math.log(4))
    assert uniform.H == pytest.approx(math.log(4))
    assert uniform.H2 == pytest.approx(math.log(4))
    assert uniform.V == pytest.approx(0.0, abs=1e-12)
    assert uniform.R == pytest.approx(0.0, abs=1e-12)
    assert uniform.calibration_gap == pytest.approx(0.0, abs=1e-12)
    s = signals(np.array([0.5, 0.25, 0.25, 0.0]), nll=math.log(4))
    assert s.H == pytest.approx(1.5 * LN2)
    assert s.H2 == pytest.approx(math.log(8 / 3))  # -ln(1/4 + 1/16 + 1/16)
    assert s.V == pytest.approx(0.25 * LN2 ** 2)  # -ln p is ln2 or 2 ln2, each with mass 1/2
    assert s.R == pytest.approx(math.log(8 / 3) - 1.5 * LN2 + 0.125 * LN2 ** 2)
    assert s.calibration_gap == pytest.approx(0.5 * LN2)


def test_distilled_ngrams_with_backoff():
    seq = [1, 2, 3, 1, 2, 4]
    labels = [2, 3, 1, 2, 4, 9]  # labels[t]: the exact argmax after seq[: t + 1]
    models = fit_all([seq], [labels])
    assert as_dict(models["unigram"].predict([1, 2])) == pytest.approx(
        {2: 2 / 6, 3: 1 / 6, 1: 1 / 6, 4: 1 / 6, 9: 1 / 6})
    assert as_dict(models["bigram"].predict([5, 2])) == {3: 0.5, 4: 0.5}
    assert as_dict(models["trigram"].predict([3, 1])) == {2: 1.0}
    assert as_dict(models["trigram"].predict([3, 1, 2])) == {3: 0.5, 4: 0.5}  # [1, 2] twice
    four = models["4-gram"]
    assert as_dict(four.predict([3, 1, 2])) == {4: 1.0}
    assert four.backoff_order([7, 1, 2]) == 3  # [7, 1, 2] unseen -> [1, 2]
    assert four.backoff_order([99]) == 1  # unseen token -> unigram
    empty = NGram(InfiniGram(from_sequences([], [])), 2)   # nothing fitted
    assert empty.backoff_order([1]) == 0 and len(empty.predict([1])) == 0


def test_teacher_forced_evaluation_summary():
    # Vocabulary of 3; text 0 -> 1 -> 2; exact distributions chosen by hand.
    exact = torch.log(torch.tensor([[0.1, 0.8, 0.1], [0.2, 0.2, 0.6]]))
    always_one = lambda ctx: sparse({1: 1.0})  # noqa: E731
    fid = Fidelity()
    evaluate_text(fid, 0, [0, 1, 2], exact, {"spatial": always_one}, eps=0.1)
    col = fid.paths["spatial"]
    assert fid.n == 2 and fid.target == [1, 2] and fid.exact_argmax == [1, 2]
    assert col.array("top1").tolist() == [1.0, 0.0]
    assert col.array("mass_covered").tolist() == pytest.approx([0.8, 0.2])
    assert col.array("target_in_support").tolist() == [1.0, 0.0]
    # smoothed: p'(1) = .9 + .1/3 at position 0; p'(2) = .1/3 at position 1
    nll = [-math.log(0.9 + 0.1 / 3), -math.log(0.1 / 3)]
    assert col.array("nll").tolist() == pytest.approx(nll)
    summary = summarise_path(col)
    assert summary["top1"]["mean"] == 0.5
    assert summary["perplexity"] == pytest.approx(math.exp(sum(nll) / 2))
    assert summary["pearson"]["n"] + summary["pearson"]["undefined"] == 2
    assert fid.exact.array("nll").tolist() == pytest.approx([-math.log(0.8), -math.log(0.6)])
    bins = by_position(fid)["bins"]
    assert [(b["from"], b["to"], b["values"]["spatial"]) for b in bins] == [(1, 1, 1.0), (2, None, 0.0)]


def test_distribution_counts_undefined():
    d = distribution(np.array([1.0, float("nan"), 3.0]))
    assert (d["n"], d["undefined"], d["mean"], d["median"]) == (2, 1, 2.0, 2.0)
    assert distribution(np.array([]))["mean"] is None


def test_every_path_sees_the_whole_context_up_to_each_position():
    """No path is handed a cut context: history atoms and the in-context cache read all of it."""
    seen: dict[str, list[list[int]]] = {"spatial": [], "other": []}

    def recorder(name):
        return lambda ctx: seen[name].append(list(ctx)) or sparse({0: 1.0})

    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    exact = torch.log_softmax(torch.zeros(len(ids), 10), dim=-1)
    evaluate_text(Fidelity(), 0, ids, exact, {"spatial": recorder("spatial"), "other": recorder("other")})
    assert seen["spatial"] == seen["other"] == [ids[: t + 1] for t in range(len(ids) - 1)]
