"""Corpora at scale: directories, built-in corpora, a holdout cut by document, training text streamed.

`hartonomous build --corpus PATH... [--include GLOB...]` walks directories, skips what is not text
or repeats, orders the files by a seeded hash of their path, holds out whole documents (the same
ones whatever --max-tokens is), and reads and tokenizes the training documents only as far as
--max-tokens needs. The set records where the text came from, and compare reads it again from
that record, or says why it cannot.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from hartonomous.corpus import sources as corpus_mod
from hartonomous.atomset.record import BuildStats, CorpusStats
from hartonomous.corpus.sources import (CHARS_PER_TOKEN_BOUND, HOLDOUT_DOC_MAX_CHARS, HOLDOUT_MAX_CHARS, HOLDOUT_PASSES,
                                PYTHON_SOURCE, SEPARATOR, list_files, load_corpus, python_source_files, read_documents,
                                resolve_source, seeded_order, tokenize, training_tokens)
from hartonomous.corpus.origin import CorpusUnavailable, origin_stats, recorded_training_text
from hartonomous.errors import UserError


@pytest.fixture(scope="module")
def tokenizer():
    from hartonomous.model import load_tokenizer

    return load_tokenizer("smollm2")


def paragraph(i: int, words: int = 40) -> str:
    return f"Document {i} explains item {i % 7}. " + " ".join(f"word{(i * j) % 53}" for j in range(words))


def write_docs(folder: Path, n: int, words: int = 40, suffix: str = ".txt") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"doc{i:03d}{suffix}" for i in range(n)]
    for i, path in enumerate(paths):
        path.write_text(paragraph(i, words) + "\n", encoding="utf-8")
    return paths


def take_tokens(corpus, tokenizer, max_tokens: int) -> np.ndarray:
    return training_tokens(corpus, tokenizer, max_tokens).ids


def entry_of(corpus, paths, max_tokens: int, seed: int, holdout_chars: int | None = None) -> CorpusStats:
    """stats.corpus as a build records it (after its training tokens were taken)."""
    return CorpusStats(**origin_stats(paths, corpus), max_tokens=max_tokens, seed=seed, holdout_chars=holdout_chars)


# --- what --corpus and --include name -------------------------------------------------------------

def test_a_directory_is_walked_recursively_with_include_globs_and_vcs_folders_left_out(tmp_path):
    root = tmp_path / "src"
    for rel in ("a/x.py", "a/b/y.py", "z.txt", "top.py", ".git/hooks/pre.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(f"text of {rel}\n", encoding="utf-8")
    every = [f.key for f in list_files(resolve_source([root]))]
    assert every == ["0/a/b/y.py", "0/a/x.py", "0/top.py", "0/z.txt"]
    python = [f.key for f in list_files(resolve_source([root], ["*.py"]))]
    assert python == ["0/a/b/y.py", "0/a/x.py", "0/top.py"]
    both = [f.key for f in list_files(resolve_source([root, root / "z.txt"], ["x.*", "*.txt"]))]
    assert both == ["0/a/x.py", "0/z.txt", "1/z.txt"]   # a named file is always read; roots are numbered


def test_binary_non_utf8_empty_and_duplicate_files_in_a_directory_are_skipped_and_counted(tmp_path):
    root = tmp_path / "mixed"
    root.mkdir()
    (root / "good.txt").write_text("good text", encoding="utf-8")
    (root / "copy.txt").write_text("good text", encoding="utf-8")
    (root / "image.bin").write_bytes(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    (root / "latin1.txt").write_bytes("café".encode("latin-1"))
    (root / "blank.txt").write_text("  \n\n", encoding="utf-8")
    (root / "crlf.txt").write_bytes(b"\xef\xbb\xbfline one\r\nline two\r\n")
    skipped: Counter = Counter()
    docs = list(read_documents(seeded_order(list_files(resolve_source([root])), 0), skipped))
    assert sorted(d.text for d in docs) == ["good text", "line one\nline two"]   # BOM and CRLF normalised
    assert skipped == {"not UTF-8 text": 2, "duplicate": 1, "empty": 1}


def test_a_named_file_that_is_not_utf8_is_an_error_as_before(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes("café".encode("latin-1"))
    folder = tmp_path / "docs"
    write_docs(folder, 3)
    with pytest.raises(UserError, match=f"corpus file '{bad}' is not UTF-8 text"):
        load_corpus([bad], 1000)
    with pytest.raises(UserError, match=f"corpus file '{bad}' is not UTF-8 text"):
        load_corpus([folder, bad], 1000)


def test_mistakes_are_one_line_user_errors(tmp_path):
    from projection.options import BuildOptions

    folder = tmp_path / "docs"
    write_docs(folder, 3)
    file = folder / "doc000.txt"
    cases = [(([tmp_path / "missing"], []), "corpus file '.*missing' does not exist$"),
             (([Path("wikipedia")], []), r"'wikipedia' is not a built-in corpus \(reserved names: python-docstrings, "
                                         r"python-source\)"),
             (([file], ["*.py"]), "--include picks files in --corpus directories, and no --corpus is a directory"),
             (([], ["*.py"]), "--include picks files in --corpus directories"),
             (([Path(PYTHON_SOURCE), folder], []), "python-source is a built-in corpus; it cannot be combined"),
             (([Path(PYTHON_SOURCE)], ["*.py"]), "the built-in corpus python-source has its own files")]
    for (paths, include), message in cases:
        with pytest.raises(UserError, match=message):
            BuildOptions(name="x", corpus=paths, include=include).check()
    with pytest.raises(UserError, match=r"corpus directory '.*docs' has no files matching --include \*.rs"):
        load_corpus([folder], 1000, include=["*.rs"])
    with pytest.raises(UserError, match="the holdout needs two documents"):
        load_corpus([folder], 1000, holdout_chars=100)


# --- the seeded order and the holdout ------------------------------------------------------------------

def test_the_seeded_order_is_deterministic_and_a_file_keeps_its_place_among_others(tmp_path):
    write_docs(tmp_path / "d", 30)
    files = list_files(resolve_source([tmp_path / "d"]))
    order = [f.key for f in seeded_order(files, 7)]
    assert order == [f.key for f in seeded_order(list(reversed(files)), 7)]
    assert order != sorted(order) and order != [f.key for f in seeded_order(files, 8)]
    fewer = [f.key for f in seeded_order(files[::2], 7)]
    assert fewer == [key for key in order if key in set(fewer)]


def test_the_holdout_is_whole_documents_in_alternating_halves_whatever_max_tokens(tmp_path):
    folder = tmp_path / "docs"
    write_docs(folder, 60, words=60)
    (folder / "long.txt").write_text("x " * HOLDOUT_DOC_MAX_CHARS, encoding="utf-8")
    small = load_corpus([folder], 50, holdout_chars=3000, seed=1)
    large = load_corpus([folder], 50_000, holdout_chars=3000, seed=1, train=False)
    assert (small.holdout_text, small.calibration_text, small.test_text) == \
        (large.holdout_text, large.calibration_text, large.test_text)
    held = small.stream.holdout
    texts = {p.read_text(encoding="utf-8").strip() for p in folder.iterdir()}
    assert len(held) >= 4 and all(d.text in texts for d in held)            # whole files
    assert small.calibration_text == SEPARATOR.join(d.text for d in held[0::2])
    assert small.test_text == SEPARATOR.join(d.text for d in held[1::2])
    assert small.holdout_text == small.calibration_text + SEPARATOR + small.test_text
    assert len(small.holdout_text) <= 3000 and all(len(d.text) <= HOLDOUT_DOC_MAX_CHARS for d in held)
    assert load_corpus([folder], 50, seed=2).holdout_text != small.holdout_text
    assert len(load_corpus([folder], 50, seed=1).stream.holdout) == 7       # at most a tenth of the 61 files
    large_docs = tmp_path / "large"
    write_docs(large_docs, 200, words=600)                                    # ~5,000 characters each
    default = load_corpus([large_docs], 50, seed=1)
    assert HOLDOUT_MAX_CHARS - 5_500 < len(default.holdout_text) <= HOLDOUT_MAX_CHARS


# --- the training stream -------------------------------------------------------------------------------

def test_training_tokens_stream_the_other_documents_cut_at_exactly_max_tokens(tmp_path, tokenizer):
    folder = tmp_path / "docs"
    write_docs(folder, 80)
    corpus = load_corpus([folder], 1500, holdout_chars=2000, seed=3)
    ids = take_tokens(corpus, tokenizer, 1500)
    assert ids.dtype == np.int64 and len(ids) == 1500
    stream = corpus.stream
    taken = [key for key, _ in stream.taken]
    assert not set(taken) & {d.source for d in stream.holdout}
    order = [f.key for f in seeded_order(list_files(resolve_source([folder])), 3)]
    assert taken == [key for key in order if key not in {d.source for d in stream.holdout}][:len(taken)]
    # the stream is the tokenization of the documents taken, joined by a blank line
    text = SEPARATOR.join((folder / key.split("/", 1)[1]).read_text(encoding="utf-8").strip() for key in taken)
    assert tokenize(tokenizer, text)[0][:1500].tolist() == ids.tolist()


def test_streaming_stops_reading_files_once_max_tokens_are_reached(tmp_path, tokenizer, monkeypatch):
    folder = tmp_path / "docs"
    write_docs(folder, 300)
    opened: list[Path] = []
    read_bytes = Path.read_bytes

    def counting(path: Path) -> bytes:
        opened.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counting)
    corpus = load_corpus([folder], 3000, holdout_chars=1000, seed=0)
    in_holdout = len(opened)          # the holdout's documents and those passed over for it
    assert in_holdout <= len(corpus.stream.holdout) + HOLDOUT_PASSES
    ids = take_tokens(corpus, tokenizer, 3000)
    used = len(corpus.stream.holdout) + len(corpus.stream.taken)
    assert len(ids) == 3000 and used > in_holdout          # training read on past the holdout's files ...
    assert len(opened) < 2 * used and len(opened) < 60     # ... and stopped soon after its tokens: of 300 files


def test_load_texts_gives_the_halves_and_the_streamed_training_chunks_with_progress(tmp_path, tokenizer):
    from projection.options import BuildOptions
    from projection.progress import Reporter
    from projection.stages import load_texts

    class Bars(Reporter):
        def __init__(self):
            self.bars, self.advanced = [], 0

        def bar(self, description, total, unit="it"):
            self.bars.append((description, total, unit))
            return super().bar(description, total, unit)

    folder = tmp_path / "docs"
    write_docs(folder, 80)
    ui = Bars()
    options = BuildOptions(name="x", corpus=[folder], include=["*.txt"], max_tokens=700, context_length=64,
                           holdout_chars=2000, seed=5)
    texts = load_texts(options, tokenizer, ui)
    corpus = load_corpus([folder], 700, holdout_chars=2000, seed=5)
    assert (texts.calibration_text, texts.test_text) == (corpus.calibration_text, corpus.test_text)
    assert np.concatenate(texts.train_chunks).tolist() == take_tokens(corpus, tokenizer, 700).tolist()
    assert [len(c) for c in texts.train_chunks] == [64] * 10 + [60] and texts.train_text == ""
    assert ui.bars == [("training tokens", 700, "tok")]


# --- python-source -------------------------------------------------------------------------------------

def test_python_source_is_the_stdlib_and_site_packages_without_tests():
    import numpy

    keys = {f.key for f in python_source_files()}
    assert "0/json/__init__.py" in keys and "0/asyncio/tasks.py" in keys       # root 0: the stdlib
    site = {key.split("/", 1)[1] for key in keys if not key.startswith("0/")}
    assert "numpy/__init__.py" in site and "numpy/linalg/linalg.py" in site or "numpy/linalg/_linalg.py" in site
    assert (Path(numpy.__file__).parent / "linalg" / "tests").is_dir() and "numpy/conftest.py" not in site
    left_out = {"test", "tests", "testing", "__pycache__", "idlelib", "lib2to3", "turtledemo", "ensurepip", "venv",
                "site-packages"}
    assert not any(left_out & set(key.split("/")[1:-1]) for key in keys)
    names = [key.rsplit("/", 1)[1] for key in keys]
    assert all(n.endswith(".py") and not n.startswith("test_") and not n.endswith("_test.py") and n != "conftest.py"
               for n in names)
    assert len(keys) > 1000


def test_python_source_records_its_version_and_is_refused_with_other_packages(tokenizer):
    corpus = load_corpus([Path(PYTHON_SOURCE)], 2000, seed=0)
    ids = take_tokens(corpus, tokenizer, 2000)
    entry = entry_of(corpus, [Path(PYTHON_SOURCE)], 2000, 0)
    assert entry.name == PYTHON_SOURCE and entry.split == "documents" and entry.files == []
    assert entry.version.startswith("Python 3.") and f"{len(entry.distributions)} distributions" in entry.version
    assert any(d.startswith("numpy==") for d in entry.distributions)
    text = recorded_training_text(entry, corpus.holdout_text)
    assert tokenize(tokenizer, text.text)[0][:2000].tolist() == ids.tolist()
    assert text.origin == {"kind": "builtin", "name": PYTHON_SOURCE, "version": entry.version, "files": [],
                           "exclude": []}
    other = entry.model_copy(update={"version": "Python 3.11.7; 2 distributions, sha256 0123456789abcdef",
                                     "distributions": ["numpy==0.1", entry.distributions[0]]})
    with pytest.raises(CorpusUnavailable, match=r"not installed now: numpy==0.1; installed since: .*cannot be rebuilt"):
        recorded_training_text(other, corpus.holdout_text)


# --- what a set records, and the text read again from it -----------------------------------------------

def test_the_record_names_the_paths_not_every_file_and_gives_the_text_back_until_a_read_file_changes(
        tmp_path, tokenizer):
    folder = tmp_path / "docs"
    write_docs(folder, 120)
    corpus = load_corpus([folder], 600, holdout_chars=1500, seed=4, include=["*.txt"])
    ids = take_tokens(corpus, tokenizer, 600)
    entry = entry_of(corpus, [folder], 600, 4, 1500)
    assert (entry.files, entry.sha256, entry.include) == ([str(folder.resolve())], [], ["*.txt"])   # no file list
    assert entry.listed_files == 120 and len(entry.documents_sha256) == 64
    assert entry.documents == entry.holdout_documents + entry.train_documents < 120
    assert BuildStats.from_json(BuildStats(corpus=entry).to_json()).corpus == entry   # stored and read back
    text = recorded_training_text(entry, corpus.holdout_text)
    assert tokenize(tokenizer, text.text)[0][:600].tolist() == ids.tolist()
    assert text.origin["kind"] == "paths" and text.origin["documents"] == entry.documents
    last = seeded_order(list_files(resolve_source([folder], ["*.txt"])), 4)[-1].path   # never read at 600 tokens
    last.write_text("changed, but the build never read it", encoding="utf-8")
    assert recorded_training_text(entry, corpus.holdout_text).text == text.text
    trained = corpus.stream.taken[0][0].split("/", 1)[1]
    (folder / trained).write_text("a changed training document", encoding="utf-8")
    with pytest.raises(CorpusUnavailable, match="the files the build read changed since the build"):
        recorded_training_text(entry, corpus.holdout_text)
    missing = entry.model_copy(update={"files": [str(tmp_path / "gone")]})
    with pytest.raises(CorpusUnavailable, match="gone is not there any more"):
        recorded_training_text(missing, corpus.holdout_text)


def test_a_token_set_gets_back_the_training_text_a_context_set_would_read(tmp_path):
    folder = tmp_path / "docs"
    write_docs(folder, 120)
    corpus = load_corpus([folder], 200, holdout_chars=1500, seed=4, train=False)   # a token set takes no tokens
    entry = entry_of(corpus, [folder], 200, 4, 1500)
    assert (entry.train_documents, entry.train_sha256) == (0, None)
    text = recorded_training_text(entry, corpus.holdout_text).text
    assert len(text) >= 200 * CHARS_PER_TOKEN_BOUND and not any(d.text in text for d in corpus.stream.holdout)


def test_python_docstrings_is_the_default_byte_for_byte():
    named = load_corpus([Path("python-docstrings")], 3000, None, 2)
    default = load_corpus(None, 3000, None, 2)
    assert (named.description, named.holdout_text, named.train_text, named.calibration_text, named.test_text) == \
        (default.description, default.holdout_text, default.train_text, default.calibration_text, default.test_text)
    assert named.stream is None and named.train_segments == default.train_segments > 0
    record = origin_stats([Path("python-docstrings")], named)
    assert record == origin_stats([], default) and record["split"] == "segments"
    assert record["name"] == corpus_mod.BUILTIN_CORPUS


def test_recorded_halves_cut_a_document_holdout_where_the_build_did() -> None:
    """compare, the benchmarks and the build read the same halves: at the calibration half's recorded
    length for a corpus held out by document, split_holdout's segments otherwise."""
    from types import SimpleNamespace

    from hartonomous.splits import recorded_halves, split_holdout

    calibration, test = "def a():\n\n    return 1\n", "class B:\n    pass\n\n\nx = 2\n"
    stats = SimpleNamespace(holdout=SimpleNamespace(text=calibration + "\n\n" + test),
                            corpus=SimpleNamespace(split="documents"),
                            calibration_split=SimpleNamespace(chars=len(calibration)))
    halves = recorded_halves(stats)
    assert (halves.calibration, halves.test) == (calibration, test)
    stats.corpus.split = "segments"
    assert recorded_halves(stats) == split_holdout(calibration + "\n\n" + test)
