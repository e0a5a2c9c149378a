"""compare's "against the real text" section: each path scored against the real next token.

The pieces (ECE, the mixture's top-1, the counting gate's features and its choice on the
calibration split, the paired tests) by hand on small arrays; the section end to end on a
hand-made context atom set and the tiny model, as tests/test_compare_report.py builds them.
"""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest
import torch

from hartonomous.augment.calibrate import Walk
from hartonomous.compare.counting import CountingModel, CountingStep, feature_row
from hartonomous.augment.gate import FEATURES
from hartonomous.compare import CompareOptions, run_compare
from hartonomous.compare import real_text as rt
from hartonomous.compare.cache import CachedNGram
from hartonomous.compare.infinigram import InfiniGram
from hartonomous.compare.labels import from_corpus
from hartonomous.compare.metrics import Sparse
from hartonomous.compare.render import to_markdown
from hartonomous.compare.schema import validate_report
from test_compare_report import STATS, TEST, _drop, encode, write_context_set
from tiny_model import tiny_model


# --- the metrics, by hand ----------------------------------------------------------------------

def test_ece_weighs_each_bins_gap_between_accuracy_and_confidence_by_its_share():
    confidence = np.array([0.95, 0.95, 0.55, 0.15, 1.0])
    correct = np.array([1.0, 0.0, 1.0, 0.0, 1.0])
    # bin 9 holds 0.95, 0.95 and 1.0 (the last bin takes 1): accuracy 2/3, confidence 2.9/3
    expected = (abs(2 - 2.9) + abs(1 - 0.55) + abs(0 - 0.15)) / 5
    assert rt.expected_calibration_error(confidence, correct) == pytest.approx(expected)
    assert rt.expected_calibration_error(np.array([0.25, 0.75]), np.array([0.0, 1.0])) == pytest.approx(0.25)


def _walk(rows: list[tuple[np.ndarray, int, list[int], list[float]]]) -> Walk:
    walk = Walk()
    for t, (exact, target, ids, probs) in enumerate(rows):
        walk.add(exact, target, ids, probs, np.zeros(len(FEATURES)), 0, t)
    return walk


def test_the_mixtures_top1_and_confidence_are_those_of_the_mixed_distribution():
    exact = np.array([0.5, 0.3, 0.2, 0.0])
    rows = [(exact, 1, [1, 3], [0.6, 0.4]),      # λ 0.5: [0.25, 0.45, 0.1, 0.2] -> 1 (the target), 0.45
            (exact, 1, [1, 3], [0.6, 0.4]),      # λ 0.1: [0.45, 0.33, 0.18, 0.04] -> 0, 0.45
            (exact, 3, [3], [1.0]),              # λ 0.8: [0.1, 0.06, 0.04, 0.8] -> 3 (the target), 0.8
            (exact, 0, [], [])]                  # no second distribution: λ is 0 there, the exact model's
    lam = np.array([0.5, 0.1, 0.8, 0.3])
    scores = rt.mixture_scores(_walk(rows), lam)
    for i, (e, target, ids, probs) in enumerate(rows):
        weight = lam[i] if ids else 0.0
        mixed = (1 - weight) * e
        mixed[ids] += weight * np.asarray(probs)
        assert scores.top1[i] == float(int(np.argmax(mixed)) == target)
        assert scores.confidence[i] == pytest.approx(mixed.max())
        assert scores.nll[i] == pytest.approx(-math.log(mixed[target]))
    assert scores.top1.tolist() == [1.0, 0.0, 1.0, 1.0]


def test_a_sparse_path_alone_is_smoothed_as_compare_smooths():
    exact = np.array([0.5, 0.3, 0.2, 0.0])
    scores = rt.sparse_scores(_walk([(exact, 1, [1, 3], [0.6, 0.4]), (exact, 0, [2], [1.0])]), vocab_size=4,
                              eps=0.01)
    assert scores.nll.tolist() == pytest.approx([-math.log(0.99 * 0.6 + 0.01 / 4), -math.log(0.01 / 4)])
    assert scores.top1.tolist() == [1.0, 0.0] and scores.confidence.tolist() == [0.6, 1.0]


# --- counting ⊕ exact --------------------------------------------------------------------------

def test_counting_features_mirror_the_stores_feature_for_feature():
    exact = np.array([0.1, 0.6, 0.3])
    step = CountingStep(Sparse(np.array([1, 2]), np.array([0.75, 0.25])), match_length=3, occurrences=4,
                        cache_share=0.4)
    row = dict(zip(FEATURES, feature_row(step, exact, window=3)))
    assert row["closeness"] == 3 and row["exact_match"] == 1.0 and row["ln_mass"] == pytest.approx(math.log(5))
    assert row["store_top"] == 0.75
    assert row["store_entropy"] == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert row["history_share"] == 0.4 and row["memory_share"] == 0.0
    assert row["exact_top"] == 0.6 and row["agree"] == 1.0
    assert row["exact_on_store_top"] == pytest.approx(math.log(0.6))     # the model's p of the counts' top token
    assert row["exact_entropy"] == pytest.approx(-(exact * np.log(exact)).sum())
    assert dict(zip(FEATURES, feature_row(step, exact, window=4)))["exact_match"] == 0.0
    empty = dict(zip(FEATURES, feature_row(CountingStep(Sparse.empty(), 0, 0), exact, window=3)))
    assert [empty[f] for f in FEATURES[:7]] == [0.0] * 7 and empty["agree"] == 0.0


def test_a_counting_model_gives_the_distribution_of_compares_own_predictor():
    index = InfiniGram(from_corpus([[1, 2, 3, 1, 2, 4, 1, 2, 3]]))
    cache = CachedNGram(index.predict, 0.5, 1)
    for context in ([1, 2], [5, 1, 2], [3, 1, 2, 3, 1, 2], [4, 4]):
        alone, mixed = CountingModel("∞", index).step(context), CountingModel("c", index, cache).step(context)
        want = index.predict(context)
        assert alone.dist.ids.tolist() == want.ids.tolist() and alone.cache_share == 0.0
        assert alone.match_length == index.match(context).length
        got = cache.predict(context)
        assert mixed.dist.ids.tolist() == got.ids.tolist()
        assert mixed.dist.probs == pytest.approx(got.probs)
    assert CountingModel("c", index, cache).step([3, 1, 2, 3, 1, 2]).cache_share == 0.5


class _Fixed:
    """A counting model that always answers `dist`."""

    def __init__(self, dist: Sparse):
        self.dist = dist

    def step(self, context) -> CountingStep:
        return CountingStep(self.dist, len(context) % 3, 1)


def test_the_counting_model_is_chosen_by_its_gates_fit_on_the_calibration_split():
    rng = np.random.default_rng(0)
    vocab = 6
    ids = [int(x) for x in rng.integers(0, 2, 60)]            # the text uses tokens 0 and 1 only
    log_probs = np.log(np.full((len(ids), vocab), 1 / vocab, dtype=np.float32))
    good = _Fixed(Sparse(np.array([0, 1]), np.array([0.5, 0.5])))
    bad = _Fixed(Sparse(np.array([4, 5]), np.array([0.5, 0.5])))
    best, gate, candidates = rt.fit_counting({"good": good, "bad": bad}, [(0, ids, log_probs)], window=2)
    assert best == "good" and gate.positions == len(ids) - 1
    losses = {c["name"]: c["calibration_loss"] for c in candidates}
    assert losses["good"] < math.log(vocab) - 0.5 and losses["bad"] == pytest.approx(math.log(vocab), abs=1e-3)
    with pytest.raises(Exception, match="at least"):
        rt.fit_counting({"good": good}, [(0, ids[:5], log_probs[:5])], window=2)


def test_comparisons_and_the_relative_perplexity_change_are_paired_on_the_same_positions():
    rng = np.random.default_rng(1)
    n = 200
    exact = rt.Scores(rng.uniform(1, 3, n), rng.integers(0, 2, n).astype(float), rng.uniform(0, 1, n))
    augmented = rt.Scores(exact.nll - 0.2, exact.top1, exact.confidence)
    groups = np.arange(n) // 10
    change = rt.perplexity_change({"exact": exact, "augmented": augmented}, groups)
    assert change["estimate"] == pytest.approx(math.exp(-0.2) - 1)
    assert change["low"] == pytest.approx(change["estimate"]) == pytest.approx(change["high"])
    tests = rt.comparisons({"exact": exact, "augmented": augmented}, groups)
    assert [(t["a"], t["b"], t["metric"]) for t in tests] == [("augmented", "exact", "nll"),
                                                              ("augmented", "exact", "top1")]
    assert tests[0]["verdict"] == "ahead" and tests[1]["verdict"] == "no difference"
    assert rt.perplexity_change({"exact": exact}, groups) is None


# --- end to end ------------------------------------------------------------------------------------

def _run(url: str, name: str) -> dict:
    model, tokenizer = tiny_model(0)
    options = CompareOptions(atom_set=name, max_positions=30, query_samples=2, max_neighbors=20, generation=False)
    with psycopg.connect(url, autocommit=True) as conn:
        return run_compare(conn, options, model=model, tokenizer=tokenizer, model_name="tiny").report


@pytest.fixture(scope="module")
def reports(server_url):
    """(report of a set labelled by the model, report of a corpus-labelled set without a gate)."""
    model_labelled = write_context_set(server_url, STATS)
    corpus_labelled = write_context_set(server_url, {**STATS, "distill": {"target": "corpus"}})
    yield _run(server_url, model_labelled), _run(server_url, corpus_labelled), model_labelled, corpus_labelled
    _drop(server_url, model_labelled, corpus_labelled)


def test_exact_and_spatial_are_scored_against_the_real_next_token(reports):
    report = reports[0]
    real, fid = report["real_text"], report["fidelity"]
    validate_report(report)
    assert report["schema_version"] == "1.7" and real["positions"] == fid["positions"]
    model, tokenizer = tiny_model(0)
    ids = encode(tokenizer, TEST)[: fid["positions"] + 1]
    with torch.inference_mode():
        probs = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].double(), -1).numpy()
    targets = np.asarray(ids[1:])
    hit = (probs.argmax(-1) == targets).astype(float)
    top = probs.max(-1)
    exact = real["paths"]["exact"]
    assert exact["top1"]["estimate"] == pytest.approx(hit.mean())
    assert exact["perplexity"]["estimate"] == pytest.approx(math.exp(-np.log(probs[np.arange(len(targets)),
                                                                                     targets]).mean()), rel=1e-4)
    assert exact["ece"]["estimate"] == pytest.approx(rt.expected_calibration_error(top, hit), abs=1e-6)
    assert exact["top1"]["low"] <= exact["top1"]["estimate"] <= exact["top1"]["high"]
    rows = fid["per_position"]
    spatial = real["paths"]["spatial"]
    assert spatial["smoothed"] and not exact["smoothed"]
    assert spatial["top1"]["estimate"] == pytest.approx(np.mean([r["spatial_argmax"] == r["target"] for r in rows]))
    assert spatial["perplexity"]["estimate"] == pytest.approx(math.exp(np.mean([r["nll_spatial"] for r in rows])))


def test_a_set_not_labelled_by_its_corpus_says_why_and_names_the_gate_command(reports):
    report, _, name, _ = reports
    aug = report["real_text"]["augmented"]
    assert not aug["available"] and "augmented" not in report["real_text"]["paths"]
    assert "corpus labels" in aug["note"] and f"hartonomous gate fit {name}" in aug["note"]
    assert report["real_text"]["perplexity_change"] is None
    assert all(t["a"] != "augmented" for t in report["real_text"]["comparisons"])


def test_a_corpus_labelled_set_without_a_gate_says_so_and_still_scores_the_others(reports):
    _, report, _, name = reports
    real = report["real_text"]
    validate_report(report)
    assert not real["augmented"]["available"] and f"hartonomous gate fit {name}" in real["augmented"]["note"]
    assert {"exact", "spatial"} <= set(real["paths"])


def test_counting_exact_is_fitted_on_the_calibration_split_or_says_why_not(reports):
    for report in reports[:2]:
        cnt = report["real_text"]["counting_exact"]
        if cnt["available"]:
            assert cnt["base"] in {c["name"] for c in cnt["candidates"]}
            assert cnt["base"] == min(cnt["candidates"], key=lambda c: c["calibration_loss"])["name"]
            assert cnt["gate"]["split"] == "calibration"
            assert {"counting", "counting_exact"} <= set(report["real_text"]["paths"])
        else:
            assert cnt["note"] and "counting_exact" not in report["real_text"]["paths"]


def test_the_section_is_rendered(reports):
    markdown = to_markdown(reports[0], {})
    assert "## Against the real text" in markdown
    assert "| exact |" in markdown and "| spatial (smoothed) |" in markdown
    assert "hartonomous gate fit" in markdown


def test_walk_text_on_given_log_probs_is_the_walk_of_its_own_pass(server_url, reports):
    from hartonomous.augment.calibrate import walk_text
    from hartonomous.corpus import teacher

    model, tokenizer = tiny_model(0)
    ids = encode(tokenizer, TEST)[:40]
    given = teacher.teacher_force(model, [np.asarray(ids)], log_probs=True).log_probs
    with psycopg.connect(server_url, autocommit=True) as conn:
        own = walk_text(conn, model, [ids], reports[3], max_neighbors=20)
        passed = walk_text(conn, None, [ids], reports[3], max_neighbors=20, log_probs=given)
    assert len(own) == len(ids) - 1 and own.targets == passed.targets and own.exact_top == passed.exact_top
    assert own.p_exact == pytest.approx(passed.p_exact) and own.p_store == passed.p_store
    assert np.allclose(own.matrix(), passed.matrix())


@pytest.fixture(scope="module")
def gated(server_url, reports):
    """The corpus-labelled set with a gate fitted on its calibration split, compared again."""
    from hartonomous.augment.calibrate import fit_set_gate

    model, tokenizer = tiny_model(0)
    with psycopg.connect(server_url, autocommit=True) as conn:
        gate = fit_set_gate(conn, reports[3], model=model, tokenizer=tokenizer, max_neighbors=20)
    return gate, _run(server_url, reports[3])


def test_with_a_gate_the_augmented_path_is_scored_and_tested_against_exact_and_counting(gated):
    gate, report = gated
    real = report["real_text"]
    validate_report(report)
    assert real["augmented"]["available"] and real["augmented"]["gate"]["positions"] == gate.positions
    paths = real["paths"]
    assert not paths["augmented"]["smoothed"] and paths["augmented"]["top1"]["n"] == real["positions"]
    ratio = paths["augmented"]["perplexity"]["estimate"] / paths["exact"]["perplexity"]["estimate"] - 1
    assert real["perplexity_change"]["estimate"] == pytest.approx(ratio)
    pairs = [(t["a"], t["b"], t["metric"]) for t in real["comparisons"]]
    assert ("augmented", "exact", "nll") in pairs and ("augmented", "exact", "top1") in pairs
    assert (("augmented", "counting ⊕ exact", "nll") in pairs) == real["counting_exact"]["available"]
    assert "Augmented's perplexity relative to exact" in to_markdown(report, {})
