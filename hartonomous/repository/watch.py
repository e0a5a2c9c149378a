"""`hartonomous index DIR --watch`: follow a repository and apply its saves to the set, debounced.

The watch first brings the set up to date (one `index` run), then waits for changes under the
root (`watchfiles`: inotify, or polling where there is none). Changes are grouped: a batch is
applied once the folder has been quiet for `STEP_MS` (an editor's save is several events: a
temporary file, a rename, a chmod), or after `DEBOUNCE_MS` of continuous changes. Changes that
arrive while a batch is being applied wait and form the next batch, so saves are never lost and
never applied twice at once. A batch that touches no indexable path changes nothing and runs
nothing: folders never indexed (`files.IGNORED_DIRS`: .git, caches, environments), --exclude
globs, and, in a git work tree, the paths git ignores (the database's own files when it lives in
the repository, build outputs).

Each batch is one `index` run (hartonomous.repository.index.index_repository), which re-reads the
files and applies only new, changed and removed ones in one transaction: a server reading the set
meanwhile answers from the set before the batch or after it, never from a half-applied one, and
holds no lock across a request (tests/test_repository_watch.py checks both with a server running).
A run that fails (the database away, the set busy, every file gone) is reported in one line and
the watch goes on: the next save tries again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from hartonomous.corpus.sources import excluded
from hartonomous.errors import UserError
from hartonomous.repository.files import IGNORED_DIRS, git_ignored_folders, git_listed

log = logging.getLogger("hartonomous.repository.watch")

DEBOUNCE_MS = 1600   # at most this long of continuous changes is grouped into one batch
STEP_MS = 300        # a batch is applied once no change came for this long

Batch = Iterable[tuple[Any, str]]   # watchfiles' (Change, absolute path) pairs


def indexable(relative: str, exclude: Sequence[str]) -> bool:
    """Whether a path relative to the root could be an indexed file: not inside a folder the walk never
    enters, and neither it nor a folder above it matches an --exclude glob."""
    parts = relative.split("/")
    if any(part in IGNORED_DIRS for part in parts) or not relative or relative == ".":
        return False
    return not any(excluded("/".join(parts[:i]), exclude) for i in range(1, len(parts) + 1))


class Follower:
    """Turns batches of filesystem changes into index runs: the paths that matter, one run per batch."""

    def __init__(self, root: Path, apply: Callable[[list[str]], Any], *, exclude: Sequence[str] = (),
                 say: Callable[[str], None] = print):
        self.root = Path(root).resolve()
        self.apply = apply
        self.exclude = tuple(exclude)
        self.say = say
        self.known = git_listed(self.root)   # git's listing (None outside a work tree): a removed file was in it
        self.runs = 0
        self.failures = 0

    def relevant(self, batch: Batch) -> list[str]:
        """The batch's paths, relative to the root and sorted, that an index run would read (or drop)."""
        paths = set()
        for _change, path in batch:
            try:
                relative = Path(path).resolve().relative_to(self.root).as_posix()
            except ValueError:    # outside the root (a symlink's target, the root's own rename)
                continue
            if indexable(relative, self.exclude):
                paths.add(relative)
        if paths and self.known is not None:
            listed = git_listed(self.root) or set()
            folders = {p.rsplit("/", 1)[0] for p in listed | self.known if "/" in p}
            paths = {p for p in paths if p in listed or p in self.known or p in folders}
            self.known = listed
        return sorted(paths)

    def follow(self, batch: Batch) -> bool:
        """Apply one batch: an index run when it touches an indexable path. True when a run was made."""
        paths = self.relevant(batch)
        if not paths:
            return False
        shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
        self.say(f"changed: {shown}")
        self.runs += 1
        try:
            report = self.apply(paths)
        except UserError as exc:
            self.failures += 1
            self.say(f"not applied: {exc}")
            return True
        except Exception as exc:    # the database away, a file unreadable mid-run: the next save retries
            self.failures += 1
            log.exception("an index run failed")
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.say(f"not applied ({type(exc).__name__}): {first}; the next save tries again")
            return True
        summary = getattr(report, "summary", None)
        if callable(summary):
            self.say(summary())
        if getattr(report, "drift", None):
            self.say(report.drift)
        return True


def watch_repository(root: Path, name: str | None = None, *, exclude: Sequence[str] = (),
                     index: Callable[..., Any] | None = None, say: Callable[[str], None] = print,
                     stop_event: threading.Event | None = None, debounce_ms: int = DEBOUNCE_MS,
                     step_ms: int = STEP_MS, force_polling: bool | None = None, recalibrate: bool = False,
                     **index_options: Any) -> Follower:
    """Index `root` into the set `name` now, then apply its changes as they are saved until `stop_event`
    is set (or Ctrl-C). `index` is the index function (default index_repository), called as
    index(root, name, exclude=exclude, **index_options); `recalibrate` is passed to the first run only
    (a refit, then updates with the refitted parameters). The returned Follower counts the runs."""
    import watchfiles

    if index is None:
        from hartonomous.repository.index import index_repository as index
    root = Path(root).expanduser()
    if not root.is_dir():
        raise UserError(f"'{root}' is not a directory; pass the repository's folder: hartonomous index DIR --watch")
    first = index(root, name, exclude=list(exclude), **index_options, **({"recalibrate": True} if recalibrate else {}))
    summary = getattr(first, "summary", None)
    if callable(summary):
        say(summary())
    if getattr(first, "drift", None):
        say(first.drift)
    name = name or getattr(first, "name", None)
    follower = Follower(root, lambda _paths: index(root, name, exclude=list(exclude), **index_options),
                        exclude=exclude, say=say)
    say(f"watching {follower.root} (Ctrl-C stops)")

    ignored = git_ignored_folders(follower.root)   # e.g. the database's own files inside the repository

    def quick(change, path: str) -> bool:    # watchfiles' filter: drop what can never be indexed, early
        try:
            relative = Path(path).relative_to(follower.root).as_posix()
        except ValueError:
            return False
        return indexable(relative, follower.exclude) and not (relative + "/").startswith(ignored)

    try:
        for batch in watchfiles.watch(follower.root, watch_filter=quick, debounce=debounce_ms, step=step_ms,
                                      stop_event=stop_event, force_polling=force_polling):
            follower.follow(batch)
    except KeyboardInterrupt:
        say("stopped watching")
    return follower
