"""`hartonomous index DIR --watch` (hartonomous.repository.watch): saves applied to the set, debounced.

The watch loop is checked here with a stand-in index function that reads the repository as the
real one does (walk_repository) and records what it saw: a burst of saves is one run (or a few),
the last run sees the final files, changes the index would never read run nothing, and a failed
run is said in one line while the watch goes on. With the real index and a server running, the
server answers every request during the updates, from the set before a batch or after it.
"""

from __future__ import annotations

import subprocess
import shutil
import threading
import time
from pathlib import Path

import pytest

from hartonomous.errors import UserError
from hartonomous.repository.files import walk_repository
from hartonomous.repository.watch import Follower, indexable, watch_repository

WAIT_S = 30          # generous deadlines for things that must happen; never asserted as timings


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def changes(root: Path, *paths: str) -> set[tuple[int, str]]:
    """A batch as watchfiles yields it: (change, absolute path)."""
    return {(2, str(root / p)) for p in paths}


class RecordingIndex:
    """Stands in for index_repository: reads the files as it does, records each run's view of them."""

    def __init__(self, fail_with: Exception | None = None):
        self.runs: list[dict[str, str]] = []
        self.options: list[dict] = []
        self.fail_with = fail_with
        self.ran = threading.Event()

    def __call__(self, root, name=None, *, exclude=(), **options):
        self.options.append(options)
        self.runs.append({f.path: f.text for f in walk_repository(root, exclude).files})
        self.ran.set()
        if self.fail_with is not None and len(self.runs) > 1:
            raise self.fail_with
        return None


def test_only_paths_the_index_could_read_matter() -> None:
    assert indexable("src/app.py", ())
    assert not indexable(".git/index", ()) and not indexable(".git", ())
    assert not indexable("pkg/__pycache__/m.cpython-311.pyc", ())
    assert not indexable(".venv/lib/x.py", ())
    assert not indexable("build/out.py", ["build"])
    assert not indexable("docs/a.md", ["*.md"])
    assert indexable("docs/a.txt", ["*.md"])


def test_a_batch_is_one_run_over_its_indexable_paths(tmp_path: Path) -> None:
    seen: list[list[str]] = []
    said: list[str] = []
    follower = Follower(tmp_path, lambda paths: seen.append(paths), exclude=["vendor/*"], say=said.append)
    assert follower.follow(changes(tmp_path, "a.py", "b/c.py", ".git/HEAD", "vendor/v.py"))
    assert seen == [["a.py", "b/c.py"]]
    assert not follower.follow(changes(tmp_path, ".git/ORIG_HEAD", "vendor/w.py"))    # nothing to index: no run
    assert not follower.follow({(2, str(tmp_path.parent / "elsewhere.py"))})
    assert seen == [["a.py", "b/c.py"]] and follower.runs == 1
    assert said == ["changed: a.py, b/c.py"]


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_in_a_git_work_tree_changes_to_ignored_paths_run_nothing(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    write(tmp_path, ".gitignore", "data/\n*.log\n")
    write(tmp_path, "src/app.py", "app = 1\n")
    seen: list[list[str]] = []
    follower = Follower(tmp_path, seen.append, say=lambda m: None)
    write(tmp_path, "data/pg/base/1234", "database pages")   # e.g. the database's own files
    write(tmp_path, "run.log", "started")
    assert not follower.follow(changes(tmp_path, "data/pg/base/1234", "run.log"))
    (tmp_path / "src/app.py").unlink()                         # a removed file still matters
    write(tmp_path, "src/new.py", "new = 2\n")                 # and a new one git would list
    assert follower.follow(changes(tmp_path, "src/app.py", "src/new.py", "run.log"))
    assert seen == [["src/app.py", "src/new.py"]]


def test_a_failed_run_is_said_in_one_line_and_the_watch_goes_on(tmp_path: Path) -> None:
    said: list[str] = []
    outcomes = iter([UserError("every file of 'repo' is gone"), OSError(5, "Input/output error"), None])

    def apply(paths):
        outcome = next(outcomes)
        if outcome is not None:
            raise outcome

    follower = Follower(tmp_path, apply, say=said.append)
    for _ in range(3):
        assert follower.follow(changes(tmp_path, "a.py"))
    assert follower.runs == 3 and follower.failures == 2
    assert said[1] == "not applied: every file of 'repo' is gone"
    assert said[3].startswith("not applied (OSError): ") and said[3].endswith("the next save tries again")
    assert all("\n" not in line for line in said)


def watching(root: Path, index: RecordingIndex, **options) -> tuple[threading.Thread, threading.Event, list]:
    """watch_repository on a thread, with its first run done; (thread, stop, what it said)."""
    stop = threading.Event()
    said: list[str] = []
    result: list = []
    thread = threading.Thread(target=lambda: result.append(watch_repository(
        root, "repo", index=index, say=said.append, stop_event=stop, **options)), daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while not any(line.startswith("watching ") for line in said):
        assert time.monotonic() < deadline, said
        time.sleep(0.02)
    time.sleep(0.3)    # the watcher is set up just after it says so
    return thread, stop, said


def wait_for_runs(index: RecordingIndex, count: int, quiet_s: float = 1.5) -> None:
    """Until index has made `count` runs and then none for quiet_s."""
    deadline = time.monotonic() + WAIT_S
    while True:
        before = len(index.runs)
        time.sleep(quiet_s)
        if len(index.runs) >= count and len(index.runs) == before:
            return
        assert time.monotonic() < deadline, f"{len(index.runs)} runs, waited for {count}"


def test_a_burst_of_saves_is_applied_together_and_the_last_run_sees_the_final_files(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a = 0\n")
    index = RecordingIndex()
    thread, stop, said = watching(tmp_path, index, step_ms=400, recalibrate=True, progress=False)
    try:
        assert index.runs == [{"a.py": "a = 0\n"}]                 # brought up to date first
        assert index.options == [{"progress": False, "recalibrate": True}]
        for i in range(1, 21):                                      # an editor saving 20 times, quickly
            write(tmp_path, "a.py", f"a = {i}\n")
        write(tmp_path, "b.py", "b = 1\n")
        wait_for_runs(index, 2)
        assert 2 <= len(index.runs) <= 4                            # 21 saves: one batch, or a few
        assert index.runs[-1] == {"a.py": "a = 20\n", "b.py": "b = 1\n"}
        assert all(options == {"progress": False} for options in index.options[1:])   # refit once, then updates
        runs = len(index.runs)
        write(tmp_path, ".git/HEAD", "ref: refs/heads/main\n")     # never indexed: no run
        time.sleep(1.5)
        assert len(index.runs) == runs
        (tmp_path / "b.py").unlink()
        wait_for_runs(index, runs + 1)
        assert index.runs[-1] == {"a.py": "a = 20\n"}
    finally:
        stop.set()
        thread.join(timeout=WAIT_S)
    assert not thread.is_alive()


def test_saves_during_a_run_wait_for_it_and_form_the_next_batch(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "a = 0\n")
    release = threading.Event()

    class SlowIndex(RecordingIndex):
        def __call__(self, root, name=None, **options):
            view = super().__call__(root, name, **options)
            if len(self.runs) == 2:
                release.wait(WAIT_S)        # the second run is slow: saves arrive meanwhile
            return view

    index = SlowIndex()
    thread, stop, said = watching(tmp_path, index, step_ms=200)
    try:
        write(tmp_path, "a.py", "a = 1\n")
        deadline = time.monotonic() + WAIT_S
        while len(index.runs) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        write(tmp_path, "a.py", "a = 2\n")                          # saved while the run is going on
        write(tmp_path, "c.py", "c = 3\n")
        time.sleep(0.5)
        assert len(index.runs) == 2                                 # never two runs at once
        release.set()
        wait_for_runs(index, 3)
        assert index.runs[-1] == {"a.py": "a = 2\n", "c.py": "c = 3\n"}
    finally:
        release.set()
        stop.set()
        thread.join(timeout=WAIT_S)


# --- with the real index and a server running --------------------------------------------------

PROMPTS = ["def add_0(items, value):\n    items = items +", "    return total *", '"""Module 7."""\n\ndef']


def answers(http, name: str) -> list:
    """The server's next-token distribution (path spatial, top rows) for each prompt."""
    out = []
    for prompt in PROMPTS:
        response = http.post("/api/next_token", json={"prompt": prompt, "path": "spatial", "atom_set": name,
                                                      "limit": 20})
        assert response.status_code == 200, response.text
        out.append([(r["token_id"], r["probability"]) for r in response.json()["rows"]])
    return out


@pytest.mark.usefixtures("one_torch_thread")
def test_the_server_keeps_answering_during_updates_from_the_set_before_or_after_each_batch(
        server_url, reader_url, tmp_path: Path) -> None:
    import uuid

    import httpx

    from generation_helpers import drop_atom_set
    from repository_helpers import index, initial_files, module_text, write_repository
    from server_helpers import live_app

    root = write_repository(tmp_path / "repo", initial_files())
    name = f"watch-{uuid.uuid4().hex[:8]}"
    runs: list = []

    windows: list[tuple[float, float]] = []                 # when each index run went on

    def real_index(root_, name_, *, exclude=()):
        started = time.monotonic()
        report = index(server_url, root_, name_, exclude=exclude)
        windows.append((started, time.monotonic()))
        runs.append(report)
        return report

    stop = threading.Event()
    said: list[str] = []
    watcher = threading.Thread(target=lambda: watch_repository(root, name, index=real_index, say=said.append,
                                                               stop_event=stop, step_ms=300), daemon=True)
    server, _runtime = live_app(reader_url, name, pool_size=2)
    try:
        watcher.start()
        deadline = time.monotonic() + WAIT_S * 4
        while not runs:                                      # the first index
            assert time.monotonic() < deadline and watcher.is_alive()
            time.sleep(0.1)
        time.sleep(0.5)
        with server as url, httpx.Client(base_url=url, timeout=WAIT_S) as http:
            states = [answers(http, name)]
            seen: list = []
            failures: list = []
            asking: list[tuple[float, float]] = []
            done = threading.Event()

            def ask() -> None:                               # a client asking all the time
                with httpx.Client(base_url=url, timeout=WAIT_S) as client:
                    while not done.is_set():
                        try:
                            asked = time.monotonic()
                            seen.append(answers(client, name))
                            asking.append((asked, time.monotonic()))
                        except AssertionError as exc:
                            failures.append(str(exc))

            asker = threading.Thread(target=ask, daemon=True)
            asker.start()
            edits = [{"pkg/mod_0.py": module_text(1000), "pkg/new_a.py": module_text(1001)},
                     {"pkg/mod_1.py": None, "pkg/mod_2.py": module_text(1002) + module_text(1003)}]
            for edit in edits:
                before = len(runs)
                for path, text in edit.items():
                    if text is None:
                        (root / path).unlink()
                    else:
                        write(root, path, text)
                deadline = time.monotonic() + WAIT_S * 4
                while len(runs) == before:                   # the batch applied, the server still answering
                    assert time.monotonic() < deadline and watcher.is_alive(), said
                    time.sleep(0.1)
                time.sleep(1.0)
                assert len(runs) == before + 1, [r.summary() for r in runs]
                states.append(answers(http, name))
            done.set()
            asker.join(timeout=WAIT_S)
        assert not failures, failures[:3]                    # never a 500 (nor any other error)
        assert runs[1].changed + runs[1].added == 2 and runs[2].removed == 1 and runs[2].changed == 1
        assert states[0] != states[1] != states[2]           # each batch changed the answers
        for start, end in windows[1:]:                        # requests were answered while each update ran
            assert any(asked < end and answered > start for asked, answered in asking)
        for i, prompt in enumerate(PROMPTS):                 # before or after a batch, never half of one
            assert all(answer[i] in [state[i] for state in states] for answer in seen), prompt
    finally:
        stop.set()
        watcher.join(timeout=WAIT_S)
        drop_atom_set(server_url, name)


@pytest.mark.usefixtures("one_torch_thread")
def test_index_watch_on_the_command_line_applies_a_save_and_stops_on_ctrl_c(server_url, tmp_path: Path) -> None:
    """`hartonomous index DIR --watch` as a process: up to date first, a save applied, Ctrl-C ends it cleanly."""
    import os
    import signal
    import sys
    import uuid

    from generation_helpers import drop_atom_set, save_tiny_model
    from hartonomous.repository.index import index_repository
    from repository_helpers import initial_files, module_text, tiny_first_index, write_repository
    from tiny_model import tiny_model

    root = write_repository(tmp_path / "repo", initial_files())
    model = save_tiny_model(tmp_path / "tiny")
    name = f"watch-cli-{uuid.uuid4().hex[:8]}"
    index_repository(root, name, first_index=tiny_first_index(), model=str(model), tokenizer=tiny_model(0)[1],
                     database_url=server_url, progress=False)
    process = subprocess.Popen([sys.executable, "-c", "from hartonomous.cli import main; main()", "index", str(root),
                                "--name", name, "--watch"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "HARTONOMOUS_DATABASE_URL": server_url, "COLUMNS": "200"})
    lines: list[str] = []

    def read_until(text: str) -> None:
        for line in process.stdout:
            lines.append(line.rstrip())
            if text in line:
                return
        raise AssertionError(f"the watch ended before saying {text!r}: {lines}")

    try:
        read_until("watching ")
        assert any("0 added, 0 changed, 0 removed, 40 unchanged" in line for line in lines), lines
        time.sleep(0.5)
        write(root, "pkg/mod_3.py", module_text(3000))
        read_until("1 changed")
        assert "changed: pkg/mod_3.py" in lines
        process.send_signal(signal.SIGINT)
        out, _ = process.communicate(timeout=WAIT_S)
        lines += out.splitlines()
        assert process.returncode == 0, lines
        assert "stopped watching" in lines
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
        drop_atom_set(server_url, name)
