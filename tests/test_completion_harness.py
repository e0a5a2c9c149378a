"""The completion harness without a database: which lines, where a prompt ends, the budgets, the
retrieval baseline on a small repository, the metrics against hand-computed cases, and the
repositories' refusals (benchmarks/line_completion)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.line_completion import metrics, retrieval, stores
from benchmarks.line_completion.lines import SKIP_FIRST, candidate, select_lines
from benchmarks.line_completion.prompts import (NEW_TOKENS, Budgets, completed_line, line_done, line_prompt,
                                            prefix_before)
from hartonomous.errors import UserError

FILE = "\n".join(
    ["# header comment", "import os", ""] + [f"CONSTANT_{i} = {i}" for i in range(20)] +
    ["", "def load(path):", "    # only a comment", "    with open(path) as handle:", "", "",
     "        return handle.read()   ", "", "class Store:", "    pass"])


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    from hartonomous.model import load_tokenizer

    return load_tokenizer("smollm2")


# --- which lines --------------------------------------------------------------------------------

def test_lines_are_past_the_first_twenty_not_blank_and_not_only_a_comment():
    lines = FILE.split("\n")
    chosen = select_lines(FILE, 100, seed=3)
    eligible = [i for i in range(SKIP_FIRST, len(lines)) if lines[i].strip() and not lines[i].strip().startswith("#")]
    assert chosen == eligible                      # asked for more than there are: every eligible line, in order
    assert all(candidate(lines[i]) for i in chosen)
    assert not candidate("    # a comment") and not candidate("   ") and candidate("x = 1  # set")


def test_the_same_seed_gives_the_same_lines_and_another_seed_others():
    text = "\n".join(f"value_{i} = {i}" for i in range(400))
    first = select_lines(text, 10, seed=1)
    assert first == select_lines(text, 10, seed=1) and len(first) == 10 and first == sorted(first)
    assert min(first) >= SKIP_FIRST
    assert select_lines(text, 10, seed=2) != first


# --- where the prompt ends, the budgets ---------------------------------------------------------

def test_the_prompt_ends_at_the_last_text_before_the_line_blank_lines_and_whitespace_cut():
    lines = FILE.split("\n")
    target = lines.index("        return handle.read()   ")
    prefix = prefix_before(FILE, target)
    assert prefix.endswith("with open(path) as handle:")
    assert FILE.startswith(prefix)


def test_the_prompt_is_the_file_tokens_cut_from_the_left_and_the_target_is_stripped(smollm2_tokenizer):
    lines = FILE.split("\n")
    target = lines.index("        return handle.read()   ")
    whole = smollm2_tokenizer(prefix_before(FILE, target), add_special_tokens=False)["input_ids"]
    prompt = line_prompt(smollm2_tokenizer, "pkg/io.py", FILE, target, in_file=17)
    assert prompt.ids == whole[-17:] and len(prompt.ids) == 17
    assert prompt.target == "        return handle.read()"
    assert line_prompt(smollm2_tokenizer, "pkg/io.py", FILE, target, in_file=10_000).ids == whole


def test_smollm2_merges_a_newline_with_the_indentation_so_the_prompt_ends_before_the_newline(smollm2_tokenizer):
    """The prompt's tokens are a prefix of the file's own tokens only when it ends before the newline."""
    tok = lambda s: smollm2_tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    code = "def load(path):\n    with open(path) as handle:\n        return handle.read()\n"
    full = tok(code)
    cut = code.index("\n        return")
    assert full[:len(tok(code[:cut]))] == tok(code[:cut])                 # ends before "\n": a token boundary
    assert full[:len(tok(code[:cut + 1]))] != tok(code[:cut + 1])         # ends after "\n": not one
    newline_indent = [t for t in full if smollm2_tokenizer.decode([t]).startswith("\n ")]
    assert newline_indent, "SmolLM2 writes a newline and the indentation as one token"


def test_the_completed_line_is_the_first_non_blank_line_after_the_first_newline():
    assert completed_line("\n        return handle.read()\n") == "        return handle.read()"
    assert completed_line("  # trailing\n\n\n    x = 1   \n    y") == "    x = 1"   # the previous line's tail skipped
    assert completed_line("\n    unfinished(") == "    unfinished("                # the token limit: what it wrote
    assert completed_line("no newline at all") == ""
    assert line_done("\n    x = 1\n") and line_done("\n\n    x = 1\n   ")
    assert not line_done("\n    x = 1") and not line_done("\n\n\n") and not line_done("tail\n")


def test_budgets_within_the_context_pass_and_larger_ones_are_refused_with_both_numbers():
    Budgets(8192 - NEW_TOKENS - 512, 512).check(8192)                    # exactly the context less 64: fine
    with pytest.raises(UserError) as caught:
        Budgets(8000, 512).check(8192)
    message = str(caught.value)
    assert "8512" in message and "8192" in message and "\n" not in message
    with pytest.raises(UserError, match="--in-file-tokens"):
        Budgets(0, 10).check(8192)
    with pytest.raises(UserError, match="--retrieval-tokens"):
        Budgets(10, -1).check(8192)


# --- metrics ------------------------------------------------------------------------------------

def test_exact_match_and_edit_similarity_against_hand_computed_cases():
    assert metrics.exact_match("    return x   ", "    return x") == 1.0
    assert metrics.exact_match("return x", "    return x") == 0.0          # indentation counts
    assert metrics.edit_similarity("abc", "abd") == pytest.approx(2 / 3)   # 1 substitution in 3
    assert metrics.edit_similarity("return a", "return ab") == pytest.approx(1 - 1 / 9)
    assert metrics.edit_similarity("", "") == 1.0 and metrics.edit_similarity("abc", "") == 0.0
    assert metrics.edit_similarity("x = 1  ", "x = 1") == 1.0


def test_intervals_resample_whole_files():
    # file a: three right lines, file b: one wrong one. Resampling files gives means of 1, 0.75 or 0
    # only; resampling lines would also give 0.25 and 0.5.
    values, files = [1, 1, 1, 0], ["a", "a", "a", "b"]
    i = metrics.interval(values, files)
    assert i["estimate"] == 0.75 and i["lines"] == 4 and i["files"] == 2
    assert i["ci95"] == [0.0, 1.0]


def test_paired_differences_are_per_line_and_resample_files():
    a, b = [1, 1, 0, 0, 1, 1], [0, 1, 0, 0, 0, 1]
    files = ["f", "f", "g", "g", "h", "h"]
    test = metrics.paired(a, b, files, "em", ("augmented", "exact"))
    assert test["difference"] == pytest.approx(2 / 6) and test["files"] == 3 and test["lines"] == 6
    low, high = test["ci95"]
    assert low <= 2 / 6 <= high and low >= 0.0                      # no file is worse: never below 0
    same = metrics.paired(a, a, files, "em", ("x", "x"))
    assert same["difference"] == 0 and same["verdict"] == "no difference" and same["p"] == 1.0
    assert metrics.median([3.0, 1.0, 2.0, 10.0]) == 2.5 and metrics.median([]) is None


# --- the retrieval baseline ---------------------------------------------------------------------

REPO_FILES = {
    "pkg/cache.py": "\n".join(["import time", "", "class LruCache:", "    def __init__(self, capacity):",
                               "        self.capacity = capacity", "        self.entries = {}", "",
                               "    def evict_oldest(self):", "        oldest = min(self.entries, key=self.entries.get)",
                               "        del self.entries[oldest]"] + [f"# filler line {i}" for i in range(30)]),
    "pkg/net.py": "\n".join(["import socket", "", "def open_socket(host, port):",
                             "    return socket.create_connection((host, port))"] + [f"X{i} = {i}" for i in range(25)]),
}


def test_windows_cover_each_file_to_its_end_every_stride_lines():
    text = "\n".join(f"line {i}" for i in range(45))
    chunks = retrieval.chunks_of("a.py", text, window=20, stride=10)
    assert [c.first for c in chunks] == [0, 10, 20, 25]
    assert chunks[-1].text.split("\n")[-1] == "line 44"
    assert [c.first for c in retrieval.chunks_of("b.py", "x = 1\ny = 2")] == [0]


def test_retrieval_finds_the_chunk_that_defines_what_the_code_before_the_cursor_uses(smollm2_tokenizer):
    r = retrieval.Retriever(list(REPO_FILES.items()))
    query = "def refresh(cache):\n    cache.evict_oldest()\n    if len(cache.entries) > cache.capacity:"
    best, score = r.ranked(query)[0]
    assert best.path == "pkg/cache.py" and best.first == 0 and score > 0
    block, taken = r.block(query, smollm2_tokenizer, budget=400)
    assert taken[0].path == "pkg/cache.py"
    assert len(smollm2_tokenizer(block, add_special_tokens=False)["input_ids"]) <= 400
    assert all(line.startswith("#") for line in block.split("\n") if line)   # comments only
    assert block.rstrip("\n").split("\n")[-(len(taken[0].text.split("\n"))):] == \
        [("# " + line).rstrip() for line in taken[0].text.split("\n")]          # the best chunk last
    starts = [(c.path, c.first) for c in taken]
    assert len(starts) == len(set(starts))
    assert all(abs(x.first - y.first) >= 20 for x in taken for y in taken if x is not y and x.path == y.path)


def test_retrieval_keeps_to_its_budget_and_leaves_out_the_current_file(smollm2_tokenizer):
    r = retrieval.Retriever(list(REPO_FILES.items()))
    query = "cache.evict_oldest()"
    assert r.block(query, smollm2_tokenizer, budget=5) == ("", [])       # no chunk fits 5 tokens
    block, taken = r.block(query, smollm2_tokenizer, budget=400, exclude_path="pkg/cache.py")
    assert all(c.path != "pkg/cache.py" for c in taken)
    ids = retrieval.with_retrieval(smollm2_tokenizer, block, [1, 2, 3])
    assert ids[-3:] == [1, 2, 3]


# --- repositories -------------------------------------------------------------------------------

def write_repo(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_repository_without_python_files_is_refused_in_one_line_naming_it(tmp_path):
    write_repo(tmp_path, {"README.md": "# nothing here", "src/data.json": "{}"})
    with pytest.raises(UserError) as caught:
        stores.python_files(tmp_path)
    assert str(tmp_path) in str(caught.value) and "\n" not in str(caught.value)


def test_held_out_files_are_source_files_of_enough_lines_chosen_by_the_seed(tmp_path):
    long = "\n".join(f"v{i} = {i}" for i in range(stores.MIN_LINES))
    write_repo(tmp_path, {**{f"pkg/mod{i}.py": long for i in range(8)}, "pkg/short.py": "x = 1",
                          "tests/test_mod.py": long, "pkg/__init__.py": long, "docs/conf.py": long})
    held = stores.choose_held_out(tmp_path, 4, seed=0)
    assert held == stores.choose_held_out(tmp_path, 4, seed=0) and len(held) == 4 and list(held) == sorted(held)
    assert all(h.startswith("pkg/mod") for h in held)
    assert {stores.choose_held_out(tmp_path, 4, seed=s) for s in range(5)} != {held}
    with pytest.raises(UserError, match="8 source files"):
        stores.choose_held_out(tmp_path, 9, seed=0)
    assert "tests/test_mod.py" in stores.python_files(tmp_path)      # the store holds tests too; only source is held out
