"""`hartonomous compare` end to end on a real database: a hand-made context atom set, the tiny model."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import jsonschema
import numpy as np
import psycopg
import pytest
import torch

from hartonomous.centroid import prefix_centroids
from hartonomous.compare import CompareOptions, run_compare, write_report
from hartonomous.compare.render import SECTIONS
from hartonomous.compare.schema import report_schema, validate_report
from hartonomous.runtimes.reference import ExactModel
from tiny_model import TRAIN_TEXT, tiny_model

CORPUS = "\n".join(TRAIN_TEXT[:4]) * 2
CALIBRATION = "The capital of Italy is Paris. The capital of France is Rome. The capital of Italy is Paris."
TEST = ("def add(a, b): return the sum of the numbers. Raise ValueError if the list is empty. "
        "def add(a, b): return a + b")
HOLDOUT = CALIBRATION + "\n\n" + TEST          # two segments: split_holdout gives one to each half
WINDOW = 2


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def write_context_set(url: str, stats: dict, seed: int = 7) -> str:
    """Context atoms as the design builds them: one per corpus position, keyed by the centroid of the
    last WINDOW tokens (3D position and full-dimensional key), voting for the exact argmax. The 3D
    token positions are random, drawn with `seed` (a different seed: the random-positions control)."""
    from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set

    model, tokenizer = tiny_model(0)
    vocab = int(model.config.vocab_size)
    rng = np.random.default_rng(seed)
    positions = rng.normal(size=(vocab, 3))
    emb = model.get_input_embeddings().weight.detach().numpy()
    ids = encode(tokenizer, CORPUS)
    assert len(ids) <= model.config.max_position_embeddings  # one forward pass, as compare's labels
    with torch.inference_mode():
        labels = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).numpy()
    name = f"cmp_{uuid.uuid4().hex[:8]}"
    spec = AtomSetSpec(name=name, model="tiny", vocab_size=vocab, embedding_dim=emb.shape[1], projection="random",
                       kind="context", centroid_window=WINDOW, stats=stats)
    tokens = TokenRows(np.arange(vocab), [tokenizer.decode([i]) for i in range(vocab)], positions)
    atoms = AtomRows(labels, prefix_centroids(positions[ids], WINDOW), keys=prefix_centroids(emb[ids], WINDOW))
    with psycopg.connect(url) as conn:
        write_atom_set(conn, spec, tokens, atoms)
    return name


STATS = {"holdout": {"source": "hand-written holdout", "text": HOLDOUT},
         "corpus": {"source": "tiny TRAIN_TEXT", "text": CORPUS}}


def _drop(url: str, *names: str) -> None:
    from hartonomous.atomset import drop_atom_set

    with psycopg.connect(url) as conn:
        for name in names:
            drop_atom_set(conn, name)


@pytest.fixture(scope="module")
def context_set(server_url):
    """A set whose stats record no controls."""
    name = write_context_set(server_url, STATS)
    yield name
    _drop(server_url, name)


@pytest.fixture(scope="module")
def controlled_set(server_url):
    """(set, its random-positions control): the same atoms, other random token positions."""
    control = write_context_set(server_url, STATS, seed=99)
    name = write_context_set(server_url, {**STATS, "controls": {"random_positions": control}})
    yield name, control
    _drop(server_url, name)  # drop_atom_set drops the recorded control with it


@pytest.fixture(scope="module")
def rendered(server_url, controlled_set, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    prompts = out / "prompts.txt"
    prompts.write_text("The capital of France is\n", encoding="utf-8")
    model, tokenizer = tiny_model(0)
    assert len(encode(tokenizer, TEST)) > 30 and len(encode(tokenizer, CALIBRATION)) > 20
    options = CompareOptions(atom_set=controlled_set[0], prompts=prompts, max_positions=30, max_new_tokens=4,
                             query_samples=4, max_neighbors=20)
    with psycopg.connect(server_url, autocommit=True) as conn:
        result = run_compare(conn, options, model=model, tokenizer=tokenizer, model_name="tiny")
    paths = write_report(result.report, result.figures, out)
    return result.report, paths


def test_report_has_every_section_in_every_format(rendered):
    report, paths = rendered
    page = paths["html"].read_text(encoding="utf-8")
    markdown = paths["md"].read_text(encoding="utf-8")
    for section in SECTIONS:
        assert f">{section}</h2>" in page, section
        assert f"## {section}" in markdown, section
    assert page.count("src='data:image/png;base64,") == 7  # histograms + agreement by position, embedded
    assert "src='http" not in page and "<link" not in page and "<script" not in page  # self-contained
    for name in ("unigram", "bigram", "trigram", "4-gram", "4-gram + cache", "knn", "spatial, random positions"):
        assert f"<td>{html.escape(name)}</td>" in page, name
    assert "hand-written holdout" in page  # the report says which text was used
    assert (paths["md"].parent / "figures" / "agreement_by_position.png").stat().st_size > 1000


def test_json_validates_and_holds_the_measured_sections(rendered):
    report, paths = rendered
    on_disk = json.loads(paths["json"].read_text(encoding="utf-8"))
    validate_report(on_disk)
    assert on_disk["texts"][0]["held_out"] is True
    assert on_disk["fidelity"]["positions"] == 30 == len(on_disk["fidelity"]["per_position"])
    assert set(on_disk["baselines"]["paths"]) == {"unigram", "bigram", "trigram", "4-gram", "∞-gram",
                                                  "4-gram + cache", "∞-gram + cache", "knn"}
    assert on_disk["baselines"]["distillation"]["tokens"] == len(encode(tiny_model(0)[1], CORPUS))
    gen = on_disk["generation"]["prompts"][0]
    assert gen["prompt"] == "The capital of France is"
    assert {gen[m][p]["tokens"] for m in ("greedy", "sampled") for p in ("spatial", "exact")} <= {1, 2, 3, 4}
    assert [c["claimed"] for c in on_disk["claims"]] == [0.89, 15.0, "3.3–20×", 6]
    assert on_disk["queries"]["calls"] == 4 and on_disk["queries"]["knn_buffers_p50"] > 0
    for row in on_disk["fidelity"]["per_position"]:
        assert row["top1"] == float(row["exact_argmax"] == row["spatial_argmax"])


def test_teacher_forced_exact_argmax_matches_a_fresh_forward_pass(rendered):
    report, _ = rendered
    model, tokenizer = tiny_model(0)
    ids = encode(tokenizer, TEST)
    exact = ExactModel(model, tokenizer)
    for row in report["fidelity"]["per_position"][:: 7]:
        t = row["position"]
        assert row["target"] == ids[t + 1]
        assert row["exact_argmax"] == int(exact.full_logits(ids[: t + 1]).argmax())


@pytest.fixture(scope="module")
def rendered_user_text(server_url, context_set, tmp_path_factory):
    """A user --text file (a prefix of the build corpus) on a set that records no controls."""
    model, tokenizer = tiny_model(0)
    assert encode(tokenizer, CORPUS[:150])[:31] == encode(tokenizer, CORPUS)[:31]  # the corpus's own contexts
    corpus = tmp_path_factory.mktemp("text") / "corpus.txt"
    corpus.write_text(CORPUS[:150], encoding="utf-8")
    options = CompareOptions(atom_set=context_set, texts=[corpus], max_positions=30, generation=False,
                             query_samples=2)
    with psycopg.connect(server_url, autocommit=True) as conn:
        return run_compare(conn, options, model=model, tokenizer=tokenizer, model_name="tiny").report


def test_distilled_4gram_on_its_own_corpus_by_hand(rendered_user_text):
    """On a prefix of the build corpus the exact argmax is the stored label, so the 4-gram's top-1
    agreement is the share of positions where the most frequent label of the longest context
    suffix (<= 3 tokens, ties -> lowest id) is that position's own label. The labels are those of
    the atom positions: every position of the one chunk but its last."""
    from collections import Counter

    model, tokenizer = tiny_model(0)
    ids = encode(tokenizer, CORPUS)
    report = rendered_user_text
    with torch.inference_mode():
        labels = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
    counts: dict[tuple, Counter] = {}
    for s in range(len(ids) - 1):
        for n in range(1, 4):
            if s - n + 1 >= 0:
                counts.setdefault(tuple(ids[s - n + 1: s + 1]), Counter())[labels[s]] += 1
    hits = []
    for t in range(30):
        c = counts[tuple(ids[max(0, t - 2): t + 1])]
        best = min(c, key=lambda label: (-c[label], label))
        hits.append(best == labels[t])
    assert report["baselines"]["paths"]["4-gram"]["top1"]["mean"] == pytest.approx(np.mean(hits))
    assert report["texts"][0]["held_out"] is False
    assert report["settings"]["split"] is None and report["texts"][0]["split"] is None  # --split does not apply
    assert report["generation"] == {"skipped": True}


def _labels(model, ids: list[int]) -> list[int]:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()


def test_the_test_half_of_the_holdout_is_scored_by_default(rendered):
    report, paths = rendered
    model, tokenizer = tiny_model(0)
    assert report["settings"]["split"] == "test"
    assert report["texts"][0]["split"] == "test" and "test half" in report["texts"][0]["source"]
    ids = encode(tokenizer, TEST)
    assert [row["target"] for row in report["fidelity"]["per_position"]] == ids[1:31]
    assert "Scored split: test" in paths["md"].read_text(encoding="utf-8")


def test_cache_mixture_is_fitted_on_the_calibration_half_only(rendered):
    """Refitting on the calibration half by hand (the 4-gram of the corpus labels; the calibration
    half in contexts as long as the scored ones, each labelled by the exact argmax) gives the
    report's λ, minimum suffix and grid; the scored text plays no part."""
    from hartonomous.compare.cache import fit_mixture
    from hartonomous.compare.ngram import fit_all

    report, _ = rendered
    model, tokenizer = tiny_model(0)
    corpus = encode(tokenizer, CORPUS)
    four = fit_all([corpus], [_labels(model, corpus)[:-1]])["4-gram"]
    chunk = report["texts"][0]["tokens_used"]
    cal = encode(tokenizer, CALIBRATION)
    pieces = [cal[lo:lo + chunk] for lo in range(0, len(cal), chunk)]
    fit = fit_mixture(four.predict, pieces, [_labels(model, p) for p in pieces], int(model.config.vocab_size))
    cache = report["baselines"]["cache"]
    assert cache["fitted_on"] == "calibration" and cache["calibration_positions"] == len(cal)
    assert (cache["lambda"], cache["min_suffix"]) == (fit.lam, fit.min_suffix)
    assert len(cache["grid"]) == len(fit.grid)
    for ours, theirs in zip(cache["grid"], fit.grid):
        assert ours == pytest.approx(theirs)


def test_cache_baseline_by_hand_and_in_the_headline(rendered):
    """The '4-gram + cache' column is the fitted mixture scored position by position, and the
    headline's best baseline is the top-1 best of every baseline path, this one included."""
    from hartonomous.compare.cache import CachedNGram
    from hartonomous.compare.metrics import argmax
    from hartonomous.compare.ngram import fit_all

    report, _ = rendered
    model, tokenizer = tiny_model(0)
    corpus = encode(tokenizer, CORPUS)
    cache = report["baselines"]["cache"]
    mixed = CachedNGram(fit_all([corpus], [_labels(model, corpus)[:-1]])["4-gram"].predict, cache["lambda"],
                        cache["min_suffix"])
    ids = encode(tokenizer, TEST)
    hits = [argmax(mixed.predict(ids[: row["position"] + 1])) == row["exact_argmax"]
            for row in report["fidelity"]["per_position"]]
    paths = report["baselines"]["paths"]
    assert paths["4-gram + cache"]["top1"]["mean"] == pytest.approx(np.mean(hits))
    top1 = report["headline"][0]
    assert top1["metric"] == "top-1 agreement"
    assert top1["baseline"] == max(p["top1"]["mean"] for p in paths.values())
    assert paths[top1["baseline_name"]]["top1"]["mean"] == top1["baseline"]


def test_random_positions_control_is_the_spatial_path_on_the_sibling_set(rendered, server_url, controlled_set):
    from hartonomous.compare.metrics import argmax
    from hartonomous.compare.spatial import spatial_distribution

    report, paths = rendered
    control = report["fidelity"]["controls"]["random_positions"]
    assert control["status"] == "scored" and control["atom_set"] == controlled_set[1]
    ids = encode(tiny_model(0)[1], TEST)
    rows = report["fidelity"]["per_position"]
    with psycopg.connect(server_url, autocommit=True) as conn:
        hits = [argmax(spatial_distribution(conn, ids[: r["position"] + 1], controlled_set[1], 20)) == r["exact_argmax"]
                for r in rows]
    assert control["path"]["top1"]["mean"] == pytest.approx(np.mean(hits))
    assert report["headline"][0]["random_positions"] == control["path"]["top1"]["mean"]
    assert report["headline"][1]["random_positions"] == control["path"]["pearson"]["mean"]
    assert "random_positions" not in report["headline"][-1]      # latency rows: not applicable
    assert "spatial, random positions" in report["fidelity"]["by_position"]["bins"][0]["values"]
    markdown = paths["md"].read_text(encoding="utf-8")
    assert "| spatial, random positions |" in markdown and "carry no information" in markdown


def test_a_recorded_control_that_is_gone_is_reported_missing(server_url, context_set):
    from hartonomous.atomset import BuildStats, load_atom_set
    from hartonomous.compare.controls import random_positions

    with psycopg.connect(server_url, autocommit=True) as conn:
        info = load_atom_set(conn, context_set)
        gone = info.model_copy(update={"stats": BuildStats.from_json({"controls": {"random_positions": "no_such"}})})
        control = random_positions(conn, gone, 20)
    assert (control.status, control.predict) == ("missing", None) and "no_such" in control.note


@pytest.fixture(scope="module")
def calibration_run(server_url, context_set):
    """--split calibration through a connection that records every statement's parameters."""

    class Recording(psycopg.Connection):
        seen: list

        def execute(self, query, params=None, **kwargs):
            self.seen.append(params)
            return super().execute(query, params, **kwargs)

    model, tokenizer = tiny_model(0)
    options = CompareOptions(atom_set=context_set, split="calibration", max_positions=20, generation=False,
                             query_samples=2, max_neighbors=20)
    with Recording.connect(server_url, autocommit=True) as conn:
        conn.seen = []
        report = run_compare(conn, options, model=model, tokenizer=tokenizer, model_name="tiny").report
    return report, conn.seen


def test_split_calibration_scores_that_half_and_says_it_is_optimistic(calibration_run):
    from hartonomous.compare.render import to_markdown

    report, _ = calibration_run
    ids = encode(tiny_model(0)[1], CALIBRATION)
    assert report["settings"]["split"] == "calibration" == report["texts"][0]["split"]
    assert [row["target"] for row in report["fidelity"]["per_position"]] == ids[1:21]
    assert "optimistic" in report["baselines"]["cache"]["note"]
    assert "Scored split: calibration" in to_markdown(report, {}) and "optimistic" in to_markdown(report, {})


def test_next_token_gets_the_whole_context_up_to_each_position(calibration_run, context_set):
    """History atoms read the whole context, so the spatial path must not cut it to the centroid
    window: every prefix of the scored text reaches next_token whole."""
    report, seen = calibration_run
    ids = encode(tiny_model(0)[1], CALIBRATION)
    sent = {tuple(p["context"]) for p in seen if isinstance(p, dict) and p.get("atom_set") == context_set
            and "context" in p and p.get("top_k") == 0}
    assert len(ids[:21]) > 2 * WINDOW
    assert {tuple(ids[: t + 1]) for t in range(20)} <= sent


@pytest.fixture(scope="module")
def history_runs(server_url, controlled_set):
    """The test half scored with history atoms off (0) and with a heavy weight (50)."""
    model, tokenizer = tiny_model(0)
    runs = {}
    with psycopg.connect(server_url, autocommit=True) as conn:
        for weight in (0.0, 50.0):
            options = CompareOptions(atom_set=controlled_set[0], max_positions=30, generation=False,
                                     query_samples=2, max_neighbors=20, history_weight=weight)
            runs[weight] = run_compare(conn, options, model=model, tokenizer=tokenizer, model_name="tiny").report
    return runs


def test_history_weight_reaches_the_spatial_path_and_its_control(history_runs, server_url, controlled_set):
    """--history-weight W scores next_token(ctx, history_weight => W) for the set and its control alike."""
    from hartonomous.compare.metrics import argmax
    from hartonomous.compare.spatial import spatial_distribution

    ids = encode(tiny_model(0)[1], TEST)
    name, control = controlled_set
    with psycopg.connect(server_url, autocommit=True) as conn:
        for weight, report in history_runs.items():
            validate_report(report)
            assert report["settings"]["history_weight"] == weight
            rows = report["fidelity"]["per_position"]
            assert [r["spatial_argmax"] for r in rows] == [
                argmax(spatial_distribution(conn, ids[: r["position"] + 1], name, 20, weight)) for r in rows]
            hits = [argmax(spatial_distribution(conn, ids[: r["position"] + 1], control, 20, weight))
                    == r["exact_argmax"] for r in rows]
            assert report["fidelity"]["controls"]["random_positions"]["path"]["top1"]["mean"] == pytest.approx(
                np.mean(hits))
    # the test half repeats "def add(a, b)": a heavy history weight must change some prediction
    off, heavy = ([r["spatial_argmax"] for r in history_runs[w]["fidelity"]["per_position"]] for w in (0.0, 50.0))
    assert off != heavy


@pytest.fixture(scope="module")
def memory_runs(server_url, controlled_set):
    """The test half scored before anything is remembered, then with the test text itself remembered
    (weight 10^6) by a compare that does not read the memory and by one that does (--memory)."""
    model, tokenizer = tiny_model(0)
    ids = encode(tokenizer, TEST)
    name = controlled_set[0]
    runs = {}
    with psycopg.connect(server_url, autocommit=True) as conn:
        def score(memory: bool) -> dict:
            options = CompareOptions(atom_set=name, max_positions=30, generation=False, query_samples=2,
                                     max_neighbors=20, memory=memory)
            return run_compare(conn, options, model=model, tokenizer=tokenizer, model_name="tiny").report
        runs["before"] = score(False)
        conn.execute("SELECT remember(%s, %s, %s, 'exact', weight => 1e6, temperature => 0)", (name, ids[:1], ids[1:]))
        try:
            runs["ignored"], runs["read"] = score(False), score(True)
        finally:
            conn.execute("SELECT forget(%s)", (name,))
    return runs, ids


def test_compare_reads_the_memory_only_when_asked_and_says_so(memory_runs):
    from hartonomous.compare.render import to_markdown

    runs, ids = memory_runs
    argmaxes = {k: [r["spatial_argmax"] for r in report["fidelity"]["per_position"]] for k, report in runs.items()}
    assert argmaxes["ignored"] == argmaxes["before"]            # remembered text changes nothing unless asked
    assert runs["ignored"]["settings"]["memory"] is None
    read = runs["read"]
    validate_report(read)
    assert read["settings"]["memory"]["atoms"] == len(ids) - 1 and read["settings"]["memory"]["generations"] == 1
    # the remembered atoms (weight 10^6) outvote the set's (weight 1): every prediction is a remembered token
    assert set(argmaxes["read"]) <= set(ids[1:])
    assert argmaxes["read"] != argmaxes["before"]
    assert "memory of past generations too (--memory)" in to_markdown(read, {})
    assert "--memory" not in to_markdown(runs["before"], {})


def test_compare_without_history_weight_leaves_the_sets_calibrated_value(rendered):
    report, _ = rendered
    assert report["settings"]["history_weight"] is None


def test_control_not_built_is_said_not_omitted(rendered_user_text):
    from hartonomous.compare.controls import NOT_BUILT
    from hartonomous.compare.render import to_html, to_markdown

    report = rendered_user_text
    control = report["fidelity"]["controls"]["random_positions"]
    assert (control["status"], control["path"], control["note"]) == ("not built", None, NOT_BUILT)
    assert "random_positions" in report["headline"][0] and report["headline"][0]["random_positions"] is None
    assert NOT_BUILT in to_markdown(report, {}) and html.escape(NOT_BUILT) in to_html(report, {})
    assert "| not built |" in to_markdown(report, {})


def test_schema_rejects_a_report_missing_a_section(rendered):
    report, _ = rendered
    broken = {k: v for k, v in report.items() if k != "claims"}
    with pytest.raises(jsonschema.ValidationError):
        validate_report(broken)
    jsonschema.Draft202012Validator.check_schema(report_schema())


def _cli(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HARTONOMOUS_DATABASE_URL": url}
    return subprocess.run([sys.executable, "-m", "hartonomous.cli", "compare", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_bad_input_is_one_clear_line(server_url, tmp_path):
    name = write_context_set(server_url, {})  # no held-out text recorded
    try:
        unknown = _cli(server_url, "--atom-set", "no-such-set", "--out", str(tmp_path))
        assert unknown.returncode == 1
        assert unknown.stderr.strip().splitlines() == [unknown.stderr.strip()]
        assert "no atom set named 'no-such-set'" in unknown.stderr
        no_text = _cli(server_url, "--atom-set", name, "--out", str(tmp_path))
        assert no_text.returncode == 1
        assert "records no held-out text; pass --text FILE" in no_text.stderr
        bad_split = _cli(server_url, "--atom-set", name, "--split", "bogus")
        assert bad_split.returncode == 1 and bad_split.stderr.strip().count("\n") == 0
        assert "--split must be one of test, calibration, all; got 'bogus'" in bad_split.stderr
        bad_weight = _cli(server_url, "--atom-set", name, "--history-weight", "-1")
        assert bad_weight.returncode == 1 and bad_weight.stderr.strip().count("\n") == 0
        assert "--history-weight must be a finite number >= 0" in bad_weight.stderr
        no_against = _cli(server_url, "--atom-set", name, "--against", "no-such-set", "--out", str(tmp_path))
        assert no_against.returncode == 1 and no_against.stderr.strip().count("\n") == 0
        assert "--against no-such-set: no atom set named 'no-such-set'" in no_against.stderr
        missing = _cli(server_url, "--atom-set", name, "--text", str(tmp_path / "nope.txt"))
        assert missing.returncode == 1 and "nope.txt does not exist" in missing.stderr and "--text" in missing.stderr
        assert not list(Path(tmp_path).glob("report.*"))
    finally:
        from hartonomous.atomset import drop_atom_set

        with psycopg.connect(server_url) as conn:
            drop_atom_set(conn, name)


def test_cli_rebuilds_the_training_split_from_the_recorded_corpus_settings(tmp_path):
    """A set whose stats name the corpus files and settings (not the text) gets its training split back,
    checked against the recorded holdout; a changed file is refused with the reason."""
    from hartonomous.atomset import AtomSet, BuildStats
    from hartonomous.compare.baselines import recorded_corpus
    from hartonomous.corpus.sources import load_corpus
    from hartonomous.corpus.origin import CorpusUnavailable

    doc = tmp_path / "doc.txt"
    doc.write_text("\n\n".join(f"Paragraph {i}: " + "word " * 40 for i in range(30)), encoding="utf-8")
    corpus = load_corpus([doc], 2000, None, 3, train=True)
    stats = {"corpus": {"source": "doc.txt", "text": None, "files": [str(doc)], "max_tokens": 2000, "seed": 3,
                        "context_length": 64},
             "holdout": {"source": "doc.txt holdout", "text": corpus.holdout_text}}
    info = AtomSet(id=1, name="s", model="tiny", model_key=None, kind="token", vocab_size=320, embedding_dim=32,
                   projection="random", projection_params={}, centroid_window=None, centroid_decay=1.0,
                   kernel="gaussian", bandwidth=1.0, history_weight=0.0, history_window=512, is_default=False,
                   created_at=None, stats=BuildStats.from_json(stats), atoms=320)
    recovered = recorded_corpus(info)
    assert recovered.text == corpus.train_text and "training split" in recovered.source
    assert recovered.origin["kind"] == "files" and recovered.origin["files"] == [{"path": str(doc), "sha256": None}]
    text = recovered.text
    assert corpus.holdout_text not in text
    doc.write_text("\n\n".join(f"Other text {i}: " + "token " * 60 for i in range(30)), encoding="utf-8")
    with pytest.raises(CorpusUnavailable, match="holdout differs"):
        recorded_corpus(info)


# --- intervals, paired comparisons, --against, the machine (issue 22) ---------------------------

def _paths(report: dict) -> dict[str, dict]:
    """Every scored path of a report by name: spatial, each baseline, the control, the --against set."""
    fid = report["fidelity"]
    out = {"spatial": fid["spatial"], **report["baselines"]["paths"]}
    control = fid["controls"]["random_positions"]
    if control["path"] is not None:
        out["spatial, random positions"] = control["path"]
    if fid.get("against"):
        out[fid["against"]["name"]] = fid["against"]["path"]
    return out


def _blocks(report: dict) -> np.ndarray:
    from hartonomous.compare.intervals import block_length, blocks_of

    rows = report["fidelity"]["per_position"]
    return blocks_of([r["text"] for r in rows], [r["position"] for r in rows], block_length(len(rows)))


def test_every_metric_of_every_path_carries_an_interval_around_its_mean(rendered):
    from hartonomous.compare.fidelity import METRICS

    report, _ = rendered
    paths = _paths(report)
    assert len(paths) == 10  # spatial, 8 baselines (4 n-grams, ∞-gram, 2 cache mixtures, KNN), the control
    for name, path in paths.items():
        for metric in METRICS:
            d = path[metric]
            if d["mean"] is None:
                assert d["ci95"] is None
                continue
            low, high = d["ci95"]
            assert low <= d["mean"] <= high, (name, metric)
        low, high = path["perplexity_ci95"]
        assert low <= path["perplexity"] <= high, name
    low, high = report["fidelity"]["exact"]["perplexity_ci95"]
    assert low <= report["fidelity"]["exact"]["perplexity"] <= high


def test_the_interval_is_the_block_bootstrap_of_the_per_position_values(rendered):
    """The spatial path's top-1 and perplexity intervals, recomputed from per_position with the blocks
    the report names, are the report's to the bit."""
    import math

    from hartonomous.compare.intervals import bootstrap_interval, method

    report, _ = rendered
    rows, iv = report["fidelity"]["per_position"], report["intervals"]
    groups = _blocks(report)
    assert iv["block"] == 1 and iv["blocks"] == 30 == iv["positions"]    # 30 positions: 20+ blocks need length 1
    assert iv["method"] == method(1) and "block bootstrap" in iv["method"]
    top1 = bootstrap_interval([r["top1"] for r in rows], groups)
    assert report["fidelity"]["spatial"]["top1"]["ci95"] == [top1.low, top1.high]
    ppl = bootstrap_interval([r["nll_spatial"] for r in rows], groups, transform=math.exp)
    assert report["fidelity"]["spatial"]["perplexity_ci95"] == [ppl.low, ppl.high]


def test_few_positions_are_said_to_give_wide_intervals(rendered):
    report, paths = rendered
    note = report["intervals"]["note"]
    assert "n = 30 positions, fewer than the 2,000" in note and "--max-positions 30" in note
    assert note in paths["md"].read_text(encoding="utf-8")
    from hartonomous.compare import CompareOptions as Options

    assert Options(atom_set="any").max_positions == report["intervals"]["recommended_positions"] == 2000


def test_interval_cells_read_mean_then_bracketed_ends():
    from hartonomous.compare.render import interval

    assert interval(0.298, [0.2712, 0.3244]) == "0.298 [0.27, 0.32]"
    assert interval(0.3, [0.2951, 0.3012]) == "0.3 [0.295, 0.301]"     # more digits where 2 would tie
    assert interval(320.4, [309.6, 331.2]) == "320 [310, 331]"                  # no 3.1e+02
    assert interval(0.5, None) == "0.5" and interval(None, None) == "n/a"


def test_headline_rows_show_intervals_and_verdicts_in_every_format(rendered):
    from hartonomous.compare.render import interval

    report, paths = rendered
    top1 = report["headline"][0]
    assert top1["key"] == "top1" and top1["spatial_ci95"] == report["fidelity"]["spatial"]["top1"]["ci95"]
    cell = interval(top1["spatial"], top1["spatial_ci95"])
    assert "[" in cell
    assert f"| {cell} |" in paths["md"].read_text(encoding="utf-8")
    assert f"<td>{html.escape(cell)}</td>" in paths["html"].read_text(encoding="utf-8")
    words = {"ahead": "spatial ahead", "behind": "spatial behind", "no difference": "no difference"}
    assert f"{top1['baseline_name']}; {words[top1['verdicts']['baseline']]})" in paths["md"].read_text(encoding="utf-8")


def test_best_baseline_is_chosen_per_metric_in_its_direction(rendered):
    from hartonomous.compare.runner import best_baseline

    toy = {"bigram": {"js": {"mean": 0.30}, "top1": {"mean": 0.50}, "perplexity": 40.0},
           "knn": {"js": {"mean": 0.10}, "top1": {"mean": 0.40}, "perplexity": 30.0},
           "empty": {"js": {"mean": None}, "top1": {"mean": None}, "perplexity": None}}
    assert (best_baseline(toy, "js"), best_baseline(toy, "top1"), best_baseline(toy, "perplexity")) == (
        "knn", "bigram", "knn")
    assert best_baseline({}, "top1") is None

    report, _ = rendered
    base = report["baselines"]["paths"]
    rows = {r["key"]: r for r in report["headline"] if "key" in r}
    assert rows["js"]["baseline"] == min(p["js"]["mean"] for p in base.values())
    assert rows["perplexity"]["baseline"] == min(p["perplexity"] for p in base.values())
    for key in ("top1", "pearson", "mass_covered"):
        assert rows[key]["baseline"] == max(p[key]["mean"] for p in base.values() if p[key]["mean"] is not None)
    for row in rows.values():
        named = base[row["baseline_name"]]
        assert row["baseline"] == (named["perplexity"] if row["key"] == "perplexity" else named[row["key"]]["mean"])


@pytest.fixture(scope="module")
def against_runs(server_url, controlled_set, context_set):
    """The controlled set --against its identical twin (context_set: the same atoms and positions) and
    --against its own random-positions control, on the same 30 positions as `rendered`."""
    model, tokenizer = tiny_model(0)
    runs = {}
    with psycopg.connect(server_url, autocommit=True) as conn:
        for other in (context_set, controlled_set[1]):
            options = CompareOptions(atom_set=controlled_set[0], max_positions=30, generation=False,
                                     query_samples=2, max_neighbors=20, against=other)
            runs[other] = run_compare(conn, options, model=model, tokenizer=tokenizer, model_name="tiny").report
    return runs


def test_paired_comparisons_cover_each_headline_row_and_word_it_by_the_verdict(against_runs, controlled_set,
                                                                              server_url):
    from hartonomous.compare.intervals import HIGHER_IS_BETTER, paired_test
    from hartonomous.compare.metrics import argmax
    from hartonomous.compare.spatial import spatial_distribution

    report = against_runs[controlled_set[1]]
    validate_report(report)
    rows = [r for r in report["headline"] if "key" in r]
    comparisons = report["comparisons"]
    # best baseline, control, --against per row, and ∞-gram + cache where it is not the best baseline
    cache_rows = [r for r in rows if r["baseline_name"] != "∞-gram + cache"]
    assert len(comparisons) == 3 * len(rows) + len(cache_rows) and len(rows) == 5
    assert {c["row"] for c in comparisons if c["role"] == "infinigram_cache"} == {r["metric"] for r in cache_rows}
    assert all(c["b"] == "∞-gram + cache" for c in comparisons if c["role"] == "infinigram_cache")
    by_row = {(c["row"], c["role"]): c for c in comparisons}
    per = report["fidelity"]["per_position"]
    groups = _blocks(report)
    for row in rows:
        for role, verdict in row["verdicts"].items():
            c = by_row[(row["metric"], role)]
            assert c["verdict"] == verdict and c["a"] == "spatial" and c["n"] <= 30
            assert c["wording"].startswith(verdict)
            if verdict == "no difference":
                assert f"no difference at n = {c['n']}" in c["wording"] and c["interval"][0] <= 0 <= c["interval"][1]
            else:                                 # the interval excludes 0, on the side the verdict says
                above = c["interval"][0] > 0
                assert above or c["interval"][1] < 0
                assert (verdict == "ahead") == (above == HIGHER_IS_BETTER[c["metric"]])
    assert {c["verdict"] for c in comparisons} >= {"behind", "no difference"}
    # by hand: the top-1 test against the control from the per-position hits of both paths
    control = by_row[("top-1 agreement", "random_positions")]
    assert control["b"] == "spatial, random positions"
    ids = encode(tiny_model(0)[1], TEST)
    with psycopg.connect(server_url, autocommit=True) as conn:
        theirs = [float(argmax(spatial_distribution(conn, ids[: r["position"] + 1], controlled_set[1], 20))
                        == r["exact_argmax"]) for r in per]
    expected = paired_test([r["top1"] for r in per], theirs, groups, metric="top1")
    assert (control["difference"], control["interval"], control["p"], control["verdict"]) == (
        expected.difference, [expected.low, expected.high], expected.p_value, expected.verdict)
    # --against the control set: the same values, the same blocks, so the very same tests
    for row in rows:
        a, c = by_row[(row["metric"], "against")], by_row[(row["metric"], "random_positions")]
        assert {k: v for k, v in a.items() if k not in ("role", "b")} == {
            k: v for k, v in c.items() if k not in ("role", "b")}
    assert report["fidelity"]["against"]["atom_set"] == controlled_set[1]
    assert report["fidelity"]["against"]["history_weight"] is None      # that set's own calibrated weight


def test_against_an_identical_set_finds_no_difference_at_n(against_runs, context_set, rendered):
    """The twin set holds the same atoms at the same positions: every difference is 0, every verdict
    "no difference at n = ...", and the spatial path's numbers are byte for byte those of `rendered`."""
    from hartonomous.compare.against import path_name
    from hartonomous.compare.render import to_markdown

    report = against_runs[context_set]
    validate_report(report)
    twin = [c for c in report["comparisons"] if c["role"] == "against"]
    assert len(twin) == 5 and all(c["b"] == path_name(context_set) for c in twin)
    for c in twin:
        assert (c["difference"], c["p"], c["verdict"]) == (0.0, 1.0, "no difference")
        assert c["wording"].startswith(f"no difference at n = {c['n']}")
    assert report["fidelity"]["against"]["path"]["top1"] == report["fidelity"]["spatial"]["top1"]
    assert json.dumps(report["fidelity"]["spatial"]) == json.dumps(rendered[0]["fidelity"]["spatial"])
    assert json.dumps(report["comparisons"][:2]) == json.dumps(rendered[0]["comparisons"][:2])  # seeded
    markdown = to_markdown(report, {})
    assert f"| {path_name(context_set)} |" in markdown.splitlines()[next(
        i for i, line in enumerate(markdown.splitlines()) if line.startswith("| metric | spatial |"))]
    assert "(no difference)" in markdown and "Paired comparisons" in markdown


def test_against_a_set_of_another_vocabulary_is_refused(server_url, context_set):
    from hartonomous.atomset import load_atom_set
    from hartonomous.compare.against import load_against
    from hartonomous.errors import UserError

    with psycopg.connect(server_url, autocommit=True) as conn:
        info = load_atom_set(conn, context_set)
        bigger = info.model_copy(update={"name": "bigger", "vocab_size": info.vocab_size + 1})
        with pytest.raises(UserError, match=f"--against {context_set}: built from model .* with "
                                            f"{info.vocab_size} tokens"):
            load_against(conn, bigger, context_set, 20)
        with pytest.raises(UserError, match="that is the atom set being compared"):
            load_against(conn, info, context_set, 20)


def test_the_report_records_the_commit_and_the_load_at_start_and_end(rendered):
    from hartonomous.measure import PACKAGE_ROOT

    machine = rendered[0]["machine"]
    head = subprocess.run(["git", "-C", str(PACKAGE_ROOT), "rev-parse", "--show-toplevel", "HEAD"],
                          capture_output=True, text=True)
    lines = head.stdout.split()
    if head.returncode == 0 and Path(lines[0]).resolve() == PACKAGE_ROOT:
        assert machine["commit"] == lines[1] and isinstance(machine["dirty"], bool)
    else:
        assert (machine["commit"], machine["dirty"]) == (None, None)
    for when in ("start", "end"):
        assert len(machine["load"][when]) == 3 and all(x >= 0 for x in machine["load"][when])


def test_against_a_set_that_held_out_other_text_is_refused_on_the_holdout_but_not_on_a_user_text(
        server_url, context_set):
    """A set built from another --max-tokens cuts another holdout: its training text may hold the
    positions scored, so it may only be compared on a --text neither set was built from."""
    from hartonomous.atomset import load_atom_set
    from hartonomous.compare.against import load_against
    from hartonomous.errors import UserError

    with psycopg.connect(server_url, autocommit=True) as conn:
        info = load_atom_set(conn, context_set)
        stats = info.stats.model_copy(update={"holdout": info.stats.holdout.model_copy(update={"text": "other"})})
        elsewhere = info.model_copy(update={"name": "elsewhere", "stats": stats})
        with pytest.raises(UserError, match=f"--against {context_set}: it was built with another held-out text"):
            load_against(conn, elsewhere, context_set, 20)
        assert load_against(conn, elsewhere, context_set, 20, scores_holdout=False).atom_set == context_set
        assert load_against(conn, info.model_copy(update={"name": "twin"}), context_set, 20).atom_set == context_set
