"""The files of a repository that `hartonomous index DIR` reads: walked once, sorted by path.

A file is indexed when it is a regular file (or a symlink to one inside the root) of at most
`max_bytes` (default `DEFAULT_MAX_BYTES`, 1 MiB) whose bytes are UTF-8 text without a NUL byte
(the rule streamed corpora use, hartonomous.corpus.sources) and hold more than whitespace. Its
text keeps every line (a byte-order mark dropped, CRLF and CR made LF, nothing stripped), so that
line numbers cited from it are the file's own. Everything else is skipped and counted by reason:

    binary                     a NUL byte in it
    not UTF-8                  bytes that do not decode
    empty                      nothing but whitespace
    too large                  over max_bytes (a warning names the file and its size)
    symlink leaving the root   a link whose target lies outside the root (file or folder)
    broken symlink             a link whose target does not exist
    not a regular file         a FIFO, socket or device (never opened: reading one could block)
    vanished                   listed, then gone before it was read (a warning names it)
    unreadable                 it could not be opened (permissions; a warning says why)
    excluded                   a file matching --exclude
    excluded folder            a folder matching --exclude, not entered
    ignored by git             a file git ignores (.gitignore and the other ignore files)
    folder ignored by git      a folder git ignores, not entered

In a git work tree the files are those git lists (`git ls-files --cached --others
--exclude-standard`: tracked, or new and not ignored), so build outputs, data and environments a
repository ignores stay out without an --exclude; outside one, in a folder the enclosing
repository ignores as a whole (a package inside an ignored environment), or without git, every
file counts.

--exclude globs are matched against the path relative to the root (POSIX, `fnmatch`,
case-sensitive, `*` also matching `/`: hartonomous.corpus.sources.excluded); a folder whose
relative path matches is not entered, so `--exclude build` leaves out everything under build/.
Folders that hold no source of the repository are never entered: version control (.git, .hg,
.svn), caches and environments (`IGNORED_DIRS`, the folders watchfiles ignores by default, so
that `index --watch` and the walk agree). Symlinked folders are not followed: their files are
read under their own paths, once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hartonomous.corpus.sources import _VCS_DIRS, _decoded, excluded
from hartonomous.errors import UserError

DEFAULT_MAX_BYTES = 1 << 20   # 1 MiB: larger files are data or generated, not source to complete from
IGNORED_DIRS = frozenset(_VCS_DIRS | {"__pycache__", ".tox", ".venv", ".idea", "node_modules", ".mypy_cache",
                                      ".pytest_cache", ".hypothesis"})


@dataclass(frozen=True)
class RepoFile:
    """One indexed file: its path relative to the root (POSIX), its text, the sha256 and size of its bytes."""

    path: str
    text: str
    sha256: bytes
    size: int


@dataclass
class Walk:
    """What a walk found: the readable files sorted by path, the skipped ones counted by reason, and
    warnings to show the user (one line each)."""

    root: Path
    files: list[RepoFile] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)
    warnings: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """'120 files; skipped 3 binary, 1 too large' (or 'skipped none')."""
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items())) or "none"
        return f"{len(self.files)} file{'s' if len(self.files) != 1 else ''}; skipped {skipped}"


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n:,} bytes"


def git_listed(root: Path) -> set[str] | None:
    """The paths (relative to root) git lists as the repository's files, tracked or new and not ignored;
    None when root is not in a git work tree or git is not installed."""
    git = shutil.which("git")
    if git is None:
        return None
    try:
        done = subprocess.run([git, "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                              capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    listed = {p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p}
    if not listed:   # a folder the enclosing repository ignores (a vendored package, an environment) is its own
        ignored = subprocess.run([git, "-C", str(root), "check-ignore", "-q", "--no-index", str(root)],
                                 capture_output=True, timeout=120, check=False)
        if ignored.returncode == 0:
            return None
    return listed


def git_ignored_folders(root: Path) -> tuple[str, ...]:
    """The folders under root (relative, each ending in '/') that git ignores whole, e.g. a database
    cluster or an environment kept inside the repository; () outside a work tree or without git."""
    git = shutil.which("git")
    if git is None or git_listed(root) is None:
        return ()
    try:
        done = subprocess.run([git, "-C", str(root), "ls-files", "-z", "--others", "--ignored", "--exclude-standard",
                               "--directory"], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    paths = done.stdout.decode("utf-8", "surrogateescape").split("\0") if done.returncode == 0 else []
    return tuple(sorted(p for p in paths if p.endswith("/")))


def _folders_of(paths: set[str]) -> set[str]:
    """Every folder (relative, POSIX) that holds one of paths at some depth."""
    folders: set[str] = set()
    for path in paths:
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folders.add("/".join(parts[:i]))
    return folders


def read_repo_file(root: Path, relative: str, walk: Walk, max_bytes: int = DEFAULT_MAX_BYTES) -> RepoFile | None:
    """The file at root/relative as a RepoFile, or None with the reason counted (and warned) in `walk`.
    Used by the walk and by `index --watch` for a single changed file."""
    path = root / relative
    try:
        if path.is_symlink():
            target = path.resolve()
            if not _inside(target, root):
                walk.skipped["symlink leaving the root"] += 1
                return None
            if not target.exists():
                walk.skipped["broken symlink"] += 1
                return None
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            walk.skipped["not a regular file"] += 1
            return None
        if info.st_size > max_bytes:
            walk.skipped["too large"] += 1
            walk.warnings.append(f"{relative}: {_size(info.st_size)}, over the bound of {_size(max_bytes)}; skipped")
            return None
        with open(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except FileNotFoundError:
        walk.skipped["vanished"] += 1
        walk.warnings.append(f"{relative}: removed while being read; skipped")
        return None
    except OSError as exc:
        walk.skipped["unreadable"] += 1
        walk.warnings.append(f"{relative}: cannot be read ({exc.strerror}); skipped")
        return None
    if len(data) > max_bytes:   # grew after stat
        walk.skipped["too large"] += 1
        walk.warnings.append(f"{relative}: over the bound of {_size(max_bytes)}; skipped")
        return None
    if b"\0" in data:
        walk.skipped["binary"] += 1
        return None
    text = _decoded(data)
    if text is None:
        walk.skipped["not UTF-8"] += 1
        return None
    if not text.strip():
        walk.skipped["empty"] += 1
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return RepoFile(relative, text, hashlib.sha256(data).digest(), len(data))


def walk_repository(root: Path, exclude: Sequence[str] = (), max_bytes: int = DEFAULT_MAX_BYTES) -> Walk:
    """Every indexable file under root, sorted by relative path, with what was skipped and why (the module
    docstring). A root that is not a directory, or that holds no readable text file, is a UserError."""
    given = Path(root)
    if not given.is_dir():
        raise UserError(f"'{given}' is not a directory; pass the repository's folder")
    root = given.resolve()
    walk = Walk(root)
    listed = git_listed(root)
    listed_folders = _folders_of(listed) if listed is not None else None
    relatives: list[str] = []
    for folder, dirs, names in os.walk(root):
        base = Path(folder)
        here = base.relative_to(root).as_posix()
        prefix = "" if here == "." else here + "/"
        kept_dirs = []
        for d in sorted(dirs):
            rel = prefix + d
            if d in IGNORED_DIRS:
                continue
            if excluded(rel, exclude):
                walk.skipped["excluded folder"] += 1
            elif listed_folders is not None and rel not in listed_folders:
                walk.skipped["folder ignored by git"] += 1
            elif (base / d).is_symlink():   # os.walk does not follow it; count one that leaves the root
                if not _inside((base / d).resolve(), root):
                    walk.skipped["symlink leaving the root"] += 1
            else:
                kept_dirs.append(d)
        dirs[:] = kept_dirs
        for name in names:
            rel = prefix + name
            if excluded(rel, exclude):
                walk.skipped["excluded"] += 1
            elif listed is not None and rel not in listed:
                walk.skipped["ignored by git"] += 1
            else:
                relatives.append(rel)
    for rel in sorted(relatives):
        file = read_repo_file(root, rel, walk, max_bytes)
        if file is not None:
            walk.files.append(file)
    if not walk.files:
        raise UserError(f"'{given}' holds no readable text file ({walk.summary()}); index a folder of UTF-8 "
                        "source or prose, or exclude less")
    return walk
