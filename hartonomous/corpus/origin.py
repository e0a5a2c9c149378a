"""Where a build's training text came from: what the build records, and the text read again from it.

A build does not store its training text (at 10^7 tokens it would be tens of MB of JSON in
atom_sets.stats). It records in stats.corpus where the text came from (`origin_stats`), how it was
split (`split`: "segments" or "documents", hartonomous.corpus.sources), the sha256 of the training text
(`train_sha256`) and the settings that cut it (--max-tokens, --holdout-chars, seed):

- python-docstrings: its name (`python-stdlib-docstrings`, as the first builds recorded it) and
  version (the Python whose standard library it was read from);
- files named without a directory: every file's absolute path and sha256;
- streamed corpora (python-source, or --corpus with a directory): python-source's name, version and
  installed distributions (`distributions`, name==version), or the given paths (absolute) and the
  --include globs; the --exclude globs (`exclude`) and how many files they left out (`excluded`);
  the files listed after them (`listed_files`), and the documents the holdout and the training
  text were read from: their number (`documents`, `holdout_documents`, `train_documents`) and one
  sha256 over their sorted (key, file sha256) list (`documents_sha256`), not one entry per file;
  the files skipped among those opened, by reason (`skipped`; the last batch's read-ahead
  included, so it is not checked).

`recorded_training_text` reads the text again from that record and refuses, with the reason, when
it would not be the same text: a file gone or changed, another Python or other installed packages
(python-source), another holdout. Sets built before 2026-11-25 carry a copy of the text in
stats.corpus.text instead, which is used as it is.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from pathlib import Path

from hartonomous.corpus.sources import (BUILTIN_CORPUS, CHARS_PER_TOKEN_BOUND, PYTHON_SOURCE, SEPARATOR, Corpus, DocumentStream,
                                builtin_version, installed_distributions, load_corpus, python_source_version,
                                resolve_source)
from hartonomous.errors import UserError


class CorpusUnavailable(LookupError):
    """A set's training text cannot be recovered exactly; the message says why."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def documents_sha256(stream: DocumentStream) -> tuple[int, str]:
    """(how many, sha256 of the sorted "key<TAB>file sha256" lines) of the documents a streamed corpus's
    holdout and training text were read from."""
    rows = sorted([(d.source, d.sha256) for d in stream.holdout] + stream.taken)
    return len(rows), sha256_text("".join(f"{key}\t{sha}\n" for key, sha in rows))


def origin_stats(files: list[Path], corpus: Corpus | None) -> dict:
    """What a build records in stats.corpus so that its training text can be read again and checked
    (the module docstring lists it); for a streamed corpus, after its training tokens were taken."""
    if corpus is not None and corpus.stream is not None:
        return _streamed_origin(corpus.stream)
    source = resolve_source(files)
    if source.paths:
        origin = {"name": None, "version": None, "files": [str(Path(f).resolve()) for f in source.paths],
                  "sha256": [sha256_file(Path(f)) for f in source.paths]}
    else:
        origin = {"name": BUILTIN_CORPUS, "version": builtin_version(), "files": [], "sha256": []}
    origin["split"] = "segments"
    origin["train_sha256"] = sha256_text(corpus.train_text) if corpus is not None and corpus.train_text else None
    return origin


def _streamed_origin(stream: DocumentStream) -> dict:
    source = stream.source
    count, digest = documents_sha256(stream)
    origin = {"name": source.name, "version": None, "files": [str(p.resolve()) for p in source.paths], "sha256": [],
              "include": None if source.name else list(source.include), "exclude": list(source.exclude),
              "excluded": stream.excluded, "split": "documents",
              "listed_files": stream.listed, "documents": count, "documents_sha256": digest,
              "holdout_documents": len(stream.holdout), "train_documents": len(stream.taken),
              "skipped": dict(sorted(stream.skipped.items())), "train_sha256": stream.train_sha256}
    if source.name == PYTHON_SOURCE:
        distributions = installed_distributions()
        origin.update(version=python_source_version(distributions), distributions=distributions)
    return origin


@dataclass(frozen=True)
class TrainingText:
    """A set's training text and where it came from (what a report says about it)."""

    source: str
    text: str
    origin: dict     # kind ('builtin' | 'files' | 'paths' | 'text copy'), name, version, files [{path, sha256}]


def recorded_training_text(entry, holdout_text: str | None) -> TrainingText:
    """The training text of the build that wrote `entry` (stats.corpus, a CorpusStats), read again
    from its recorded origin and settings; a text copy in `entry.text` (sets built before
    2026-11-25) is used as it is. A streamed corpus's text is its training documents joined by blank
    lines (the build's tokens are its first train_tokens tokens). Raises CorpusUnavailable with the
    reason when a file is gone or changed (sha256), the corpus was read by another Python (or, for
    python-source, with other packages installed) and no sha256 can confirm it, or the rebuilt text
    or holdout differ from the recorded ones."""
    if entry is None or (not entry.text and entry.max_tokens is None):
        raise CorpusUnavailable("the atom set records no build corpus (stats.corpus)")
    files = [Path(f) for f in entry.files]
    recorded = list(entry.sha256) + [None] * (len(files) - len(entry.sha256))
    listed = [{"path": str(f), "sha256": h} for f, h in zip(files, recorded)]
    if entry.text:
        return TrainingText(f"{entry.source or 'the build corpus'} (the text copy in stats.corpus.text)",
                            str(entry.text), {"kind": "text copy", "name": None, "version": None, "files": listed})
    if entry.split == "documents":
        return _streamed_training_text(entry, holdout_text)
    _check_files(files, recorded)
    version = entry.version or (f"Python {entry.python}" if entry.python else None)
    other_python = not files and version not in (None, builtin_version())
    if other_python and not entry.train_sha256:
        raise CorpusUnavailable(f"the set was built from {version}'s stdlib docstrings, this is "
                                f"{builtin_version()}: the corpus cannot be rebuilt exactly")
    try:
        corpus = load_corpus(files or None, int(entry.max_tokens), entry.holdout_chars, int(entry.seed or 0),
                             train=True)
    except UserError as exc:
        raise CorpusUnavailable(f"cannot rebuild the build corpus ({exc})") from None
    if entry.train_sha256 and sha256_text(corpus.train_text) != entry.train_sha256:
        why = f"the set was built with {version}, this is {builtin_version()}" if other_python else \
            "the corpus reads differently now"
        raise CorpusUnavailable(f"the rebuilt training text differs from the build's (sha256); {why}")
    _check_holdout(corpus, holdout_text)
    origin = ({"kind": "files", "name": None, "version": None, "files": listed} if files else
              {"kind": "builtin", "name": entry.name or BUILTIN_CORPUS, "version": version, "files": []})
    return TrainingText(f"{entry.source or corpus.description}, training split", corpus.train_text, origin)


def _streamed_training_text(entry, holdout_text: str | None) -> TrainingText:
    """A streamed corpus's training text: the corpus listed (with the recorded --include and --exclude
    globs) and split again with the recorded seed and --holdout-chars, and its first train_documents
    training documents, checked against the recorded documents' sha256, holdout and training text sha256."""
    if entry.name == PYTHON_SOURCE:
        _check_python_source(entry)
        paths = [Path(PYTHON_SOURCE)]
    else:
        paths = [Path(f) for f in entry.files]
        for path in paths:
            if not path.exists():
                raise CorpusUnavailable(f"the build corpus path {path} is not there any more")
    try:
        corpus = load_corpus(paths, int(entry.max_tokens), entry.holdout_chars, int(entry.seed or 0),
                             include=entry.include or (), exclude=entry.exclude or ())
    except UserError as exc:
        raise CorpusUnavailable(f"cannot rebuild the build corpus ({exc})") from None
    stream = corpus.stream
    texts = _take(stream, int(entry.train_documents or 0))
    count, digest = documents_sha256(stream)
    if (count, digest) != (entry.documents, entry.documents_sha256):
        raise CorpusUnavailable(f"the files the build read changed since the build: {entry.documents} documents "
                                f"with sha256 {str(entry.documents_sha256)[:12]}… recorded, {count} with "
                                f"{digest[:12]}… read now; the baselines would not learn from the set's own text")
    _check_holdout(corpus, holdout_text)
    if entry.train_sha256 and stream.train_sha256 != entry.train_sha256:
        raise CorpusUnavailable("the rebuilt training text differs from the build's (sha256)")
    if not texts:   # a token set reads no training text: the one a context set would read (as segmented corpora)
        texts = _take(stream, None, int(entry.max_tokens) * CHARS_PER_TOKEN_BOUND)
    if entry.name == PYTHON_SOURCE:
        origin = {"kind": "builtin", "name": PYTHON_SOURCE, "version": entry.version, "files": [],
                  "exclude": list(entry.exclude or [])}
    else:
        origin = {"kind": "paths", "name": None, "version": None,
                  "files": [{"path": str(p), "sha256": None} for p in paths], "include": list(entry.include or []),
                  "exclude": list(entry.exclude or []), "documents": count, "documents_sha256": digest}
    return TrainingText(f"{entry.source or corpus.description}, training split", SEPARATOR.join(texts), origin)


def _take(stream: DocumentStream, documents: int | None, chars: int = 0) -> list[str]:
    """The texts of the stream's next documents, each taken: `documents` of them, or (None) as many as it
    takes to hold `chars` characters."""
    texts: list[str] = []
    size = 0
    for doc in itertools.islice(stream, documents):
        if documents is None and size >= chars:
            break
        stream.take(doc)
        texts.append(doc.text)
        size += len(doc.text) + len(SEPARATOR)
    return texts


def _check_python_source(entry) -> None:
    """python-source is read by this Python with these distributions installed, as the build was."""
    now = installed_distributions()
    version = python_source_version(now)
    if entry.version == version:
        return
    recorded = set(entry.distributions or [])
    gone, added = sorted(recorded - set(now)), sorted(set(now) - recorded)
    changes = "; ".join(f"{what}: {', '.join(names[:5])}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                        for what, names in (("not installed now", gone), ("installed since", added)) if names)
    raise CorpusUnavailable(f"the set was built from python-source of {entry.version}, this is {version}"
                            + (f" ({changes})" if changes else "") + ": the corpus cannot be rebuilt exactly")


def _check_holdout(corpus: Corpus, holdout_text: str | None) -> None:
    if holdout_text and corpus.holdout_text != holdout_text:
        raise CorpusUnavailable("the rebuilt corpus's holdout differs from the recorded one (was --holdout-chars "
                                "given to the build?); cannot recover the training split")


def _check_files(files: list[Path], recorded: list[str | None]) -> None:
    """Every corpus file is still there and, where its sha256 was recorded, unchanged."""
    for path, expected in zip(files, recorded):
        if not path.is_file():
            raise CorpusUnavailable(f"the build corpus file {path} is not there any more")
        now = sha256_file(path) if expected else None
        if expected and now != expected:
            raise CorpusUnavailable(f"the build corpus file {path} changed since the build (sha256 "
                                    f"{expected[:12]}… recorded, {now[:12]}… now); the baselines would not learn "
                                    "from the set's own text")
