"""`hartonomous compare` end to end on a real database: a hand-made context atom set, the tiny model."""

from __future__ import annotations

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
from hartonomous.exact import ExactModel
from tiny_model import TRAIN_TEXT, tiny_model

CORPUS = "\n".join(TRAIN_TEXT[:4]) * 2
HOLDOUT = ("The capital of Italy is Paris. The capital of France is Rome. def add(a, b): return the sum "
           "of the numbers. Raise ValueError if the list is empty.")
WINDOW = 2


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def write_context_set(url: str, stats: dict) -> str:
    """Context atoms as the design builds them: one per corpus position, keyed by the centroid of the
    last WINDOW tokens (3D position and full-dimensional key), voting for the exact argmax."""
    from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set

    model, tokenizer = tiny_model(0)
    vocab = int(model.config.vocab_size)
    rng = np.random.default_rng(7)
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


@pytest.fixture(scope="module")
def context_set(server_url):
    name = write_context_set(server_url, {"holdout": {"source": "hand-written holdout", "text": HOLDOUT},
                                          "corpus": {"source": "tiny TRAIN_TEXT", "text": CORPUS}})
    yield name
    from hartonomous.atomset import drop_atom_set

    with psycopg.connect(server_url) as conn:
        drop_atom_set(conn, name)


@pytest.fixture(scope="module")
def rendered(server_url, context_set, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    prompts = out / "prompts.txt"
    prompts.write_text("The capital of France is\n", encoding="utf-8")
    model, tokenizer = tiny_model(0)
    options = CompareOptions(atom_set=context_set, prompts=prompts, max_positions=30, max_new_tokens=4,
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
    for name in ("unigram", "bigram", "trigram", "4-gram", "knn"):
        assert f"<td>{name}</td>" in page
    assert "hand-written holdout" in page  # the report says which text was used
    assert (paths["md"].parent / "figures" / "agreement_by_position.png").stat().st_size > 1000


def test_json_validates_and_holds_the_measured_sections(rendered):
    report, paths = rendered
    on_disk = json.loads(paths["json"].read_text(encoding="utf-8"))
    validate_report(on_disk)
    assert on_disk["texts"][0]["held_out"] is True
    assert on_disk["fidelity"]["positions"] == 30 == len(on_disk["fidelity"]["per_position"])
    assert set(on_disk["baselines"]["paths"]) == {"unigram", "bigram", "trigram", "4-gram", "knn"}
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
    ids = encode(tokenizer, HOLDOUT)
    exact = ExactModel(model, tokenizer)
    for row in report["fidelity"]["per_position"][:: 7]:
        t = row["position"]
        assert row["target"] == ids[t + 1]
        assert row["exact_argmax"] == int(exact.full_logits(ids[: t + 1]).argmax())


def test_distilled_4gram_on_its_own_corpus_by_hand(server_url, context_set, tmp_path):
    """On a prefix of the build corpus the exact argmax is the stored label, so the 4-gram's top-1
    agreement is the share of positions where the most frequent label of the longest context
    suffix (<= 3 tokens, ties -> lowest id) is that position's own label."""
    from collections import Counter

    model, tokenizer = tiny_model(0)
    ids = encode(tokenizer, CORPUS)
    prefix = CORPUS[:150]
    used = encode(tokenizer, prefix)[:31]
    assert used == ids[:31]  # same tokens, so the same contexts as in the corpus
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(prefix, encoding="utf-8")
    options = CompareOptions(atom_set=context_set, texts=[corpus], max_positions=30, generation=False,
                             query_samples=2)
    with psycopg.connect(server_url, autocommit=True) as conn:
        report = run_compare(conn, options, model=model, tokenizer=tokenizer, model_name="tiny").report
    with torch.inference_mode():
        labels = model(input_ids=torch.tensor([ids])).logits[0].argmax(-1).tolist()
    counts: dict[tuple, Counter] = {}
    for s in range(len(ids)):
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
    assert report["generation"] == {"skipped": True}


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
    from hartonomous.compare.baselines import CorpusUnavailable
    from hartonomous.compare.cli import build_corpus_loader
    from hartonomous.corpus import load_corpus

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
    source, text = build_corpus_loader(info)
    assert text == corpus.train_text and "training split" in source
    assert corpus.holdout_text not in text
    doc.write_text("\n\n".join(f"Other text {i}: " + "token " * 60 for i in range(30)), encoding="utf-8")
    with pytest.raises(CorpusUnavailable, match="holdout differs"):
        build_corpus_loader(info)
