"""The files `hartonomous index DIR` reads (hartonomous.repository.files.walk_repository).

Readable UTF-8 text files come back sorted by their POSIX path relative to the root, with their
text line for line as written (CRLF made LF, nothing stripped) and the sha256 and size of their
bytes. Binary, non-UTF-8, empty and oversized files, symlinks leaving the root, special files and
files that vanish are skipped and counted by reason; --exclude globs hold files and folders out; a
folder with nothing readable is one UserError line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from hartonomous.errors import UserError
from hartonomous.repository import files as repo_files
from hartonomous.repository.files import DEFAULT_MAX_BYTES, Walk, read_repo_file, walk_repository


def write(root: Path, rel: str, data: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data, encoding="utf-8", newline="")
    else:
        path.write_bytes(data)
    return path


def test_text_files_come_back_sorted_by_relative_path_with_their_hash_and_size(tmp_path: Path) -> None:
    write(tmp_path, "b.py", "print('b')\n")
    write(tmp_path, "a/z.py", "x = 1\n")
    write(tmp_path, "a/b/c.md", "# Title\n\ntext\n")
    write(tmp_path, "a.txt", "plain\n")
    walk = walk_repository(tmp_path)
    assert [f.path for f in walk.files] == sorted(["b.py", "a/z.py", "a/b/c.md", "a.txt"])
    by_path = {f.path: f for f in walk.files}
    raw = (tmp_path / "a/b/c.md").read_bytes()
    assert by_path["a/b/c.md"].sha256 == hashlib.sha256(raw).digest()
    assert by_path["a/b/c.md"].size == len(raw)
    assert by_path["a/b/c.md"].text == "# Title\n\ntext\n"
    assert not walk.skipped and not walk.warnings


def test_text_keeps_every_line_so_that_cited_lines_are_the_files_own(tmp_path: Path) -> None:
    write(tmp_path, "crlf.py", "\r\n\r\nfirst = 1\r\nsecond = 2\r\n\r\n")
    write(tmp_path, "bom.py", b"\xef\xbb\xbf\nx = 1\n")
    by_path = {f.path: f for f in walk_repository(tmp_path).files}
    assert by_path["crlf.py"].text == "\n\nfirst = 1\nsecond = 2\n\n"
    assert by_path["crlf.py"].text.split("\n")[2] == "first = 1"   # line 3 of the file
    assert by_path["bom.py"].text == "\nx = 1\n"


def test_unreadable_kinds_of_file_are_skipped_and_counted_by_reason(tmp_path: Path) -> None:
    write(tmp_path, "ok.py", "ok = True\n")
    write(tmp_path, "image.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR")
    write(tmp_path, "latin1.txt", "café\n".encode("latin-1"))
    write(tmp_path, "blank.py", "  \n\n\t\n")
    write(tmp_path, "big.json", "[" + "1," * (DEFAULT_MAX_BYTES // 2) + "1]")
    os.mkfifo(tmp_path / "pipe")
    walk = walk_repository(tmp_path)
    assert [f.path for f in walk.files] == ["ok.py"]
    assert walk.skipped == {"binary": 1, "not UTF-8": 1, "empty": 1, "too large": 1, "not a regular file": 1}
    assert "skipped 1 binary, 1 empty, 1 not UTF-8, 1 not a regular file, 1 too large" in walk.summary()


def test_a_file_over_the_bound_is_named_with_its_size(tmp_path: Path) -> None:
    write(tmp_path, "ok.py", "ok = True\n")
    write(tmp_path, "data/dump.sql", "x" * 5000)
    walk = walk_repository(tmp_path, max_bytes=4096)
    assert walk.skipped == {"too large": 1}
    assert walk.warnings == ["data/dump.sql: 5,000 bytes, over the bound of 4,096 bytes; skipped"]
    assert [f.path for f in walk_repository(tmp_path, max_bytes=5000).files] == ["data/dump.sql", "ok.py"]


def test_symlinks_leaving_the_root_are_skipped_those_inside_are_read_under_their_path(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside, "secret.txt", "not part of the repository\n")
    root = tmp_path / "repo"
    write(root, "src/real.py", "value = 42\n")
    (root / "leak.txt").symlink_to(outside / "secret.txt")
    (root / "leakdir").symlink_to(outside, target_is_directory=True)
    (root / "alias.py").symlink_to(root / "src/real.py")
    (root / "src_link").symlink_to(root / "src", target_is_directory=True)   # not followed: read once
    (root / "dangling.py").symlink_to(root / "gone.py")
    walk = walk_repository(root)
    assert [f.path for f in walk.files] == ["alias.py", "src/real.py"]
    assert walk.files[0].text == "value = 42\n"
    assert walk.skipped == {"symlink leaving the root": 2, "broken symlink": 1}


def test_exclude_globs_hold_out_files_and_whole_folders(tmp_path: Path) -> None:
    for rel in ["pkg/a.py", "pkg/b.py", "pkg/gen/c.py", "build/out.py", "docs/x.md", "vendor/lib/v.py"]:
        write(tmp_path, rel, f"# {rel}\n")
    walk = walk_repository(tmp_path, exclude=["build", "*.md", "pkg/gen/*", "vendor/*"])
    assert [f.path for f in walk.files] == ["pkg/a.py", "pkg/b.py"]
    # build and vendor/lib are folders not entered; gen's file and the .md are single files
    assert walk.skipped == {"excluded folder": 2, "excluded": 2}


def test_version_control_and_cache_folders_are_never_entered(tmp_path: Path) -> None:
    write(tmp_path, "main.py", "main()\n")
    write(tmp_path, ".git/config", "[core]\n")
    write(tmp_path, ".venv/lib/site.py", "import os\n")
    write(tmp_path, "pkg/__pycache__/m.cpython-311.pyc", "cached\n")
    write(tmp_path, ".github/workflows/ci.yml", "on: push\n")   # a dot folder that is the repository's
    assert [f.path for f in walk_repository(tmp_path).files] == [".github/workflows/ci.yml", "main.py"]


def test_a_file_that_vanishes_before_it_is_read_is_skipped_with_a_warning(tmp_path: Path, monkeypatch) -> None:
    write(tmp_path, "stays.py", "x = 1\n")
    write(tmp_path, "goes.py", "y = 2\n")
    real = repo_files.read_repo_file

    def delete_then_read(root, relative, walk, max_bytes=DEFAULT_MAX_BYTES):
        if relative == "goes.py":
            (root / relative).unlink()   # removed between the listing and the read, as an editor may
        return real(root, relative, walk, max_bytes)

    monkeypatch.setattr(repo_files, "read_repo_file", delete_then_read)
    walk = walk_repository(tmp_path)
    assert [f.path for f in walk.files] == ["stays.py"]
    assert walk.skipped == {"vanished": 1}
    assert walk.warnings == ["goes.py: removed while being read; skipped"]


def test_a_single_file_can_be_read_again_by_the_same_rules(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a = 1\n")
    walk = Walk(tmp_path.resolve())
    assert read_repo_file(tmp_path.resolve(), "a.py", walk).text == "a = 1\n"
    assert read_repo_file(tmp_path.resolve(), "missing.py", walk) is None
    assert walk.skipped == {"vanished": 1}


def test_a_folder_with_no_readable_text_is_one_line_saying_why(tmp_path: Path) -> None:
    write(tmp_path, "a.bin", b"\0\1\2")
    write(tmp_path, "b.txt", "   \n")
    with pytest.raises(UserError) as err:
        walk_repository(tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert "holds no readable text file" in message and "1 binary" in message and "1 empty" in message
    with pytest.raises(UserError, match="not a directory"):
        walk_repository(tmp_path / "a.bin")
    write(tmp_path, "c.py", "c = 3\n")
    with pytest.raises(UserError, match="1 excluded"):
        walk_repository(tmp_path, exclude=["*.py"])


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_in_a_git_work_tree_what_git_ignores_stays_out(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    write(tmp_path, ".gitignore", "build/\n*.log\n")
    write(tmp_path, "src/app.py", "app = 1\n")            # new, not ignored: counted like a tracked file
    write(tmp_path, "build/lib/app.py", "app = 1\n")
    write(tmp_path, "run.log", "started\n")
    walk = walk_repository(tmp_path)
    assert [f.path for f in walk.files] == [".gitignore", "src/app.py"]
    assert walk.skipped == {"folder ignored by git": 1, "ignored by git": 1}
    # the ignored folder indexed as a repository of its own: every file counts
    assert [f.path for f in walk_repository(tmp_path / "build").files] == ["lib/app.py"]
    (tmp_path / ".gitignore").unlink()
    assert [f.path for f in walk_repository(tmp_path).files] == ["build/lib/app.py", "run.log", "src/app.py"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_folders_git_ignores_whole_are_known_so_a_watch_can_drop_their_changes(tmp_path: Path) -> None:
    from hartonomous.repository.files import git_ignored_folders

    assert git_ignored_folders(tmp_path) == ()                  # not a work tree
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    write(tmp_path, ".gitignore", ".data/\n*.log\n")
    write(tmp_path, ".data/pg/base/1", "pages")
    write(tmp_path, "run.log", "x")
    write(tmp_path, "src/a.py", "a = 1\n")
    assert git_ignored_folders(tmp_path) == (".data/",)
