"""The distillation corpus: the default (Python stdlib docstrings) or user files; seeded holdout.

The default corpus is extracted from the running interpreter's standard library with `ast`
(no network, no download): every module, class and function docstring of at least 40
characters, in sorted file order, exact duplicates dropped. It is deterministic for a given
Python version, which the build records.

A corpus is cut into segments (paragraph groups of at most `SEGMENT_CHARS`), shuffled with the
seed; the first segments form the holdout, which is never used for atoms, and the rest are
joined into the training text. The training text is tokenized once and cut into chunks of
`--context-length` tokens (`tokenize`, `chunk_ids`), each one context. A build records where its
text came from, not the text (hartonomous.corpus_origin).
"""

from __future__ import annotations

import ast
import os
import platform
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hartonomous.errors import UserError
from hartonomous.teacher import windows

SEGMENT_CHARS = 2000
MIN_DOCSTRING_CHARS = 40
HOLDOUT_MAX_CHARS = 50_000
CHARS_PER_TOKEN_BOUND = 8  # read at most this many characters per wanted training token
SEPARATOR = "\n\n"
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3",
              "turtledemo", "ensurepip", "venv"}


@dataclass(frozen=True)
class Document:
    source: str
    text: str


@dataclass
class Corpus:
    """Training text and held-out text, with a description of where they came from."""

    description: str
    train_text: str
    holdout_text: str
    holdout_segments: int
    train_segments: int


BUILTIN_CORPUS = "python-stdlib-docstrings"


def builtin_version() -> str:
    """The version of the built-in corpus: the interpreter whose standard library it is read from."""
    return f"Python {platform.python_version()}"


def default_corpus_name() -> str:
    return f"{BUILTIN_CORPUS} ({builtin_version()})"


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("config-"))
        files += [Path(folder) / n for n in names if n.endswith(".py")]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstrings(node: ast.AST, prefix: str) -> Iterator[tuple[str, str]]:
    """(qualified name, docstring) of node and everything defined inside it, in source order."""
    if isinstance(node, _DOC_NODES):
        doc = ast.get_docstring(node, clean=True)
        if doc:
            yield prefix, doc
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _DOC_NODES):
            yield from _docstrings(child, f"{prefix}.{child.name}")
        elif not isinstance(child, ast.expr):
            yield from _docstrings(child, prefix)


def stdlib_documents() -> list[Document]:
    """Docstrings of the Python standard library, one document each, deterministic."""
    root = Path(sysconfig.get_paths()["stdlib"])
    seen: set[str] = set()
    docs: list[Document] = []
    for path in _stdlib_files():
        module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for name, doc in _docstrings(tree, module):
            if len(doc) >= MIN_DOCSTRING_CHARS and doc not in seen:
                seen.add(doc)
                docs.append(Document(name, doc))
    if not docs:
        raise UserError("no docstrings found in the Python standard library; pass --corpus FILE")
    return docs


def file_documents(paths: list[Path]) -> list[Document]:
    """One document per UTF-8 text file."""
    from hartonomous.textfiles import read_user_text

    docs = []
    for path in paths:
        text = read_user_text(path, f"corpus file '{path}'")
        docs.append(Document(str(path), text))
    return docs


def segments(docs: list[Document], max_chars: int = SEGMENT_CHARS) -> list[str]:
    """Paragraph groups of at most max_chars (a longer single paragraph stays whole)."""
    out: list[str] = []
    for doc in docs:
        current = ""
        for para in (p.strip("\n") for p in doc.text.replace("\r\n", "\n").split("\n\n")):
            if not para.strip():
                continue
            if current and len(current) + len(SEPARATOR) + len(para) > max_chars:
                out.append(current)
                current = ""
            current = f"{current}{SEPARATOR}{para}" if current else para
        if current:
            out.append(current)
    return out


def split_corpus(docs: list[Document], description: str, holdout_chars: int, max_train_chars: int | None,
                 seed: int = 0) -> Corpus:
    """Seeded shuffle of the segments; the first ~holdout_chars are held out, the rest train."""
    segs = segments(docs)
    if len(segs) < 2:
        raise UserError("the corpus needs at least two paragraphs (one is held out); add text")
    order = np.random.default_rng(seed).permutation(len(segs))
    holdout: list[str] = []
    used = 0
    pos = 0
    holdout_chars = min(holdout_chars, HOLDOUT_MAX_CHARS)
    while pos < len(order) - 1 and (not holdout or used + len(segs[order[pos]]) <= holdout_chars):
        holdout.append(segs[order[pos]])
        used += len(segs[order[pos]]) + len(SEPARATOR)
        pos += 1
    train: list[str] = []
    size = 0
    for i in order[pos:]:
        if max_train_chars is not None and size >= max_train_chars:
            break
        train.append(segs[i])
        size += len(segs[i]) + len(SEPARATOR)
    holdout_text = SEPARATOR.join(holdout)[:HOLDOUT_MAX_CHARS]
    return Corpus(description, SEPARATOR.join(train), holdout_text, len(holdout), len(train))


def default_holdout_chars(total_chars: int, max_tokens: int) -> int:
    """About 10% of the text a build reads (at ~4 characters per token), within [500, 50000]."""
    return int(np.clip(0.1 * min(total_chars, max_tokens * 4), 500, HOLDOUT_MAX_CHARS))


def load_corpus(files: list[Path] | None, max_tokens: int, holdout_chars: int | None = None,
                seed: int = 0, train: bool = True) -> Corpus:
    """The user's files, or the default stdlib-docstring corpus when none are given.

    The holdout does not depend on `train`, so token and context sets built with the same
    corpus, --max-tokens and seed are evaluated on the same held-out text.
    """
    if files:
        docs = file_documents(files)
        description = ", ".join(Path(f).name for f in files)
    else:
        docs = stdlib_documents()
        description = default_corpus_name()
    if holdout_chars is None:
        holdout_chars = default_holdout_chars(sum(len(d.text) for d in docs), max_tokens)
    return split_corpus(docs, description, holdout_chars, max_tokens * CHARS_PER_TOKEN_BOUND if train else 0, seed)


# --- training tokens ----------------------------------------------------------------------

def tokenize(tokenizer, text: str, max_tokens: int | None = None) -> tuple[np.ndarray, str]:
    """(token ids of text without special tokens, cut at max_tokens; the text those ids cover)."""
    if max_tokens is None or not getattr(tokenizer, "is_fast", False):
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"][:max_tokens]
        covered = text if max_tokens is None or len(ids) < max_tokens else tokenizer.decode(ids)
        return np.asarray(ids, dtype=np.int64), covered
    enc = tokenizer(text, add_special_tokens=False, verbose=False, return_offsets_mapping=True)
    ids = enc["input_ids"][:max_tokens]
    end = enc["offset_mapping"][len(ids) - 1][1] if ids else 0
    return np.asarray(ids, dtype=np.int64), text[:end]


def chunk_ids(ids: np.ndarray, context_length: int) -> list[np.ndarray]:
    """Consecutive chunks of at most context_length tokens; a last chunk of 1 token is dropped."""
    if context_length < 2:
        raise UserError(f"--context-length must be at least 2, got {context_length}")
    return [c for c in windows(ids, context_length) if len(c) >= 2]
