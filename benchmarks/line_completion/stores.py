"""The repositories, their held-out files, and the stores the bench builds of the rest of them.

A repository is a directory of Python files. Its held-out files are chosen by path with a seed
among its source files (not tests, not docs, not `__init__.py`, at least MIN_LINES lines); the
store is the rest of the repository's `*.py` files (`build_store`: the one place a store is
built). What a store holds is read back from its own record (`store_documents`: the build's
training documents, replayed from the recorded corpus settings and checked against the recorded
sha256), so the leakage check and the retrieval baseline see exactly the files the store saw.
"""

from __future__ import annotations

import fnmatch
import hashlib
import itertools
import random
from dataclasses import dataclass
from pathlib import Path

from hartonomous.corpus.sources import Document
from hartonomous.errors import UserError

MIN_LINES = 60              # a held-out file gives lines past its first 20 to choose from
STORE_MAX_TOKENS = 10**7    # the whole rest of the repository (every repository here is far smaller)
_SKIP_DIRS = {".git", ".hg", ".svn", "__pycache__", "build", "dist", ".tox", ".venv", "venv"}
_NOT_SOURCE = ("test_*.py", "*_test.py", "conftest.py", "__init__.py", "setup.py", "noxfile.py")


@dataclass(frozen=True)
class Repository:
    """A repository and the files held out of its store (paths relative to it, posix)."""

    root: Path
    held_out: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.root.name


def python_files(root: Path) -> list[str]:
    """The repository's `*.py` files relative to it, sorted; a one-line refusal when there are none."""
    if not root.is_dir():
        raise UserError(f"repository {root} is not a directory")
    found = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                   if p.is_file() and not _SKIP_DIRS & set(p.relative_to(root).parts[:-1]))
    if not found:
        raise UserError(f"repository {root} has no Python files (*.py); pass a directory of Python source")
    return found


def source_file(relative: str) -> bool:
    """A file of the package itself: not under tests/test/testing/docs/examples, not a test or set-up file."""
    parts = relative.split("/")
    if {"test", "tests", "testing", "docs", "doc", "examples", "benchmarks"} & set(parts[:-1]):
        return False
    return not any(fnmatch.fnmatchcase(parts[-1], p) for p in _NOT_SOURCE)


def choose_held_out(root: Path, count: int, seed: int) -> tuple[str, ...]:
    """`count` source files of at least MIN_LINES lines, drawn by `seed`, sorted by path."""
    files = python_files(root)
    pool = [f for f in files if source_file(f) and
            len((root / f).read_text(encoding="utf-8", errors="replace").split("\n")) >= MIN_LINES]
    if len(pool) < count:
        raise UserError(f"repository {root} has {len(pool)} source files of at least {MIN_LINES} lines; "
                        f"{count} are to be held out (pass a larger repository or fewer --held-out-files)")
    return tuple(sorted(random.Random(seed).sample(pool, count)))


def store_name(repo: Repository, suffix: str = "") -> str:
    """A name that says which repository and which held-out files: completion-<repo>-<8 hex>."""
    digest = hashlib.sha256("\n".join(repo.held_out).encode()).hexdigest()[:8]
    return f"completion-{repo.name}-{digest}{suffix}"


def build_store(conn, repo: Repository, name: str, *, model: str, model_objects=None, gate: bool = True,
                reporter=None, **options) -> None:
    """The store of the repository's `*.py` files less the held-out ones: `build --corpus REPO --include
    '*.py' --exclude HELD_OUT... --target corpus` (lattice keys, corpus labels, a gate), in process.
    The one place a completion store is built (the repository indexing command can take its place)."""
    from projection.build import BuildOptions, build

    built = BuildOptions(name=name, kind="context", model=model, corpus=[repo.root], include=["*.py"],
                           exclude=list(repo.held_out), max_tokens=STORE_MAX_TOKENS, target="corpus", gate=gate,
                           replace=True, **options)
    built.check()
    model_, tokenizer = model_objects if model_objects is not None else (None, None)
    kwargs = {"model": model_, "tokenizer": tokenizer} if model_objects is not None else {}
    if reporter is not None:
        kwargs["reporter"] = reporter
    build(conn, built, **kwargs)


def recorded_for(info, repo: Repository) -> bool:
    """Whether the set records a build of exactly this repository with these files held out."""
    entry = info.stats.corpus
    if entry is None or entry.split != "documents":
        return False
    return ([str(p) for p in entry.files or []] == [str(repo.root.resolve())] and list(entry.include or []) == ["*.py"]
            and sorted(entry.exclude or []) == sorted(repo.held_out))


def store_documents(info) -> list[Document]:
    """The documents the store was built from (its training documents), read again from the recorded
    corpus settings; a UserError when the files changed since the build (rebuild the store)."""
    from hartonomous.corpus.origin import documents_sha256
    from hartonomous.corpus.sources import load_corpus

    entry = info.stats.corpus
    if entry is None or entry.split != "documents":
        raise UserError(f"atom set '{info.name}' records no streamed corpus to read its files from")
    paths = [Path(f) for f in entry.files] if entry.name is None else [Path(entry.name)]
    corpus = load_corpus(paths, int(entry.max_tokens), entry.holdout_chars, int(entry.seed or 0),
                         include=entry.include or (), exclude=entry.exclude or ())
    stream = corpus.stream
    docs = list(itertools.islice(stream, int(entry.train_documents or 0)))
    for doc in docs:
        stream.take(doc)
    if documents_sha256(stream) != (entry.documents, entry.documents_sha256):
        raise UserError(f"the files of atom set '{info.name}' changed since it was built; rebuild it "
                        "(hartonomous bench --completion --rebuild)")
    return docs


def check_leakage(repo: Repository, documents: list[Document], store: str) -> None:
    """Refuse a held-out file whose content (sha256 of its bytes) is among the store's documents."""
    held = {hashlib.sha256((repo.root / f).read_bytes()).hexdigest(): f for f in repo.held_out}
    for doc in documents:
        if doc.sha256 in held:
            raise UserError(f"held-out file {repo.root / held[doc.sha256]} is in store '{store}' (the same content "
                            f"as its {doc.source.split('/', 1)[-1]}); hold out a file the store does not hold")
