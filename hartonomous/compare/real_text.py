"""The report's `real_text` section: every path scored against the real next token of the text.

The rest of compare scores approximations against the exact model's distribution; this section
asks which path predicts the text itself best, on the same positions and with the same blocks:

- exact: the exact model's teacher-forced distribution (the fidelity pass's log-probs);
- spatial: the set's next_token distribution (the fidelity pass's values, not asked again);
- counting: the counting model the gate below chose (∞-gram or ∞-gram + cache), alone;
- augmented: (1 − λ) p_exact + λ p_store with the set's stored gate (hartonomous.augment);
- counting ⊕ exact: (1 − λ) p_exact + λ p_count, λ from a gate of the same family fitted on the
  set's calibration split (hartonomous.compare.counting); of the counting models, the one whose
  gate fits the calibration split best (lowest mixture log-loss there), never chosen on the
  scored text.

Per path: top-1 (the argmax is the real next token), perplexity = exp(mean NLL) and expected
calibration error (ECE_BINS equal-width bins of the top probability), each with the block
bootstrap interval of the fidelity blocks. Spatial and counting alone are sparse: their NLL uses
compare's smoothing p' = (1 − ε) p + ε / V; the mixtures hold p_exact > 0 everywhere and need none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import psycopg

from hartonomous.compare import intervals
from hartonomous.compare import metrics as m
from hartonomous.compare.baselines import CALIBRATION_MAX_TOKENS, INFINIGRAM_CACHE_PATH, INFINIGRAM_PATH
from hartonomous.errors import UserError

ECE_BINS = 10
PATHS = ("exact", "spatial", "counting", "augmented", "counting_exact")
PATH_NAMES = {"exact": "exact", "spatial": "spatial", "counting": "counting", "augmented": "augmented",
              "counting_exact": "counting ⊕ exact"}
SMOOTHED = {"spatial", "counting"}
PAIRS = (("augmented", "exact"), ("augmented", "counting_exact"))

# (text index, token ids, the exact model's log-probs per position: (len(ids) - 1 or more, V))
ForcedText = tuple[int, Sequence[int], np.ndarray]


@dataclass
class Scores:
    """One path's per-position values against the real next token."""

    nll: np.ndarray
    top1: np.ndarray
    confidence: np.ndarray        # the path's top probability


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray, bins: int = ECE_BINS) -> float:
    """Σ_b (n_b / n) |accuracy_b − mean confidence_b| over `bins` equal-width bins of the top
    probability: bin b holds [b / bins, (b + 1) / bins), the last also 1. NaN for no positions."""
    conf = np.asarray(confidence, dtype=np.float64)
    hit = np.asarray(correct, dtype=np.float64)
    if len(conf) == 0:
        return float("nan")
    which = np.clip((conf * bins).astype(np.int64), 0, bins - 1)
    gap = np.abs(np.bincount(which, weights=hit, minlength=bins) - np.bincount(which, weights=conf, minlength=bins))
    return float(gap.sum() / len(conf))


def summarise(scores: Scores, groups: np.ndarray) -> dict:
    """top-1, NLL, perplexity and ECE, each an intervals.Interval as a dict (estimate, low, high)."""
    conf, hit = scores.confidence, scores.top1

    def ece(index: np.ndarray) -> float:         # the positions a resample drew (as floats)
        pick = index.astype(np.int64)
        return expected_calibration_error(conf[pick], hit[pick])

    return {"top1": intervals.bootstrap_interval(hit, groups).as_dict(),
            "nll": intervals.bootstrap_interval(scores.nll, groups).as_dict(),
            "perplexity": intervals.bootstrap_interval(scores.nll, groups, transform=math.exp).as_dict(),
            "ece": intervals.bootstrap_interval(np.arange(len(conf), dtype=np.float64), groups,
                                                statistic=ece).as_dict()}


def normalised(log_probs: np.ndarray) -> np.ndarray:
    """A float32 log-softmax row as float64 probabilities summing to 1 (as calibrate.walk_text)."""
    probs = np.exp(np.asarray(log_probs, dtype=np.float64))
    return probs / probs.sum()


def positions(texts: Iterable[ForcedText]) -> Iterator[tuple[int, int, list[int], np.ndarray]]:
    """(text index, t, ids, exact probabilities after ids[: t + 1]) for every position of every text."""
    for index, ids, log_probs in texts:
        ids = [int(t) for t in ids]
        rows = np.asarray(log_probs)
        for t in range(len(ids) - 1):
            yield index, t, ids, normalised(rows[t])


def exact_scores(texts: Iterable[ForcedText]) -> Scores:
    nll, top1, conf = [], [], []
    for _, t, ids, probs in positions(texts):
        top = int(np.argmax(probs))
        nll.append(-math.log(max(float(probs[ids[t + 1]]), 1e-300)))
        top1.append(float(top == ids[t + 1]))
        conf.append(float(probs[top]))
    return Scores(np.asarray(nll), np.asarray(top1), np.asarray(conf))


def spatial_scores(fid) -> Scores:
    """The fidelity pass's spatial values: its smoothed NLL of the target, argmax and top probability."""
    top1 = [float(a is not None and a == t) for a, t in zip(fid.spatial_argmax, fid.target)]
    return Scores(fid.paths["spatial"].array("nll"), np.asarray(top1), np.asarray(fid.spatial_top_p, dtype=float))


def sparse_scores(walk, vocab_size: int, eps: float = m.SMOOTHING_EPSILON) -> Scores:
    """The walk's second distribution alone (λ = 1), its NLL smoothed as compare smooths."""
    p = np.asarray(walk.p_store, dtype=np.float64)
    nll = -np.log((1.0 - eps) * p + eps / vocab_size)
    top1, conf = np.zeros(len(walk)), np.zeros(len(walk))
    for i, (ids, probs) in enumerate(zip(walk.store_ids, walk.store_probs)):
        if len(ids):
            j = int(np.argmax(probs))                  # ascending ids: ties -> the lowest id
            top1[i], conf[i] = float(ids[j] == walk.targets[i]), float(probs[j])
    return Scores(nll, top1, conf)


def mixture_scores(walk, lam: np.ndarray) -> Scores:
    s = walk.scores(lam)
    return Scores(s["nll"], s["top1"], s["confidence"])


# --- counting ⊕ exact ---------------------------------------------------------------------------

def counting_models(predictors: dict) -> dict:
    """The ∞-gram and its cache mixture behind compare's predictors of those names (the bound
    methods' objects), as hartonomous.compare.counting.CountingModel; {} without the ∞-gram."""
    from hartonomous.compare.counting import CountingModel
    from hartonomous.compare.cache import CachedNGram
    from hartonomous.compare.infinigram import InfiniGram

    index = getattr(predictors.get(INFINIGRAM_PATH), "__self__", None)
    if not isinstance(index, InfiniGram):
        return {}
    models = {INFINIGRAM_PATH: CountingModel(INFINIGRAM_PATH, index)}
    cached = getattr(predictors.get(INFINIGRAM_CACHE_PATH), "__self__", None)
    if isinstance(cached, CachedNGram):
        models[INFINIGRAM_CACHE_PATH] = CountingModel(INFINIGRAM_CACHE_PATH, index, cached)
    return models


def counting_walks(models: dict, texts: Iterable[ForcedText], window: int | None) -> dict:
    """One calibrate.Walk per counting model over the texts: the counting distribution in the
    store's place, its features by counting.feature_row."""
    from hartonomous.augment.calibrate import Walk
    from hartonomous.compare.counting import feature_row

    walks = {name: Walk() for name in models}
    for index, t, ids, probs in positions(texts):
        for name, model in models.items():
            step = model.step(ids[: t + 1])
            walks[name].add(probs, ids[t + 1], step.dist.ids, step.dist.probs, feature_row(step, probs, window),
                            index, t)
    return walks


def calibration_texts(info, model, tokenizer, chunk: int) -> Iterator[ForcedText]:
    """The set's calibration split (at most CALIBRATION_MAX_TOKENS tokens) in windows of `chunk`
    tokens, each teacher-forced when reached (one window's log-probs in memory at a time)."""
    from hartonomous.compare.atomset import calibration_text
    from hartonomous.corpus import teacher

    text = calibration_text(info)
    if text is None:
        return
    ids = [int(t) for t in tokenizer(text.text, add_special_tokens=False)["input_ids"]][:CALIBRATION_MAX_TOKENS]
    for lo in range(0, len(ids), chunk):
        window = ids[lo:lo + chunk]
        if len(window) >= 2:
            forced = teacher.teacher_force(model, [np.asarray(window)], log_probs=True)
            yield 0, window, np.asarray(forced.log_probs[0])


def fit_counting(models: dict, calibration: Iterable[ForcedText], window: int | None):
    """(name, gate, candidates) of the counting model whose gate fits the calibration split best;
    raises UserError when it cannot be fitted (no calibration text, too few positions)."""
    walks = counting_walks(models, calibration, window)
    if not walks or not len(next(iter(walks.values()))):
        raise UserError("the atom set records no calibration split to fit the counting gate on")
    candidates, gates = [], {}
    for name, walk in walks.items():
        try:
            gates[name] = walk.fit()
        except ValueError as exc:
            raise UserError(f"the counting gate cannot be fitted on the calibration split: {exc}") from None
        candidates.append({"name": name, "calibration_loss": gates[name].calibration_loss,
                           "exact_loss": gates[name].exact_loss, "positions": gates[name].positions})
    best = min(candidates, key=lambda c: c["calibration_loss"])["name"]
    return best, gates[best], candidates


# --- augmented ----------------------------------------------------------------------------------

def augmented_gate(conn: psycopg.Connection, info):
    """The set's gate for the augmented path; UserError (saying how to get one) when there is none."""
    from hartonomous.augment.gates import check_corpus_labels, fit_hint, load_gate

    try:
        check_corpus_labels(info)
    except UserError as exc:
        raise UserError(f"{exc}; then {fit_hint(info.name)}") from None
    try:
        return load_gate(conn, info.name)
    except psycopg.errors.UndefinedTable:
        raise UserError("the database has no gates yet; run hartonomous migrate, then "
                        f"{fit_hint(info.name)}") from None


def store_walk(conn: psycopg.Connection, atom_set: str, texts: Iterable[ForcedText], *, max_neighbors: int,
               history_weight: float | None, memory: bool):
    """calibrate.walk_text over the texts on their precomputed exact log-probs (no second pass)."""
    from hartonomous.augment.calibrate import Walk, walk_text

    walk = Walk()
    for index, ids, log_probs in texts:
        walk_text(conn, None, [ids], atom_set, max_neighbors=max_neighbors, history_weight=history_weight,
                  memory=memory, walk=walk, text_index=index, log_probs=[log_probs])
    return walk


def _gate_dict(gate) -> dict:
    return {"positions": gate.positions, "split": gate.split, "calibration_loss": gate.calibration_loss,
            "exact_loss": gate.exact_loss}


# --- the section --------------------------------------------------------------------------------

def comparisons(scores: dict[str, Scores], groups: np.ndarray) -> list[dict]:
    """Paired tests (NLL and top-1) of augmented against exact and against counting ⊕ exact."""
    out = []
    for a, b in PAIRS:
        if a not in scores or b not in scores:
            continue
        for metric in ("nll", "top1"):
            test = intervals.paired_test(getattr(scores[a], metric), getattr(scores[b], metric), groups,
                                         metric=metric, names=(PATH_NAMES[a], PATH_NAMES[b]))
            out.append(test.as_dict())
    return out


def perplexity_change(scores: dict[str, Scores], groups: np.ndarray) -> dict | None:
    """augmented's perplexity / exact's − 1 with its interval: exp of the paired NLL difference − 1."""
    if "augmented" not in scores:
        return None
    test = intervals.paired_test(scores["augmented"].nll, scores["exact"].nll, groups, metric="nll")
    if test.difference is None:
        return None
    rel = lambda d: None if d is None else math.expm1(d)   # noqa: E731
    return {"estimate": rel(test.difference), "low": rel(test.low), "high": rel(test.high), "n": test.n,
            "blocks": test.blocks}


def section(scores: dict[str, Scores], groups: np.ndarray, augmented: dict, counting: dict, split: str | None,
            block: int) -> dict:
    """The report's `real_text` from every available path's per-position scores."""
    n = len(scores["exact"].nll)
    for name, s in scores.items():
        if len(s.nll) != n:
            raise ValueError(f"path {name} was scored on {len(s.nll)} positions, exact on {n}")
    note = None
    if split in ("calibration", "all"):
        note = (f"the scored text ({split} split) contains the calibration split the gates were fitted on, so the "
                "mixtures' numbers are optimistic")
    return {"positions": n, "split": split, "ece_bins": ECE_BINS, "smoothing_epsilon": m.SMOOTHING_EPSILON,
            "interval_method": intervals.method(block), "note": note,
            "paths": {name: {"name": PATH_NAMES[name], "smoothed": name in SMOOTHED, **summarise(scores[name], groups)}
                      for name in PATHS if name in scores},
            "augmented": augmented, "counting_exact": counting,
            "comparisons": comparisons(scores, groups), "perplexity_change": perplexity_change(scores, groups)}


def real_text_section(conn: psycopg.Connection, info, fid, texts: list[ForcedText], model, tokenizer,
                      predictors: dict, *, max_neighbors: int, history_weight: float | None, memory: bool,
                      split: str | None, chunk: int, progress) -> dict:
    """Score every path on the fidelity pass's positions (`texts`: its kept texts and exact log-probs)."""
    vocab = int(model.config.vocab_size)
    groups = fid.blocks()
    scores = {"exact": exact_scores(texts), "spatial": spatial_scores(fid)}

    models = counting_models(predictors)
    if not models:
        counting = {"available": False, "base": None, "candidates": [], "mean_weight": None, "gate": None,
                    "note": "needs the ∞-gram, which was skipped (baselines.distillation.note says why)"}
    else:
        progress.stage("counting ⊕ exact: its gate on the calibration split, then the scored text", 1)
        try:
            best, gate, candidates = fit_counting(models, calibration_texts(info, model, tokenizer, chunk),
                                                  info.centroid_window)
        except UserError as exc:
            counting = {"available": False, "base": None, "candidates": [], "mean_weight": None, "gate": None,
                        "note": str(exc)}
        else:
            walk = counting_walks({best: models[best]}, texts, info.centroid_window)[best]
            lam = gate.weights(walk.matrix())
            scores["counting"] = sparse_scores(walk, vocab)
            scores["counting_exact"] = mixture_scores(walk, lam)
            counting = {"available": True, "base": best, "candidates": candidates, "mean_weight": float(lam.mean()),
                        "gate": _gate_dict(gate),
                        "note": (f"{best} (the lower mixture log-loss of the candidates' gates on "
                                 f"{gate.positions} positions of the calibration split) mixed with the exact model "
                                 "by a gate of the augmented path's family")}
        progress.advance()

    try:
        with conn.transaction():          # a missing table or function leaves the connection usable
            gate = augmented_gate(conn, info)
            progress.stage("augmented: the store on the scored text", 1)
            walk = store_walk(conn, info.name, texts, max_neighbors=max_neighbors, history_weight=history_weight,
                              memory=memory)
        progress.advance()
    except UserError as exc:
        augmented = {"available": False, "note": str(exc), "gate": None, "mean_weight": None}
    except psycopg.errors.UndefinedFunction:
        augmented = {"available": False, "gate": None, "mean_weight": None,
                     "note": "the database has no store_distribution; run hartonomous migrate"}
    else:
        lam = gate.weights(walk.matrix())
        scores["augmented"] = mixture_scores(walk, lam)
        augmented = {"available": True, "gate": _gate_dict(gate), "mean_weight": float(lam.mean()),
                     "note": f"the set's gate, fitted on {gate.positions} positions of its {gate.split} split"}
    return section(scores, groups, augmented, counting, split, fid.block)
