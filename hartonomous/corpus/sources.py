"""The distillation corpus: what `--corpus` names, its seeded holdout, and its training tokens.

`--corpus` (repeatable) takes UTF-8 files, directories (walked recursively, sorted; `--include
GLOB` keeps the files whose name matches one of the globs; .git, .hg and .svn are not entered), or
one of the built-in corpora, whose names are reserved (a file of that name is `./NAME`).
`--exclude GLOB` (repeatable; directories and python-source) leaves out every file whose path
relative to its root (posix, e.g. `sqlalchemy/orm/query.py`) matches one of the globs (`fnmatch`,
case-sensitive, `*` also matching `/`): it is neither training text nor holdout, as if it were not
there. Files named on the command line are never excluded.

python-docstrings  the default, also with no --corpus: every module, class and function docstring
                   of at least 40 characters of the running interpreter's standard library (`ast`,
                   sorted files, exact duplicates dropped). Deterministic for a Python version;
                   recorded under its first name, python-stdlib-docstrings.
python-source      the `*.py` source of the standard library and of the packages installed beside
                   the project (the interpreter's site-packages), without tests. Its version is the
                   Python version and the sha256 of the installed distributions' name==version list.
                   Its roots are the stdlib and each site-packages directory (--exclude paths are
                   relative to them: `json/decoder.py`, `numpy/*`).

Segmented corpora (python-docstrings, and files named without a directory) are read whole and cut
into segments (paragraph groups of at most `SEGMENT_CHARS`), shuffled with the seed; the first
segments form the holdout (halved by hartonomous.splits), the rest are joined into the training
text, which is tokenized in one piece. This is the first builds' split, kept byte for byte so that
their results stay comparable.

Streamed corpora (python-source, and any --corpus with a directory) are never read whole. Their
files are listed and ordered by sha256(seed, key), the key being the root's index and the path
relative to it, then read one at a time in that order; files that cannot be read, are not UTF-8
text (or hold NUL bytes), are empty, or repeat an earlier file's bytes are skipped and counted (a
file named on the command line must be UTF-8 text). The holdout is cut by document and does not
depend on --max-tokens: documents join it while it fits in holdout_chars (default
`HOLDOUT_MAX_CHARS`), alternately to the calibration and the test half; a document over
`HOLDOUT_DOC_MAX_CHARS`, or one that would overflow it, is passed over and left to training; the
holdout closes when it is full, holds a tenth of the files listed, or has passed over
`HOLDOUT_PASSES` documents. Every other document, in order, is a training document:
`training_tokens` reads them only as it needs them, tokenizes them in batches and joins them with
the tokens a blank line becomes between two documents, cut at exactly --max-tokens. For a
byte-level BPE tokenizer (SmolLM2's) that stream is the tokenization of the documents joined by a
blank line: the text hartonomous.corpus.origin reads again for `compare`.

The training tokens are cut into chunks of `--context-length` (`chunk_ids`), each one context. A
build records where its text came from, not the text (hartonomous.corpus.origin).
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import importlib.metadata
import itertools
import os
import platform
import site
import sysconfig
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hartonomous.errors import UserError
from hartonomous.splits import split_holdout
from hartonomous.corpus.teacher import windows

SEGMENT_CHARS = 2000
MIN_DOCSTRING_CHARS = 40
HOLDOUT_MAX_CHARS = 50_000
HOLDOUT_DOC_MAX_CHARS = 20_000  # a streamed document longer than this never goes to the holdout
HOLDOUT_PASSES = 16             # the streamed holdout closes after passing over this many documents
CHARS_PER_TOKEN_BOUND = 8  # read at most this many characters per wanted training token
BATCH_DOCUMENTS = 64            # documents tokenized in one call
BATCH_CHARS_PER_TOKEN = 4       # a batch stops at this many characters per training token still wanted
BATCH_MAX_CHARS = 1 << 21       # ... or at this many characters
SEPARATOR = "\n\n"
_SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__", "lib2to3",
              "turtledemo", "ensurepip", "venv"}
_SOURCE_SKIP_DIRS = _SKIP_DIRS | {"testing"}
_SOURCE_SKIP_FILES = ("test_*.py", "*_test.py", "conftest.py")
_VCS_DIRS = {".git", ".hg", ".svn"}   # never walked in a --corpus directory

BUILTIN_CORPUS = "python-stdlib-docstrings"   # the name python-docstrings builds record (as they always did)
PYTHON_DOCSTRINGS = "python-docstrings"
PYTHON_SOURCE = "python-source"
RESERVED = (PYTHON_DOCSTRINGS, PYTHON_SOURCE)


@dataclass(frozen=True)
class Document:
    """One document: where it came from (a docstring's qualified name, a file's path, or a streamed
    file's key: root index / path relative to the root) and its text; `sha256` of a streamed file's bytes."""

    source: str
    text: str
    sha256: str = ""


@dataclass
class Corpus:
    """The holdout (whole and in its calibration and test halves) and the training text: all of it
    for segmented corpora, a stream of documents read as they are taken for streamed ones."""

    description: str
    holdout_text: str
    calibration_text: str
    test_text: str
    holdout_segments: int                # segments, or documents for a streamed corpus, held out
    train_text: str | None = None        # segmented: the training text, before the --max-tokens cut
    train_count: int = 0                 # segmented: its segments
    stream: DocumentStream | None = None  # streamed: the training documents

    @property
    def train_segments(self) -> int:
        """Training segments, or for a streamed corpus the training documents taken so far."""
        return len(self.stream.taken) if self.stream is not None else self.train_count


# --- what --corpus names -------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """What --corpus names: a built-in corpus (`name`), or the user's files and directories with the
    --include globs (`name` None); the --exclude globs (directories and python-source)."""

    name: str | None
    paths: tuple[Path, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    @property
    def streamed(self) -> bool:
        """python-source and corpora with a directory are streamed; python-docstrings and files are segmented."""
        return self.name == PYTHON_SOURCE or any(p.is_dir() for p in self.paths)


@dataclass(frozen=True)
class CorpusFile:
    """A file of a streamed corpus: its key (root index / path relative to the root) and path; `named`
    when it was given on the command line (then it must be UTF-8 text)."""

    key: str
    path: Path
    named: bool = False


def resolve_source(paths: Sequence[Path] | None, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Source:
    """The corpus that --corpus PATH..., --include GLOB... and --exclude GLOB... name; a UserError says what
    is wrong."""
    paths = [Path(p) for p in paths or []]
    reserved = [p for p in paths if str(p) in RESERVED]
    if reserved and len(paths) > 1:
        raise UserError(f"--corpus {reserved[0]} is a built-in corpus; it cannot be combined with other --corpus "
                        "names or paths")
    if reserved and include:
        raise UserError(f"--include picks files in --corpus directories; the built-in corpus {reserved[0]} has "
                        "its own files")
    if reserved and exclude and str(reserved[0]) != PYTHON_SOURCE:
        raise UserError(f"--exclude leaves out files of --corpus directories or of python-source; the built-in "
                        f"corpus {reserved[0]} is read from docstrings: pass --corpus python-source or a directory")
    if reserved:
        return Source(str(reserved[0]), exclude=tuple(exclude))
    for path in paths:
        if path.exists():
            continue
        if os.sep in str(path):
            raise UserError(f"corpus file '{path}' does not exist")
        raise UserError(f"corpus file '{path}' does not exist, and '{path}' is not a built-in corpus (reserved "
                        f"names: {', '.join(RESERVED)})")
    if include and not any(p.is_dir() for p in paths):
        raise UserError("--include picks files in --corpus directories, and no --corpus is a directory")
    if exclude and not any(p.is_dir() for p in paths):
        raise UserError("--exclude leaves out files of --corpus directories or of python-source, and no --corpus "
                        "is one (a file named on the command line is read whole): pass a directory or python-source")
    return Source(None, tuple(paths), tuple(include), tuple(exclude)) if paths else Source(PYTHON_DOCSTRINGS)


def describe(source: Source) -> str:
    """A short name of the corpus for messages and stats: the built-in name and version, or the paths."""
    if source.name == PYTHON_DOCSTRINGS:
        return default_corpus_name()
    excluding = f" (excluding {', '.join(source.exclude)})" if source.exclude else ""
    if source.name == PYTHON_SOURCE:
        return f"{PYTHON_SOURCE} ({python_source_version()})" + excluding
    names = ", ".join((p.name or str(p)) + ("/" if p.is_dir() else "") for p in source.paths)
    return names + (f" ({', '.join(source.include)})" if source.include else "") + excluding


# --- python-docstrings ---------------------------------------------------------------------

def builtin_version() -> str:
    """The version of the built-in corpus: the interpreter whose standard library it is read from."""
    return f"Python {platform.python_version()}"


def default_corpus_name() -> str:
    return f"{BUILTIN_CORPUS} ({builtin_version()})"


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list[Path]:
    root = _stdlib_root()
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
    root = _stdlib_root()
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


# --- python-source -------------------------------------------------------------------------

def installed_distributions() -> list[str]:
    """name==version of every distribution the running interpreter has installed, sorted, once each."""
    return sorted({f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions()
                   if d.metadata["Name"]})


def python_source_version(distributions: list[str] | None = None) -> str:
    """python-source's version: the Python version, and the count and sha256 of the distributions."""
    dists = installed_distributions() if distributions is None else distributions
    digest = hashlib.sha256("\n".join(dists).encode("utf-8")).hexdigest()
    return f"{builtin_version()}; {len(dists)} distributions, sha256 {digest[:16]}"


def site_package_dirs() -> list[Path]:
    """The running interpreter's site-packages directories (site and sysconfig purelib/platlib), once each."""
    paths = sysconfig.get_paths()
    found = {Path(p).resolve() for p in [*site.getsitepackages(), paths["purelib"], paths["platlib"]]}
    return sorted(p for p in found if p.is_dir())


def _walk(root: Path, skip_dirs: set[str], keep: Callable[[str], bool]) -> list[tuple[str, Path]]:
    """(relative posix path, path) of the files under root that `keep` accepts by name, sorted; folders
    named in skip_dirs are not entered."""
    found: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in skip_dirs)
        found += [(Path(folder, n).relative_to(root).as_posix(), Path(folder, n)) for n in names if keep(n)]
    return sorted(found)


def _python_source_file(name: str) -> bool:
    return name.endswith(".py") and not any(fnmatch.fnmatchcase(name, p) for p in _SOURCE_SKIP_FILES)


def python_source_files() -> list[CorpusFile]:
    """The `*.py` files of the standard library (root 0) and of every site-packages directory (roots
    1, 2, ...), without tests: no folder named test, tests, testing, __pycache__, idlelib, lib2to3,
    turtledemo, ensurepip, venv (nor config-*, site-packages, dist-packages inside the stdlib), and no
    test_*.py, *_test.py or conftest.py."""
    stdlib_skip = _SOURCE_SKIP_DIRS | {d for d in os.listdir(_stdlib_root()) if d.startswith("config-")}
    roots = [(_stdlib_root(), stdlib_skip)] + [(d, _SOURCE_SKIP_DIRS) for d in site_package_dirs()]
    return [CorpusFile(f"{i}/{rel}", path) for i, (root, skip) in enumerate(roots)
            for rel, path in _walk(root, skip, _python_source_file)]


# --- listing and reading streamed corpora --------------------------------------------------

def excluded(relative: str, globs: Sequence[str]) -> bool:
    """Whether a file's posix path relative to its root matches one of the --exclude globs (fnmatch,
    case-sensitive; `*` also matches `/`, so `pkg/*` is everything under pkg)."""
    return any(fnmatch.fnmatchcase(relative, glob) for glob in globs)


@dataclass(frozen=True)
class Listing:
    """The files of a streamed corpus, sorted by key, and how many --exclude left out."""

    files: list[CorpusFile]
    excluded: int = 0


def corpus_listing(source: Source) -> Listing:
    """Every file of a streamed corpus that --exclude does not name, sorted by key; reads no file except
    the named ones (checked to be UTF-8 text, never excluded). A directory without a matching file, or
    whose every file is excluded, is a UserError."""
    from hartonomous.textfiles import read_user_text

    if source.name == PYTHON_SOURCE:
        every = python_source_files()
        kept = [f for f in every if not excluded(f.key.split("/", 1)[1], source.exclude)]
        return Listing(kept, len(every) - len(kept))
    files: list[CorpusFile] = []
    dropped = 0
    for i, path in enumerate(source.paths):
        if not path.is_dir():
            read_user_text(path, f"corpus file '{path}'")
            files.append(CorpusFile(f"{i}/{path.name}", path, named=True))
            continue
        found = _walk(path, _VCS_DIRS, lambda n: not source.include or
                      any(fnmatch.fnmatch(n, glob) for glob in source.include))
        if not found:
            raise UserError(f"corpus directory '{path}' has no files"
                            + (f" matching --include {' '.join(source.include)}" if source.include else ""))
        kept = [(rel, file) for rel, file in found if not excluded(rel, source.exclude)]
        if not kept:
            raise UserError(f"every file of corpus directory '{path}' matches --exclude "
                            f"{' '.join(source.exclude)}; exclude fewer files or leave the directory out")
        dropped += len(found) - len(kept)
        files += [CorpusFile(f"{i}/{rel}", file) for rel, file in kept]
    return Listing(files, dropped)


def list_files(source: Source) -> list[CorpusFile]:
    """The files of a streamed corpus (`corpus_listing`), without the count of those excluded."""
    return corpus_listing(source).files


def seeded_order(files: list[CorpusFile], seed: int) -> list[CorpusFile]:
    """The files ordered by sha256(seed, key): a seeded shuffle that needs no contents and puts a file at
    the same place whatever other files the corpus holds."""
    return sorted(files, key=lambda f: (hashlib.sha256(f"{seed}\0{f.key}".encode("utf-8")).digest(), f.key))


def _decoded(data: bytes) -> str | None:
    """The UTF-8 text of a file's bytes (a byte-order mark dropped); None when they are not UTF-8 or hold a
    NUL byte (a binary file)."""
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def read_documents(files: Iterable[CorpusFile], skipped: Counter) -> Iterator[Document]:
    """The files' texts one at a time, in order (newlines normalised, stripped); files that cannot be read,
    are not UTF-8 text or hold NUL bytes, are empty, or repeat an earlier file's bytes are counted in
    `skipped` and left out, except a named file, whose problem is a UserError."""
    seen: set[str] = set()
    for file in files:
        label = f"corpus file '{file.path}'"
        try:
            data = file.path.read_bytes()
        except OSError as exc:
            if file.named:
                raise UserError(f"{label} cannot be read ({exc.strerror})") from None
            skipped["unreadable"] += 1
            continue
        digest = hashlib.sha256(data).hexdigest()
        text = _decoded(data)
        if text is None:
            if file.named:
                raise UserError(f"{label} is not UTF-8 text (or holds NUL bytes)")
            skipped["not UTF-8 text"] += 1
            continue
        text = text.replace("\r\n", "\n").replace("\r", "\n").strip()
        if not text:
            skipped["empty"] += 1
            continue
        if digest in seen:
            skipped["duplicate"] += 1
            continue
        seen.add(digest)
        yield Document(file.key, text, digest)


def take_holdout(docs: Iterator[Document], holdout_chars: int,
                 max_documents: int) -> tuple[list[Document], list[Document]]:
    """(the holdout's documents, the documents passed over for it), taken from the front of docs: a
    document joins while the holdout, joined by blank lines, stays within holdout_chars; one over
    HOLDOUT_DOC_MAX_CHARS or one that would overflow it is passed over; the holdout closes when it is
    full, holds max_documents, or at the HOLDOUT_PASSES-th document passed over."""
    holdout: list[Document] = []
    passed: list[Document] = []
    used = 0
    for doc in docs:
        size = len(doc.text) + (len(SEPARATOR) if holdout else 0)
        if len(doc.text) <= HOLDOUT_DOC_MAX_CHARS and used + size <= holdout_chars:
            holdout.append(doc)
            used += size
        else:
            passed.append(doc)
        if len(passed) >= HOLDOUT_PASSES or len(holdout) >= max_documents or used + len(SEPARATOR) >= holdout_chars:
            break
    return holdout, passed


def holdout_documents_limit(listed: int) -> int:
    """At most a tenth of the files listed (at least 2) are held out, so that a small corpus keeps
    most of its documents for training; it depends on the listing alone, not on --max-tokens."""
    return max(2, -(-listed // 10))


class DocumentStream:
    """A streamed corpus's training documents in the seeded order, read only as they are handed out;
    records what the corpus read: the holdout's documents, the training documents taken (`take`) and the
    sha256 of their text joined by blank lines, the files listed (after --exclude) and excluded, and the
    files skipped among those read (the last batch's read-ahead included)."""

    def __init__(self, source: Source, listed: int, holdout: list[Document], passed: list[Document],
                 rest: Iterator[Document], skipped: Counter, excluded: int = 0) -> None:
        self.source = source
        self.listed = listed
        self.excluded = excluded
        self.holdout = holdout
        self.skipped = skipped
        self.taken: list[tuple[str, str]] = []   # (key, sha256) of the training documents taken
        self._documents = itertools.chain(passed, rest)
        self._digest = hashlib.sha256()

    def __iter__(self) -> Iterator[Document]:
        """The training documents not yet handed out (one pass)."""
        return self._documents

    def take(self, doc: Document) -> None:
        """Count doc as training text (the documents taken are the training text, joined by blank lines)."""
        self._digest.update(((SEPARATOR if self.taken else "") + doc.text).encode("utf-8"))
        self.taken.append((doc.source, doc.sha256))

    @property
    def train_sha256(self) -> str | None:
        """sha256 of the training text (the documents taken joined by blank lines); None before any."""
        return self._digest.hexdigest() if self.taken else None


def stream_corpus(source: Source, holdout_chars: int | None, seed: int) -> Corpus:
    """A streamed corpus: the files in the seeded order, the holdout cut by document (first document to
    the calibration half, then alternately), the rest left to the training stream."""
    listing = corpus_listing(source)
    files = seeded_order(listing.files, seed)
    skipped: Counter = Counter()
    docs = read_documents(files, skipped)
    limit = HOLDOUT_MAX_CHARS if holdout_chars is None else holdout_chars
    holdout, passed = take_holdout(docs, limit, holdout_documents_limit(len(files)))
    if len(holdout) < 2:
        raise UserError(f"the holdout needs two documents of at most {HOLDOUT_DOC_MAX_CHARS:,} characters that "
                        f"fit in {limit:,} characters (--holdout-chars); the corpus gave {len(holdout)}")
    calibration = SEPARATOR.join(d.text for d in holdout[0::2])
    test = SEPARATOR.join(d.text for d in holdout[1::2])
    return Corpus(describe(source), calibration + SEPARATOR + test, calibration, test, len(holdout),
                  stream=DocumentStream(source, len(files), holdout, passed, docs, skipped, listing.excluded))


# --- segmented corpora ---------------------------------------------------------------------

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
    """Seeded shuffle of the segments; the first ~holdout_chars are held out (split in halves by
    hartonomous.splits), the rest train."""
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
    halves = split_holdout(holdout_text)
    return Corpus(description, holdout_text, halves.calibration, halves.test, len(holdout),
                  train_text=SEPARATOR.join(train), train_count=len(train))


def default_holdout_chars(total_chars: int, max_tokens: int) -> int:
    """About 10% of the text a build reads (at ~4 characters per token), within [500, 50000]."""
    return int(np.clip(0.1 * min(total_chars, max_tokens * 4), 500, HOLDOUT_MAX_CHARS))


def load_corpus(files: list[Path] | None, max_tokens: int, holdout_chars: int | None = None,
                seed: int = 0, train: bool = True, include: Sequence[str] = (), exclude: Sequence[str] = ()) -> Corpus:
    """The corpus --corpus, --include and --exclude name (no --corpus: python-docstrings), with its holdout.

    A segmented corpus reads its training text now (about max_tokens' worth; none without `train`), a
    streamed one only as `training_tokens` takes it. Neither holdout depends on `train`, so token and
    context sets built from one corpus are evaluated on the same held-out text; a streamed holdout does
    not depend on max_tokens either.
    """
    source = resolve_source(files, include, exclude)
    if source.streamed:
        return stream_corpus(source, holdout_chars, seed)
    docs = file_documents(list(source.paths)) if source.paths else stdlib_documents()
    if holdout_chars is None:
        holdout_chars = default_holdout_chars(sum(len(d.text) for d in docs), max_tokens)
    return split_corpus(docs, describe(source), holdout_chars, max_tokens * CHARS_PER_TOKEN_BOUND if train else 0,
                        seed)


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


@dataclass(frozen=True)
class TrainingTokens:
    """A build's training token ids (int64, at most --max-tokens) and, for a segmented corpus, the text
    they cover (a streamed corpus keeps no text: its stream records the documents)."""

    ids: np.ndarray
    text: str | None = None


def separator_ids(tokenizer) -> list[int]:
    """The tokens of a blank line between two documents inside one text (for byte-level BPE two newline
    tokens, not the one token of "\\n\\n" alone): what joins the documents' own tokens in the stream."""
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]

    left, right, joined = ids("a"), ids("b"), ids("a" + SEPARATOR + "b")
    return joined[len(left):len(joined) - len(right)]


def _batch(docs: Iterator[Document], wanted: int) -> list[Document]:
    """The next documents to tokenize together: at most BATCH_DOCUMENTS, and no more once they hold
    BATCH_CHARS_PER_TOKEN characters per wanted token (or BATCH_MAX_CHARS), so that reading stops
    soon after the stream has its tokens."""
    batch: list[Document] = []
    chars = 0
    limit = min(BATCH_CHARS_PER_TOKEN * wanted, BATCH_MAX_CHARS)
    for doc in docs:
        batch.append(doc)
        chars += len(doc.text)
        if len(batch) >= BATCH_DOCUMENTS or chars >= limit:
            break
    return batch


def stream_tokens(stream: DocumentStream, tokenizer, max_tokens: int,
                  advance: Callable[[int], None] = lambda n: None) -> np.ndarray:
    """The training token stream of a streamed corpus, exactly max_tokens long unless the corpus ends
    first: the documents' tokens joined by `separator_ids`, tokenized a batch at a time; each document
    that contributes is taken (`DocumentStream.take`); advance(n) reports the tokens added."""
    separator = np.asarray(separator_ids(tokenizer), dtype=np.int32)
    parts: list[np.ndarray] = []
    total = 0
    documents = iter(stream)
    while total < max_tokens:
        batch = _batch(documents, max_tokens - total)
        if not batch:
            break
        encoded = tokenizer([d.text for d in batch], add_special_tokens=False, verbose=False,
                            return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        for doc, ids in zip(batch, encoded):
            if total >= max_tokens:
                break
            piece = np.asarray(ids, dtype=np.int32)
            if stream.taken:
                piece = np.concatenate([separator, piece])
            piece = piece[:max_tokens - total]
            stream.take(doc)
            parts.append(piece)
            total += len(piece)
            advance(len(piece))
    return np.concatenate(parts, dtype=np.int64) if parts else np.zeros(0, dtype=np.int64)


def training_tokens(corpus: Corpus, tokenizer, max_tokens: int,
                    advance: Callable[[int], None] = lambda n: None) -> TrainingTokens:
    """The build's training tokens, cut at max_tokens: a segmented corpus's text tokenized in one piece
    (as the first builds did), a streamed corpus's documents tokenized as they are read."""
    if corpus.stream is not None:
        return TrainingTokens(stream_tokens(corpus.stream, tokenizer, max_tokens, advance))
    ids, covered = tokenize(tokenizer, corpus.train_text or "", max_tokens)
    advance(len(ids))
    return TrainingTokens(ids, covered)


def chunk_ids(ids: np.ndarray, context_length: int) -> list[np.ndarray]:
    """Consecutive chunks of at most context_length tokens; a last chunk of 1 token is dropped."""
    if context_length < 2:
        raise UserError(f"--context-length must be at least 2, got {context_length}")
    return [c for c in windows(ids, context_length) if len(c) >= 2]
