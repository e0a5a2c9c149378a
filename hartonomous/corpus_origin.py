"""Where a build's training text came from: what the build records, and the text read again from it.

A build does not store its training text (at 10^7 tokens it would be tens of MB of JSON in
atom_sets.stats). It records in stats.corpus where the text came from (`origin_stats`): the
built-in corpus's name and version (the Python whose standard library it was read from), or every
corpus file's absolute path and sha256; the sha256 of the training text; and the settings that cut
it (--max-tokens, --holdout-chars, seed). `recorded_training_text` reads the text again from that
record and refuses, with the reason, when it would not be the same text. Sets built before
2026-11-25 carry a copy of the text in stats.corpus.text instead, which is used as it is.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from hartonomous.corpus import BUILTIN_CORPUS, Corpus, builtin_version, load_corpus
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


def origin_stats(files: list[Path], corpus: Corpus | None) -> dict:
    """What a build records in stats.corpus so that its training text can be read again and checked:
    the built-in corpus's name and version, or every file's absolute path and sha256; and the
    sha256 of the training text (before the --max-tokens cut) when the build read one."""
    if files:
        origin = {"name": None, "version": None, "files": [str(Path(f).resolve()) for f in files],
                  "sha256": [sha256_file(Path(f)) for f in files]}
    else:
        origin = {"name": BUILTIN_CORPUS, "version": builtin_version(), "files": [], "sha256": []}
    origin["train_sha256"] = sha256_text(corpus.train_text) if corpus is not None and corpus.train_text else None
    return origin


@dataclass(frozen=True)
class TrainingText:
    """A set's training text and where it came from (what a report says about it)."""

    source: str
    text: str
    origin: dict     # kind ('builtin' | 'files' | 'text copy'), name, version, files [{path, sha256}]


def recorded_training_text(entry, holdout_text: str | None) -> TrainingText:
    """The training text of the build that wrote `entry` (stats.corpus, a CorpusStats), read again
    from its recorded origin and settings; a text copy in `entry.text` (sets built before
    2026-11-25) is used as it is. Raises CorpusUnavailable with the reason when a file is gone or
    changed (sha256), the built-in corpus was read by another Python and no text sha256 can confirm
    it, or the rebuilt text or holdout differ from the recorded ones."""
    if entry is None or (not entry.text and entry.max_tokens is None):
        raise CorpusUnavailable("the atom set records no build corpus (stats.corpus)")
    files = [Path(f) for f in entry.files]
    recorded = list(entry.sha256) + [None] * (len(files) - len(entry.sha256))
    listed = [{"path": str(f), "sha256": h} for f, h in zip(files, recorded)]
    if entry.text:
        return TrainingText(f"{entry.source or 'the build corpus'} (the text copy in stats.corpus.text)",
                            str(entry.text), {"kind": "text copy", "name": None, "version": None, "files": listed})
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
    if holdout_text and corpus.holdout_text != holdout_text:
        raise CorpusUnavailable("the rebuilt corpus's holdout differs from the recorded one (was --holdout-chars "
                                "given to the build?); cannot recover the training split")
    origin = ({"kind": "files", "name": None, "version": None, "files": listed} if files else
              {"kind": "builtin", "name": entry.name or BUILTIN_CORPUS, "version": version, "files": []})
    return TrainingText(f"{entry.source or corpus.description}, training split", corpus.train_text, origin)


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
