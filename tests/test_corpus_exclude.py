"""`hartonomous build --exclude GLOB`: files of a corpus left out by their path relative to its root.

A file of a --corpus directory (or of python-source, relative to the stdlib or its site-packages
directory) whose path matches an --exclude glob (fnmatch: `*` also matches `/`) is neither training
text nor holdout. The set records the globs and how many files they left out, and the training text
read again for `compare` leaves out the same files.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from hartonomous.atomset.record import BuildStats, CorpusStats
from hartonomous.compare.schema import report_schema
from hartonomous.corpus.origin import CorpusUnavailable, origin_stats, recorded_training_text
from hartonomous.corpus.sources import (PYTHON_SOURCE, SEPARATOR, corpus_listing, list_files, load_corpus,
                                        resolve_source, tokenize, training_tokens)
from hartonomous.errors import UserError


@pytest.fixture(scope="module")
def tokenizer():
    from hartonomous.model import load_tokenizer

    return load_tokenizer("smollm2")


def write(root: Path, rel: str, words: int = 30) -> None:
    """A file whose text names its own path (so that the text shows where it came from)."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"FILE<{rel}> " + " ".join(f"w{(len(rel) * j) % 41}" for j in range(words)) + "\n",
                    encoding="utf-8")


def project_tree(root: Path) -> dict[str, list[str]]:
    """A corpus directory: kept files, a vendored package and a test folder to leave out, one held-out file."""
    groups = {"kept": [f"pkg/mod{i}.txt" for i in range(12)] + [f"pkg/sub/part{i}.txt" for i in range(6)],
              "vendored": [f"vendor/lib{i}.txt" for i in range(5)] + ["vendor/deep/inner.txt"],
              "tests": [f"test/case{i}.txt" for i in range(4)],
              "held": ["pkg/sub/secret.txt"]}
    for rels in groups.values():
        for rel in rels:
            write(root, rel)
    return groups


def every_text(corpus) -> tuple[str, list[str]]:
    """(the holdout, every training document) of a streamed corpus, all of its documents taken."""
    docs = []
    for doc in corpus.stream:
        corpus.stream.take(doc)
        docs.append(doc.text)
    return corpus.holdout_text, docs


EXCLUDE = ["vendor/*", "test/*", "pkg/sub/secret.txt"]


def test_excluded_files_are_neither_training_text_nor_holdout(tmp_path):
    root = tmp_path / "project"
    groups = project_tree(root)
    corpus = load_corpus([root], 10_000, holdout_chars=600, seed=3, exclude=EXCLUDE)
    holdout, training = every_text(corpus)
    text = holdout + SEPARATOR + SEPARATOR.join(training)
    left_out = groups["vendored"] + groups["tests"] + groups["held"]
    assert not [rel for rel in left_out if f"FILE<{rel}>" in text]
    assert all(f"FILE<{rel}>" in text for rel in groups["kept"])   # every other file is read, once
    assert len(corpus.stream.holdout) + len(training) == len(groups["kept"])
    assert (corpus.stream.excluded, corpus.stream.listed) == (len(left_out), len(groups["kept"]))
    assert "excluding vendor/*, test/*, pkg/sub/secret.txt" in corpus.description
    everything = load_corpus([root], 10_000, holdout_chars=600, seed=3)
    assert (everything.stream.excluded, everything.stream.listed) == (0, sum(map(len, groups.values())))


def test_globs_match_the_path_relative_to_the_root_and_star_crosses_folders(tmp_path):
    root = tmp_path / "project"
    project_tree(root)
    (root / ".git").mkdir()
    write(root, ".git/config")

    def keys(*globs: str) -> list[str]:
        return [f.key.split("/", 1)[1] for f in list_files(resolve_source([root], exclude=globs))]

    every = keys()
    assert ".git/config" not in every                                           # never walked anyway
    assert not [k for k in keys("vendor/*") if k.startswith("vendor/")]         # vendor/deep/inner.txt too
    assert keys("secret.txt") == every                                          # a bare name is not a path
    assert "pkg/sub/secret.txt" not in keys("*secret.txt") and len(keys("*secret.txt")) == len(every) - 1
    assert keys("*/sub/*") == [k for k in every if not k.startswith("pkg/sub/")]
    assert keys("nothing/matches/*") == every                                   # a glob may match nothing
    assert corpus_listing(resolve_source([root], exclude=["nothing/*"])).excluded == 0
    assert keys("PKG/*") == every                                               # case-sensitive


def test_excludes_apply_to_each_directory_relative_to_its_own_root_and_never_to_a_named_file(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    for root in (first, second):
        write(root, "a/x.txt")
        write(root, "b/y.txt")
    named = first / "a" / "x.txt"
    listing = corpus_listing(resolve_source([first, second, named], exclude=["a/*"]))
    assert [f.key for f in listing.files] == ["0/b/y.txt", "1/b/y.txt", "2/x.txt"]
    assert listing.excluded == 2


def test_the_set_records_the_globs_and_compare_reads_the_same_training_text_again(tmp_path, tokenizer):
    root = tmp_path / "project"
    project_tree(root)
    corpus = load_corpus([root], 400, holdout_chars=600, seed=5, include=["*.txt"], exclude=EXCLUDE)
    ids = training_tokens(corpus, tokenizer, 400).ids
    entry = CorpusStats(**origin_stats([root], corpus), max_tokens=400, seed=5, holdout_chars=600)
    assert (entry.include, entry.exclude, entry.excluded) == (["*.txt"], EXCLUDE, 11)
    assert BuildStats.from_json(BuildStats(corpus=entry).to_json()).corpus == entry   # stored and read back
    text = recorded_training_text(entry, corpus.holdout_text)
    assert text.text.count(SEPARATOR) + 1 == entry.train_documents and "FILE<vendor/" not in text.text
    assert tokenize(tokenizer, text.text)[0][:400].tolist() == ids.tolist()
    assert text.origin["exclude"] == EXCLUDE
    # compare's report carries this origin: the report schema accepts it (a directory corpus: "paths")
    origin_schema = report_schema()["properties"]["baselines"]["properties"]["distillation"]["properties"]["origin"]
    jsonschema.validate(text.origin, origin_schema)
    ignored = entry.model_copy(update={"exclude": None})   # read again without the globs: other documents
    with pytest.raises(CorpusUnavailable):
        recorded_training_text(ignored, corpus.holdout_text)


def test_a_build_says_how_many_files_it_left_out(tmp_path, tokenizer):
    from projection.options import BuildOptions
    from projection.progress import Reporter
    from projection.stages import load_texts

    class Lines(Reporter):
        def __init__(self) -> None:
            self.lines: list[str] = []

        def step(self, message: str) -> None:
            self.lines.append(message)

    root = tmp_path / "project"
    project_tree(root)
    ui = Lines()
    options = BuildOptions(name="x", corpus=[root], exclude=["vendor/*"], max_tokens=300, holdout_chars=600,
                           context_length=64)
    texts = load_texts(options, tokenizer, ui)
    assert [line for line in ui.lines if "--exclude" in line] == ["--exclude vendor/*: 6 files left out of the "
                                                                  "corpus, 23 listed"]
    assert "FILE<vendor/" not in texts.calibration_text + texts.test_text
    quiet = Lines()
    load_texts(BuildOptions(name="x", corpus=[root], max_tokens=300, holdout_chars=600, context_length=64),
               tokenizer, quiet)
    assert not [line for line in quiet.lines if "--exclude" in line]


def test_python_source_leaves_out_files_relative_to_the_stdlib_and_each_site_packages_folder():
    every = corpus_listing(resolve_source([Path(PYTHON_SOURCE)]))
    keys = {f.key for f in every.files}
    assert "0/json/decoder.py" in keys and every.excluded == 0
    site = {k for k in keys if not k.startswith("0/") and k.split("/", 1)[1].startswith("numpy/")}
    assert site
    listing = corpus_listing(resolve_source([Path(PYTHON_SOURCE)], exclude=["json/decoder.py", "numpy/*"]))
    kept = {f.key for f in listing.files}
    assert "0/json/decoder.py" not in kept and "0/json/encoder.py" in kept
    assert not site & kept
    assert kept == {k for k in keys if k != "0/json/decoder.py" and k not in site}
    assert listing.excluded == len(keys) - len(kept)


def test_exclude_is_refused_where_there_are_no_files_to_leave_out(tmp_path):
    from projection.options import BuildOptions

    root = tmp_path / "project"
    project_tree(root)
    file = root / "pkg" / "mod0.txt"
    cases = [([file], "--exclude leaves out files of --corpus directories or of python-source, and no --corpus "
                      r"is one \(a file named on the command line is read whole\)"),
             ([], "--exclude leaves out files of --corpus directories or of python-source"),
             ([Path("python-docstrings")], "the built-in corpus python-docstrings is read from docstrings")]
    for paths, message in cases:
        with pytest.raises(UserError, match=message):
            BuildOptions(name="x", corpus=paths, exclude=["pkg/*"]).check()
        with pytest.raises(UserError, match=message):
            load_corpus(paths, 1000, exclude=["pkg/*"])
    with pytest.raises(UserError, match=r"every file of corpus directory '.*project' matches --exclude \*"):
        load_corpus([root], 1000, exclude=["*"])
    BuildOptions(name="x", corpus=[Path(PYTHON_SOURCE)], exclude=["numpy/*"]).check()   # accepted
