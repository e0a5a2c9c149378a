"""`hartonomous index DIR`: a set that follows a repository, its first index and its updates in place.

The first run walks the directory (hartonomous/repository/files.py), keeps one file per content
(hartonomous/repository/split.py), tokenizes each file alone, and hands the files to the build
(`first_index`, projection/index.py: the measured best defaults for code or for prose, the
calibration split fitting the parameters, the gate, the file table, one transaction). Every later
run compares the walk with the set's file table by content hash and applies only the new, changed
and removed files' atoms (hartonomous/repository/update.py) in one transaction, with the set's
frozen parameters; it says when drift makes `--recalibrate` worthwhile. Two runs on one set do
not interleave: the second waits for the first (a PostgreSQL advisory lock, released if the first
process dies).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import psycopg

from hartonomous.errors import UserError
from hartonomous.repository.chunking import file_tokens
from hartonomous.repository.split import file_split, unique_contents
from hartonomous.repository.update import (Applied, FileEntry, apply_delta, delete_files, file_atom_delta,
                                           insert_files, next_file_id, read_params, record, stored_files,
                                           stored_tokens)

LOCK_CLASS = 4404           # pg_advisory_lock(LOCK_CLASS, hashtext(set name)): one index run per set at a time
# `index` suggests --recalibrate when, since the parameters were fitted, the calibration split's
# files changed by more than this share of its tokens, or the training split's by more than TRAIN_DRIFT.
CALIBRATION_DRIFT = 0.25
TRAIN_DRIFT = 0.5
# A directory is code when at least this share of its bytes is in files with these suffixes: it
# gets the measured best defaults for code (lattice keys, backoff kernel); otherwise prose's.
CODE_SHARE = 0.5
CODE_SUFFIXES = frozenset({".py", ".pyi", ".pyx", ".c", ".h", ".cc", ".cpp", ".hpp", ".rs", ".go", ".java", ".js",
                           ".ts", ".tsx", ".jsx", ".rb", ".sh", ".sql", ".kt", ".swift", ".scala", ".cs", ".php"})


@dataclass
class IndexReport:
    """What one `index` run did: files by fate, skipped files by reason, time, and a drift message."""

    name: str
    added: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    skipped: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    drift: str | None = None
    kind: str = "update"            # 'first index' | 'update' | 'recalibrated'
    atoms: int | None = None
    atoms_applied: Applied | None = None
    warnings: list[str] = field(default_factory=list)
    stage_seconds: dict[str, float] = field(default_factory=dict)   # walk, tokenizer, update (compute, apply, commit)

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items())) or "none"
        head = f"'{self.name}' ({self.kind}): {self.added} added, {self.changed} changed, {self.removed} removed, " \
               f"{self.unchanged} unchanged; skipped {skipped}; {self.seconds:.2f}s"
        return head + (f"; {self.atoms:,} atoms" if self.atoms is not None else "")


class FirstIndex(Protocol):
    """Writes a new (or, with replace, a recalibrated) indexed set in one transaction: projection/index.py."""

    def __call__(self, conn: psycopg.Connection, *, root: Path, name: str, entries: list[FileEntry],
                 texts: dict[str, str], code: bool, model: str, replace: bool, progress: bool) -> int: ...


def default_name(root: Path) -> str:
    """The directory's name as a set name: letters, digits, '.', '_' and '-', at most 63 characters."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(root).resolve().name).strip("-._")[:63]
    return name or "repository"


def is_code(files) -> bool:
    """Whether most of the files' bytes are source code (CODE_SUFFIXES)."""
    total = sum(f.size for f in files) or 1
    code = sum(f.size for f in files if Path(f.path).suffix.lower() in CODE_SUFFIXES)
    return code / total >= CODE_SHARE


def entries_for(root: Path, files, tokenizer) -> list[FileEntry]:
    """Tokenize each file alone, place it in its split and read its license."""
    from hartonomous.repository.license import detect_license

    entries = []
    for f in files:
        tokens = file_tokens(tokenizer, f.text)
        lic = detect_license(root, f.path, f.text)
        entries.append(FileEntry(f.path, f.sha256, f.size, tokens.token_ids, tokens.line_starts, file_split(f.path),
                                 lic.spdx, lic.source))
    return entries


def set_row(conn: psycopg.Connection, name: str) -> tuple[int, str | None, str | None] | None:
    """(id, root, model_key) of the set, or None."""
    return conn.execute("SELECT id, root, model_key FROM atom_sets WHERE name = %s", (name,)).fetchone()


def lock_set(url: str, name: str, say: Callable[[str], None]) -> psycopg.Connection:
    """A connection holding the set's advisory lock (waits, saying so, while another run holds it)."""
    from hartonomous.db.connection import connect

    lock = connect(url, autocommit=True)
    (got,) = lock.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (LOCK_CLASS, name)).fetchone()
    if not got:
        say(f"another `hartonomous index` is updating '{name}'; waiting for it to finish")
        lock.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (LOCK_CLASS, name))
    return lock


def drift_message(repo: dict, root: Path) -> str | None:
    """Whether the splits moved enough since the parameters were fitted to make a refit worthwhile."""
    fitted = repo.get("fitted") or {}
    cal, train = fitted.get("calibration_tokens") or 0, fitted.get("train_tokens") or 0
    cal_share = (repo.get("calibration_changed_tokens") or 0) / cal if cal else 0.0
    train_share = (repo.get("train_changed_tokens") or 0) / train if train else 0.0
    if cal_share <= CALIBRATION_DRIFT and train_share <= TRAIN_DRIFT:
        return None
    what = (f"the calibration split's files changed by {cal_share:.0%} of its tokens" if cal_share > CALIBRATION_DRIFT
            else f"the training split's files changed by {train_share:.0%} of its tokens")
    limit = CALIBRATION_DRIFT if cal_share > CALIBRATION_DRIFT else TRAIN_DRIFT
    return (f"{what} since the parameters were fitted ({fitted.get('at', 'at the first index')}; more than "
            f"{limit:.0%}): refit them with `hartonomous index {root} --recalibrate`")


def index_repository(root: Path, name: str | None = None, *, exclude: Sequence[str] = (), recalibrate: bool = False,
                     progress: bool = True, first_index: FirstIndex | None = None, model: str | None = None,
                     tokenizer=None, database_url: str | None = None, max_bytes: int | None = None,
                     say: Callable[[str], None] | None = None) -> IndexReport:
    """Index `root` into the set `name` (default: the directory's name): a first index or a
    recalibration through `first_index` (the build; the CLI passes projection/index.py's), else an
    update in place. `tokenizer` defaults to the set's model's (`model`, default HARTONOMOUS_MODEL)."""
    from hartonomous.config import get_settings
    from hartonomous.db.connection import connect, owner_url
    from hartonomous.repository.files import DEFAULT_MAX_BYTES, walk_repository

    started = time.perf_counter()
    say = say or ((lambda m: print(m)) if progress else (lambda _m: None))
    root = Path(root).expanduser()
    if not root.is_dir():
        raise UserError(f"'{root}' is not a directory; pass the repository's folder: hartonomous index DIR")
    root = root.resolve()
    name = name or default_name(root)
    walk = walk_repository(root, exclude, max_bytes or DEFAULT_MAX_BYTES)
    walked = time.perf_counter() - started
    for warning in walk.warnings:
        say(f"warning: {warning}")
    files, duplicates = unique_contents(walk.files)
    skipped = Counter(walk.skipped)
    if duplicates:
        skipped["duplicate"] += duplicates
    url = database_url or owner_url()
    lock = lock_set(url, name, say)
    try:
        with connect(url) as conn:
            row = set_row(conn, name)
            conn.rollback()
            if row is not None and row[1] is None:
                raise UserError(f"atom set '{name}' was written by `hartonomous build` and has no file table, so it "
                                f"cannot be updated; index into another name (`hartonomous index {root} --name "
                                f"NEW`) or drop it (`hartonomous atom-sets drop {name}`) and index again")
            if row is not None and Path(row[1]) != root:
                raise UserError(f"atom set '{name}' indexes {row[1]}, not {root}; pass another --name")
            if row is None or recalibrate:
                if first_index is None:
                    raise UserError(f"atom set '{name}' " + ("must be refitted" if row else "does not exist yet")
                                    + f": run `hartonomous index {root}" + (" --recalibrate" if row else "") + "`")
                model = model or (row[2] if row and row[2] else get_settings().model)
                if tokenizer is None:
                    from hartonomous.model import load_tokenizer

                    tokenizer = load_tokenizer(model)
                say(f"indexing {len(files):,} files of {root} into '{name}' ({walk.summary()})")
                entries = entries_for(root, files, tokenizer)
                atoms = first_index(conn, root=root, name=name, entries=entries, texts={f.path: f.text for f in files},
                                    code=is_code(files), model=model, replace=row is not None, progress=progress)
                return IndexReport(name, added=len(entries), skipped=skipped, atoms=atoms,
                                   kind="recalibrated" if row else "first index",
                                   seconds=time.perf_counter() - started, warnings=list(walk.warnings))
            t0 = time.perf_counter()
            report = update_set(conn, name, root, files, tokenizer, say)
            report.skipped, report.warnings = skipped, list(walk.warnings)
            report.seconds = time.perf_counter() - started
            report.stage_seconds = {"walk": round(walked, 3), **report.stage_seconds,
                                    "update": round(time.perf_counter() - t0, 3)}
            return report
    finally:
        lock.close()


def update_set(conn: psycopg.Connection, name: str, root: Path, files, tokenizer, say: Callable[[str], None],
               before_commit: Callable[[], None] | None = None) -> IndexReport:
    """Apply the walk's differences from the file table to the set, in one transaction."""
    with conn.transaction():
        params = read_params(conn, name, lock=True)
        if params.layout != "rows":
            raise UserError(f"atom set '{name}' stores its atoms as {params.layout}, which cannot be updated in "
                            f"place; rebuild it with `hartonomous index {root} --name {name} --recalibrate`")
        stored = stored_files(conn, params.set_id)
        current = {f.path: f for f in files}
        new = [f for f in files if f.path not in stored]
        changed = [f for f in files if f.path in stored and stored[f.path].sha256 != f.sha256]
        gone = [s for path, s in stored.items() if path not in current]
        report = IndexReport(name, added=len(new), changed=len(changed), removed=len(gone),
                             unchanged=len(files) - len(new) - len(changed))
        if not new and not changed and not gone:
            report.drift = drift_message(params.stats.get("repository") or {}, root)
            return report
        if tokenizer is None:
            from hartonomous.atomset import load_atom_set
            from hartonomous.atomset.catalog import tokenizer_for

            t0 = time.perf_counter()
            tokenizer = tokenizer_for(load_atom_set(conn, name))
            report.stage_seconds["tokenizer"] = round(time.perf_counter() - t0, 3)
        entries = entries_for(root, new + changed, tokenizer)
        old = [stored[f.path] for f in changed] + gone
        old_tokens = stored_tokens(conn, params.set_id, [s.file_id for s in old if s.split == "train"])
        delta = file_atom_delta(params, [e.token_ids for e in entries if e.split == "train"], list(old_tokens.values()))
        applied = apply_delta(conn, params, delta)
        delete_files(conn, params.set_id, [s.file_id for s in old])
        first_id = next_file_id(conn, params)
        insert_files(conn, params.set_id, entries, first_id)
        repo = dict(params.stats.get("repository") or {})
        moved = Counter()
        for e in entries:
            moved[e.split] += len(e.token_ids)
        for s in old:
            moved[s.split] += s.n_tokens
        section = {"next_file_id": first_id + len(entries), "updates": int(repo.get("updates") or 0) + 1,
                   "updated_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   "calibration_changed_tokens": int(repo.get("calibration_changed_tokens") or 0) + moved["calibration"],
                   "train_changed_tokens": int(repo.get("train_changed_tokens") or 0) + moved["train"]}
        record(conn, params.set_id, section, applied.inserted - applied.deleted)
        report.atoms_applied = applied
        report.drift = drift_message({**repo, **section}, root)
        if before_commit is not None:
            before_commit()
    return report
