"""`hartonomous index DIR` run again: the set is updated in place and answers as a fresh index would.

After any sequence of added, changed and removed files, every answer of the updated set
(next_token, store_distribution, drafts) equals that of a fresh index of the final files with the
set's frozen parameters (hartonomous.repository.update.write_fresh), within 1e-12: checked with
hypothesis over random edit sequences on a small repository with the tiny model. The parameters
(bandwidth, history weight, risk model, gate) stay as fitted; file ids are never reused; an
update is one transaction (a SIGKILL at its last moment leaves the set answering as before); two
runs on one set do not interleave.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from generation_helpers import drop_atom_set
from hartonomous import sqlcalls
from hartonomous.repository.index import LOCK_CLASS, entries_for
from hartonomous.repository.split import file_split
from repository_helpers import FILES, index, initial_files, module_text, write_repository
from tiny_model import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOLERANCE = 1e-12
FROZEN = ("bandwidth", "history_weight", "history_window", "centroid_window", "centroid_decay", "kernel",
          "risk_model", "projection_params")


@pytest.fixture(scope="module")
def repo(server_url, tmp_path_factory):
    """A small indexed repository: (root, set name)."""
    root = write_repository(tmp_path_factory.mktemp("repo") / "project", initial_files())
    name = f"upd-{uuid.uuid4().hex[:8]}"
    index(server_url, root, name)
    yield root, name
    drop_atom_set(server_url, name)


def current_files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))}


def fresh_copy(url: str, like: str, root: Path) -> str:
    """A fresh index of the files now in `root` with `like`'s frozen parameters; returns its name."""
    from hartonomous.repository.files import walk_repository
    from hartonomous.repository.split import unique_contents
    from hartonomous.repository.update import write_fresh

    _, tokenizer = tiny_model(0)
    files, _ = unique_contents(walk_repository(root).files)
    name = f"fresh-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url) as conn:
        write_fresh(conn, like, name, str(root), entries_for(root, files, tokenizer))
    return name


def contexts(root: Path) -> list[list[int]]:
    """Prefixes of the training files now in the repository, and two token sequences of no file."""
    _, tokenizer = tiny_model(0)
    found = []
    for path, text in sorted(current_files(root).items()):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if file_split(path) == "train" and len(ids) > 12:
            found += [ids[:4], ids[:12], ids[5:40]]
    return found[:18] + [[5, 6, 7, 8], list(range(40, 60))]


def assert_same_answers(url: str, updated: str, fresh: str, root: Path) -> None:
    with psycopg.connect(url) as conn:
        for context in contexts(root):
            a = dict(sqlcalls.next_token(conn, context, atom_set=updated))
            b = dict(sqlcalls.next_token(conn, context, atom_set=fresh))
            assert a.keys() == b.keys() and all(abs(a[t] - b[t]) <= TOLERANCE for t in a), context
            for x, y in zip(sqlcalls.store_distribution(conn, context, atom_set=updated, positions=3),
                            sqlcalls.store_distribution(conn, context, atom_set=fresh, positions=3), strict=True):
                assert x.token_ids == y.token_ids and x.candidates == y.candidates, context
                np.testing.assert_allclose(x.probabilities, y.probabilities, rtol=0, atol=TOLERANCE)
                np.testing.assert_allclose(x.matched_mass, y.matched_mass, rtol=1e-12, atol=0)
            da = sqlcalls.draft_tokens(conn, context, 6, atom_set=updated, seed=7)
            db = sqlcalls.draft_tokens(conn, context, 6, atom_set=fresh, seed=7)
            assert [t for t, _, _ in da] == [t for t, _, _ in db], context
            for (_, ia, pa), (_, ib, pb) in zip(da, db):
                assert ia == ib
                np.testing.assert_allclose(pa, pb, rtol=0, atol=TOLERANCE)


def frozen(url: str, name: str) -> tuple:
    with psycopg.connect(url) as conn:
        row = conn.execute(f"SELECT {', '.join(FROZEN)} FROM atom_sets WHERE name = %s", (name,)).fetchone()
        gate = conn.execute("SELECT coefficients, intercept, fitted_at FROM augment_gates g JOIN atom_sets s "
                            "ON s.id = g.atom_set_id WHERE s.name = %s", (name,)).fetchone()
    return row, gate


# An edit: ('add', seed) a new file, ('change', i, seed) file number i (modulo those present) gets
# new text, ('remove', i) file number i goes; ('update',) runs `index` (also run at the end).
EDITS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(100, 10_000)),
    st.tuples(st.just("change"), st.integers(0, 200), st.integers(100, 10_000)),
    st.tuples(st.just("remove"), st.integers(0, 200)),
    st.tuples(st.just("update"))), min_size=1, max_size=8)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(edits=EDITS)
def test_updates_answer_exactly_as_a_fresh_index_of_the_final_files(server_url, repo, edits):
    root, name = repo
    before = frozen(server_url, name)
    files = initial_files()                         # each example starts from the first index's files
    write_repository(root, files)
    index(server_url, root, name)
    for edit in edits:
        paths = sorted(files)
        if edit[0] == "add":
            files[f"pkg/new_{edit[1]}.py"] = module_text(edit[1], functions=1 + edit[1] % 4)
        elif edit[0] == "change" and paths:
            files[paths[edit[1] % len(paths)]] = module_text(edit[2])
        elif edit[0] == "remove" and len(paths) > FILES // 2:
            del files[paths[edit[1] % len(paths)]]
        write_repository(root, files)
        if edit[0] == "update":
            index(server_url, root, name)
    report = index(server_url, root, name)
    assert report.kind == "update"
    fresh = fresh_copy(server_url, name, root)
    try:
        assert_same_answers(server_url, name, fresh, root)
        with psycopg.connect(server_url) as conn:
            count = """SELECT count(*), sum(weight) FROM atoms a JOIN atom_sets s ON s.id = a.atom_set_id
                        WHERE s.name = %s"""
            assert conn.execute(count, (name,)).fetchone() == conn.execute(count, (fresh,)).fetchone()
            recorded = "SELECT (stats#>>'{ingest,atoms}')::bigint, (stats#>>'{atoms,count}')::bigint FROM atom_sets " \
                       "WHERE name = %s"
            (atoms, _) = conn.execute(count, (name,)).fetchone()
            assert conn.execute(recorded, (name,)).fetchone() == (atoms, atoms)    # what `atom-sets` shows
    finally:
        drop_atom_set(server_url, fresh)
    assert frozen(server_url, name) == before          # parameters and gate untouched


def test_a_run_reports_what_changed_and_file_ids_are_never_reused(server_url, repo):
    root, name = repo
    files = initial_files()
    write_repository(root, files)
    index(server_url, root, name)
    with psycopg.connect(server_url) as conn:
        ids_before = dict(conn.execute("SELECT f.path, f.file_id FROM atom_set_files f JOIN atom_sets s "
                                       "ON s.id = f.atom_set_id WHERE s.name = %s", (name,)).fetchall())
    files["pkg/mod_1.py"] = module_text(5001)
    del files["pkg/mod_2.py"]
    files["pkg/extra.py"] = module_text(5002)
    write_repository(root, files)
    report = index(server_url, root, name)
    assert (report.added, report.changed, report.removed, report.unchanged) == (1, 1, 1, FILES - 2)
    assert report.atoms_applied.inserted + report.atoms_applied.updated + report.atoms_applied.deleted > 0
    with psycopg.connect(server_url) as conn:
        ids_after = dict(conn.execute("SELECT f.path, f.file_id FROM atom_set_files f JOIN atom_sets s "
                                      "ON s.id = f.atom_set_id WHERE s.name = %s", (name,)).fetchall())
    assert ids_after["pkg/mod_0.py"] == ids_before["pkg/mod_0.py"]           # unchanged files keep their id
    assert ids_after["pkg/mod_1.py"] not in ids_before.values()              # a changed file gets a new one
    assert ids_after["pkg/extra.py"] not in ids_before.values()
    assert ids_after["pkg/mod_1.py"] != ids_after["pkg/extra.py"]
    again = index(server_url, root, name)
    assert (again.added, again.changed, again.removed, again.unchanged) == (0, 0, 0, FILES)


def test_drift_in_the_calibration_split_suggests_recalibrating(server_url, repo):
    root, name = repo
    files = initial_files()
    write_repository(root, files)
    index(server_url, root, name)
    for seed, path in enumerate(("pkg/mod_4.py", "pkg/mod_23.py", "pkg/mod_25.py")):   # the calibration files
        files[path] = module_text(7000 + seed, functions=6)
    write_repository(root, files)
    report = index(server_url, root, name)
    assert report.drift is not None and "--recalibrate" in report.drift and "calibration split" in report.drift


KILLED = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from hartonomous.repository import index as idx
    from repository_helpers import index
    original = idx.update_set
    def update_then_die(*args, **kwargs):
        def die():
            print("applied", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, before_commit=die, **kwargs)
    idx.update_set = update_then_die
    index({url!r}, Path({root!r}), {name!r})
""")


def answers(url: str, name: str, root: Path) -> list:
    with psycopg.connect(url) as conn:
        return [sqlcalls.next_token(conn, c, atom_set=name) for c in contexts(root)]


def test_an_update_killed_before_its_commit_leaves_the_set_answering_as_before(server_url, repo):
    root, name = repo
    files = initial_files()
    write_repository(root, files)
    index(server_url, root, name)
    before = answers(server_url, name, root)
    with psycopg.connect(server_url) as conn:
        table = conn.execute("SELECT f.path, f.content_sha256 FROM atom_set_files f JOIN atom_sets s "
                             "ON s.id = f.atom_set_id WHERE s.name = %s ORDER BY 1", (name,)).fetchall()
    files["pkg/mod_7.py"] = module_text(9001)
    del files["pkg/mod_8.py"]
    files["pkg/killed.py"] = module_text(9002)
    write_repository(root, files)
    script = KILLED.format(tests=str(Path(__file__).parent), url=server_url, root=str(root), name=name)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == -signal.SIGKILL and "applied" in done.stdout, done.stderr
    write_repository(root, initial_files())
    assert answers(server_url, name, root) == before
    with psycopg.connect(server_url) as conn:
        assert conn.execute("SELECT f.path, f.content_sha256 FROM atom_set_files f JOIN atom_sets s "
                            "ON s.id = f.atom_set_id WHERE s.name = %s ORDER BY 1", (name,)).fetchall() == table


def test_a_second_run_on_the_same_set_waits_for_the_first(server_url, repo):
    root, name = repo
    write_repository(root, initial_files())
    heard = []
    with psycopg.connect(server_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (LOCK_CLASS, name))
        import threading

        from hartonomous.repository.index import index_repository

        _, tokenizer = tiny_model(0)
        result = {}
        worker = threading.Thread(target=lambda: result.update(report=index_repository(
            root, name, tokenizer=tokenizer, database_url=server_url, progress=False, say=heard.append)))
        worker.start()
        time.sleep(1.5)
        assert worker.is_alive() and any("waiting" in m for m in heard)     # it waits, and says so
        holder.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (LOCK_CLASS, name))
        worker.join(60)
    assert not worker.is_alive() and result["report"].kind == "update"


def test_exclude_holds_files_out_and_they_come_back_without_it(server_url, repo):
    root, name = repo
    write_repository(root, initial_files())
    index(server_url, root, name)
    held = index(server_url, root, name, exclude=["pkg/mod_1*"])          # mod_1, mod_10 .. mod_19
    assert (held.removed, held.skipped["excluded"]) == (11, 11)
    back = index(server_url, root, name)
    assert (back.added, back.removed) == (11, 0)
