"""`hartonomous bench --completion` end to end on the tiny model and a real database: a small
repository's store built by the bench with its files held out by path, every system completing
the same lines, the summaries, the store reused on a second run; the leakage and bad-input
refusals."""

from __future__ import annotations

import shutil
import uuid

import psycopg
import pytest

from benchmarks import completion
from generation_helpers import drop_atom_set, run_cli, save_tiny_model
from hartonomous.augment.gates import save_gate
from benchmarks.line_completion import stores
from benchmarks.line_completion.prompts import Budgets
from benchmarks.line_completion.run import SYSTEMS
from hartonomous.errors import UserError
from test_augmented_path import GATE
from tiny_model import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")   # conftest.py

BUDGETS = Budgets(in_file=96, retrieval=64)                  # the tiny model's context is 256 tokens
BUILD = {"landmarks": 64}


def module(i: int) -> str:
    """A Python module of a small package: functions that call each other across modules."""
    body = [f'"""Module {i} of the package."""', "", "import os", f"from pkg import mod{(i + 1) % 8}", ""]
    for j in range(14):
        body += [f"def add_{i}_{j}(a, b):", f"    total = a + b + {j}", f"    return mod{(i + 1) % 8}.scale(total)", ""]
    body += ["def scale(value):", "    return value * 2", ""]
    return "\n".join(body)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo") / f"pkg-{uuid.uuid4().hex[:6]}"
    for i in range(8):
        (root / "pkg").mkdir(parents=True, exist_ok=True)
        (root / "pkg" / f"mod{i}.py").write_text(module(i))
    (root / "pkg" / "__init__.py").write_text("")
    return root


def bench(conn, roots, tiny_dir, **kwargs) -> dict:
    def hand_gate(name: str) -> None:      # what λ is must not depend on a fit on a tiny repository
        save_gate(conn, name, GATE)

    return completion.run(conn, roots, budgets=kwargs.pop("budgets", BUDGETS), held_out_files=4, lines_per_file=1,
                          model=str(tiny_dir), model_objects=tiny_model(0), gate=False, build_options=BUILD,
                          after_build=hand_gate, log=lambda *_: None, **kwargs)


@pytest.fixture(scope="module")
def results(server_url, repo_dir, tiny_dir):
    with psycopg.connect(server_url, autocommit=True) as conn:
        first = bench(conn, [repo_dir], tiny_dir)
        second = bench(conn, [repo_dir], tiny_dir, systems=("exact",), speculative=False)
    yield first, second
    drop_atom_set(server_url, first["repos"][0]["store"])


def test_every_system_completes_the_same_held_out_lines(results, repo_dir):
    first, _ = results
    repo = first["repos"][0]
    assert repo["held_out"] == list(stores.choose_held_out(repo_dir, 4, seed=0))
    rows = first["completions"]
    lines = {(c["path"], c["line"]) for c in rows}
    assert len(lines) == 4 and {c["path"] for c in rows} == set(repo["held_out"])
    for system in SYSTEMS:
        mine = [c for c in rows if c["system"] == system]
        assert {(c["path"], c["line"]) for c in mine} == lines
        assert all(0.0 <= c["es"] <= 1.0 and c["em"] in (0.0, 1.0) and 1 <= c["tokens"] <= 64 for c in mine)
    exact = {(c["path"], c["line"]): c for c in rows if c["system"] == "exact"}
    for c in rows:
        if c["system"] in ("exact + retrieval", "augmented + retrieval"):
            assert c["prompt_tokens"] <= BUDGETS.in_file + BUDGETS.retrieval
        else:
            assert c["prompt_tokens"] == exact[(c["path"], c["line"])]["prompt_tokens"] <= BUDGETS.in_file
    assert all(c["weights"] for c in rows if c["system"] == "augmented")      # λ per generated token
    text = {p: (repo_dir / p).read_text().split("\n") for p in repo["held_out"]}
    assert all(c["target"] == text[c["path"]][c["line"]].rstrip() and c["line"] >= 20 for c in rows)


def test_the_summaries_have_intervals_paired_tests_latency_and_speculative_time(results):
    first, _ = results
    for scope in (first["repos"][0]["name"], completion.POOLED):
        for system in SYSTEMS:
            row = first["table"][scope][system]
            low, high = row["em"]["ci95"]
            assert low <= row["em"]["estimate"] <= high and row["em"]["files"] == 4
            assert row["median_seconds"] > 0
    pairs = {(p["repo"], p["a"], p["b"], p["metric"]) for p in first["paired"]}
    assert (completion.POOLED, "augmented", "exact", "em") in pairs
    assert (completion.POOLED, "augmented + retrieval", "exact + retrieval", "es") in pairs
    assert first["speculative"]["identical"] and first["speculative"]["lines"] == 4
    assert first["repos"][0]["counting"]["model"] in ("∞-gram", "∞-gram + cache")
    forced = first["diagnosis"]["teacher_forced"][completion.POOLED]
    assert forced["first token"]["tokens"] == 4                        # one per line: the token with the newline
    assert forced["all"]["tokens"] == sum(r["tokens"] for name, r in forced.items() if name != "all")
    assert 0.0 <= forced["all"]["mean_weight"] <= 1.0 and forced["all"]["perplexity_exact"] > 1.0
    assert "| pooled | augmented |" in completion.markdown(first, "hartonomous bench --completion")


def test_the_store_holds_the_rest_of_the_repository_and_is_reused(results, server_url, repo_dir):
    first, second = results
    assert first["repos"][0]["build_seconds"] is not None and second["repos"][0]["build_seconds"] is None
    from hartonomous.atomset import load_atom_set

    with psycopg.connect(server_url) as conn:
        info = load_atom_set(conn, first["repos"][0]["store"])
    held = set(first["repos"][0]["held_out"])
    sources = {d.source.split("/", 1)[1] for d in stores.store_documents(info)}
    assert sources and not sources & held and sources <= {f"pkg/mod{i}.py" for i in range(8)}


def test_a_held_out_file_whose_content_is_in_the_store_is_refused_naming_it(server_url, repo_dir, tiny_dir,
                                                                            tmp_path):
    leaky = tmp_path / "leaky"
    shutil.copytree(repo_dir, leaky)
    held = stores.choose_held_out(leaky, 4, seed=0)
    (leaky / "tests").mkdir()
    shutil.copy(leaky / held[0], leaky / "tests" / "copied.py")       # not a source file: the same held-out files
    assert stores.choose_held_out(leaky, 4, seed=0) == held
    with psycopg.connect(server_url, autocommit=True) as conn:
        try:
            with pytest.raises(UserError) as caught:
                bench(conn, [leaky], tiny_dir, systems=("exact",), speculative=False)
        finally:
            drop_atom_set(server_url, stores.store_name(stores.Repository(leaky.resolve(), held)))
    message = str(caught.value)
    assert str(leaky.resolve() / held[0]) in message and "tests/copied.py" in message and "\n" not in message


def test_a_budget_over_the_model_context_is_refused_with_both_numbers(server_url, repo_dir, tiny_dir):
    with psycopg.connect(server_url, autocommit=True) as conn:
        with pytest.raises(UserError) as caught:
            bench(conn, [repo_dir], tiny_dir, budgets=Budgets(200, 64))
    assert "264" in str(caught.value) and "256" in str(caught.value)


def test_cli_refuses_a_repository_without_python_files_in_one_line(capsys, tmp_path):
    (tmp_path / "notes.txt").write_text("no code")
    code, out, err = run_cli(capsys, "bench", "--completion", "--repo", str(tmp_path))
    assert code != 0 and str(tmp_path) in err and "Python" in err
    assert len(err.strip().splitlines()) == 1


def test_a_shared_prefill_decodes_as_a_prompt_of_its_own():
    """The model's systems decode from copies of one prefill: the same tokens as each starting alone,
    and decoding one copy leaves the prefill as it was."""
    from hartonomous.backends.exact import ExactBackend
    from benchmarks.line_completion.run import fork, greedy_line, prefill
    from hartonomous.runtimes.reference import ExactModel

    model, tokenizer = tiny_model(0)
    backend = ExactBackend(ExactModel(model, tokenizer))
    ids = tokenizer("def add(a, b):\n    return a + b", add_special_tokens=False)["input_ids"]
    alone = greedy_line(backend, tokenizer, ids, new_tokens=12)
    shared, seconds = prefill(backend, ids)
    first = greedy_line(backend, tokenizer, ids, new_tokens=12, state=fork(shared), prefill_seconds=seconds)
    second = greedy_line(backend, tokenizer, ids, new_tokens=12, state=fork(shared))
    assert first[1] == alone[1] == second[1] and first[0] == alone[0]
    assert first[2] >= seconds and shared.cache.length == len(ids)


def test_merging_runs_gives_the_same_summaries_and_one_command(results):
    from benchmarks.completion_merge import merge

    first, _ = results
    merged = merge([first])
    assert merged["table"] == first["table"] and merged["paired"] == first["paired"]
    assert merged["headline"]["augmented vs exact em"]["difference"] == first["headline"]["augmented vs exact em"]["difference"]
    assert merged["command"].startswith("hartonomous bench --completion --repo ")
    assert merged["machine"]["commit"] == first["machine"]["commit"] and merged["started"] == first["started"]
