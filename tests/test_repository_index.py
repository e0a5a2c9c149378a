"""`hartonomous index DIR`, the first run: an indexed set with its file table.

Each file is tokenized alone and recorded with its content hash, size, tokens, line starts,
split (from a hash of its path) and license; the set records its root. Only training files give
atoms, and their atoms are the sum of each file's own (chunks never cross a file boundary). A set
written by `build` is refused with how to index instead, and a directory without text gets one line.
"""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
import psycopg
import pytest

from generation_helpers import drop_atom_set, run_cli
from hartonomous.errors import UserError
from hartonomous.repository.chunking import file_chunks, file_tokens, merged_file_atoms
from hartonomous.repository.index import default_name, index_repository
from hartonomous.repository.split import file_split, unique_contents
from hartonomous.repository.update import read_params
from repository_helpers import index, initial_files, write_repository
from tiny_model import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def indexed(server_url, tmp_path_factory):
    root = write_repository(tmp_path_factory.mktemp("repo") / "myrepo", initial_files())
    name = f"idx-{uuid.uuid4().hex[:8]}"
    report = index(server_url, root, name)
    yield root, name, report
    drop_atom_set(server_url, name)


def test_the_first_index_records_every_file_with_its_hash_tokens_lines_split_and_license(server_url, indexed):
    root, name, report = indexed
    assert report.kind == "first index" and report.added == len(initial_files()) and report.atoms > 0
    _, tokenizer = tiny_model(0)
    with psycopg.connect(server_url) as conn:
        (set_root,) = conn.execute("SELECT root FROM atom_sets WHERE name = %s", (name,)).fetchone()
        rows = conn.execute("SELECT f.path, f.content_sha256, f.size_bytes, f.n_tokens, f.token_ids, f.line_starts, "
                            "f.split, f.license, f.license_source, f.file_id FROM atom_set_files f "
                            "JOIN atom_sets s ON s.id = f.atom_set_id WHERE s.name = %s ORDER BY f.path",
                            (name,)).fetchall()
    assert set_root == str(root.resolve())
    assert [r[0] for r in rows] == sorted(initial_files())
    assert sorted(r[9] for r in rows) == list(range(len(rows)))          # ids 0 .. n-1, none twice
    for path, sha, size, n, token_ids, line_starts, split, license, source, _ in rows:
        raw = (root / path).read_bytes()
        text = raw.decode("utf-8")
        assert bytes(sha) == hashlib.sha256(raw).digest() and size == len(raw)
        assert token_ids == tokenizer(text, add_special_tokens=False)["input_ids"] and n == len(token_ids)
        assert split == file_split(path)
        assert source in ("spdx-header", "license-file", "package-metadata", "unknown")
        lines = text.split("\n")[:-1]                                  # the modules end with a newline
        assert len(line_starts) == len(lines)
        for number, line in enumerate(lines):                          # each line's text starts in its token
            start = line_starts[number]
            decoded_before = tokenizer.decode(token_ids[:start])
            decoded_through = tokenizer.decode(token_ids[:start + 1])
            offset = sum(len(x) + 1 for x in lines[:number])
            assert len(decoded_before) <= offset < len(decoded_through) or line == ""
    assert {r[6] for r in rows} == {"train", "calibration", "test"}


def test_the_atoms_are_the_sum_of_the_training_files_own_atoms(server_url, indexed):
    root, name, _ = indexed
    _, tokenizer = tiny_model(0)
    with psycopg.connect(server_url) as conn:
        params = read_params(conn, name)
        stored = conn.execute("SELECT token_id, ST_X(position), ST_Y(position), ST_Z(position), weight FROM atoms "
                              "WHERE atom_set_id = %s", (params.set_id,)).fetchall()
    expected: dict = {}
    for path, text in initial_files().items():
        if file_split(path) != "train":
            continue
        atoms = merged_file_atoms(file_chunks(file_tokens(tokenizer, text).token_ids, params.context_length),
                                  params.positions, params.window, params.decay)
        for t, p, w in zip(atoms.token_ids.tolist(), atoms.positions.tolist(), atoms.weights.tolist()):
            expected[(t, *p)] = expected.get((t, *p), 0.0) + w
    assert {(t, x, y, z): w for t, x, y, z, w in stored} == expected


def test_the_defaults_for_code_are_lattice_keys_with_the_backoff_kernel_and_a_gate(server_url, indexed):
    _, name, _ = indexed
    with psycopg.connect(server_url) as conn:
        projection, kernel, layout, stats = conn.execute(
            "SELECT projection, kernel, layout, stats FROM atom_sets WHERE name = %s", (name,)).fetchone()
        (details,) = conn.execute("SELECT g.details FROM augment_gates g JOIN atom_sets s ON s.id = g.atom_set_id "
                                  "WHERE s.name = %s", (name,)).fetchone()
    assert (projection, kernel, layout) == ("lattice", "backoff", "rows")
    assert stats["distill"]["target"] == "corpus" and stats["repository"]["defaults"] == "code"
    assert details["fitted_on"]["split"] == "calibration" and details["fitted_on"]["files"] == 3


def test_duplicate_files_keep_the_smallest_path_whatever_the_order():
    class F:
        def __init__(self, path, sha):
            self.path, self.sha256 = path, sha

    files = [F("b.py", b"1"), F("a.py", b"1"), F("c.py", b"2"), F("d/a.py", b"1")]
    for order in (files, files[::-1], files[1:] + files[:1]):
        kept, duplicates = unique_contents(order)
        assert [f.path for f in kept] == ["a.py", "c.py"] and duplicates == 2


def test_a_split_depends_on_the_path_alone():
    assert file_split("pkg/mod_4.py") == "calibration" and file_split("pkg/mod_28.py") == "test"
    assert file_split("pkg/mod_0.py") == "train"


def test_a_sensible_name_comes_from_the_directory(tmp_path):
    assert default_name(tmp_path / "My Repo!") == "My-Repo"
    assert default_name(tmp_path / "flask") == "flask"


def test_a_set_written_by_build_is_refused_with_how_to_index(server_url, tmp_path):
    from generation_helpers import write_tiny_atom_set

    built = write_tiny_atom_set(server_url, model="tiny")
    try:
        root = write_repository(tmp_path / "r", initial_files())
        with pytest.raises(UserError, match=f"written by `hartonomous build`.*hartonomous atom-sets drop {built}"):
            index(server_url, root, built)
    finally:
        drop_atom_set(server_url, built)


def test_a_directory_without_text_gets_one_line(database_env, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blob.bin").write_bytes(b"\x00\x01\x02")
    code, out, err = run_cli(capsys, "index", str(tmp_path / "empty"))
    assert code == 1 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_an_update_without_a_first_index_says_how_to_make_one(server_url, tmp_path):
    root = write_repository(tmp_path / "r", initial_files())
    _, tokenizer = tiny_model(0)
    with pytest.raises(UserError, match="does not exist yet: run `hartonomous index"):
        index_repository(root, f"none-{uuid.uuid4().hex[:6]}", tokenizer=tokenizer, database_url=server_url,
                         progress=False)


def test_gate_show_says_when_the_gate_was_fitted_and_on_what(database_env, indexed, capsys):
    import json

    _, name, _ = indexed
    code, out, err = run_cli(capsys, "gate", "show", name)
    assert code == 0, err
    shown = json.loads(out)
    assert shown["fitted_at"] and shown["extra"]["fitted_on"]["split"] == "calibration"
    assert shown["extra"]["fitted_on"]["files"] == 3 and shown["extra"]["fitted_on"]["tokens"] > 0


def test_recalibrate_refits_the_parameters_and_keeps_the_files(server_url, indexed):
    root, name, _ = indexed
    query = ("SELECT s.id, g.fitted_at, (SELECT array_agg(f.path ORDER BY f.path) FROM atom_set_files f "
             "WHERE f.atom_set_id = s.id) FROM atom_sets s JOIN augment_gates g ON g.atom_set_id = s.id "
             "WHERE s.name = %s")
    with psycopg.connect(server_url) as conn:
        set_id, fitted_at, paths = conn.execute(query, (name,)).fetchone()
    report = index(server_url, root, name, recalibrate=True)
    assert report.kind == "recalibrated" and report.atoms > 0
    with psycopg.connect(server_url) as conn:
        new_id, new_fitted_at, new_paths = conn.execute(query, (name,)).fetchone()
    assert new_paths == paths and new_fitted_at > fitted_at and new_id != set_id


def test_a_folder_of_prose_gets_the_projection_keys_and_code_the_lattice():
    from hartonomous.repository.index import is_code
    from projection.index import index_options

    class F:
        def __init__(self, path, size):
            self.path, self.size = path, size

    assert is_code([F("a.py", 900), F("README.md", 100)])
    assert not is_code([F("a.py", 100), F("guide.md", 900), F("notes.txt", 50)])
    code, prose = index_options("s", "tiny", True, False), index_options("s", "tiny", False, False)
    assert (code.positions, code.kernel, code.layout, code.target) == ("lattice", "backoff", "rows", "corpus")
    assert (prose.positions, prose.kernel, prose.layout, prose.target) == ("projection", "gaussian", "rows", "corpus")
    assert prose.resolved_window() == 3 and prose.resolved_decay() == 0.01
