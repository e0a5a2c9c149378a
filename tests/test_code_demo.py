"""The code store's figures for `make demo` (benchmarks/code_demo.py), on a tiny set built with
corpus labels and a gate: every path it reports runs, and the summary is five lines of its figures."""

from __future__ import annotations

import psycopg
import pytest

from benchmarks import code_demo
from hartonomous.atomset import load_atom_set
from hartonomous.augment.gates import load_gate
from test_generate_default_path import corpus_set, tiny_dir  # noqa: F401  (module fixtures)

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py


@pytest.fixture(scope="module")
def report(server_url, corpus_set):  # noqa: F811
    with psycopg.connect(server_url, autocommit=True) as conn:
        info = load_atom_set(conn, corpus_set)
        scored = code_demo.quality(conn, info, load_gate(conn, info.name), positions=64)
    return info, scored


def test_exact_and_augmented_are_scored_on_the_held_out_text_with_intervals(report):
    info, scored = report
    assert 0 < scored["positions"] <= 64
    for path in ("exact", "augmented"):
        perplexity, top1 = scored[path]["perplexity"], scored[path]["top1"]
        assert perplexity["ci95"][0] <= perplexity["estimate"] <= perplexity["ci95"][1]
        assert 0.0 <= top1["ci95"][0] <= top1["estimate"] <= top1["ci95"][1] <= 1.0
    change = scored["perplexity_change"]
    assert change["ci95"][0] <= change["estimate"] <= change["ci95"][1]


def test_speculative_writes_exact_greedy_text_and_the_summary_is_five_lines(database_env, report, corpus_set):  # noqa: F811
    info, scored = report
    generated = code_demo.generations(info, new_tokens=8)
    runs = generated["runs"]
    assert set(runs) == {"exact", "speculative", "spatial"}
    assert generated["speculative_identical"] and runs["speculative"]["token_ids"] == runs["exact"]["token_ids"]
    assert all(run["tokens"] == 8 for run in runs.values())
    assert 0 <= generated["spatial_agrees_with_exact_for"] <= 8
    lines = code_demo.summary_lines({"atom_set": {"name": info.name, "atoms": info.atoms,
                                                  "training_tokens": info.stats.corpus.train_tokens},
                                     "quality": scored, "generation": generated})
    assert len(lines) == 5
    assert f"{scored['exact']['perplexity']['estimate']:.2f}" in lines[1]
    assert f"{scored['augmented']['perplexity']['estimate']:.2f}" in lines[1]
    assert f"{scored['augmented']['top1']['estimate']:.3f}" in lines[2]
    assert "output identical" in lines[3] and "spatial" in lines[4]
