"""store_sources and store_verbatim (sql/100_sources.sql): where the store's tokens came from.

- Rows of kind 'file' are the occurrences of the longest suffix of context || token found in the
  set's train files (a brute-force search over the same files is the reference), at most k,
  ordered by file and offset, with the cited token's line from line_starts and the file's license.
  A file that only collides on the occurrence index's keys takes no holding file's place.
- With token NULL the rows are the occurrences of the longest suffix of the context that some
  token follows, each with that token.
- Calibration and test files are never cited; the occurrence index follows inserts, changed
  tokens, changed splits and deletes of atom_set_files (its trigger and ON DELETE CASCADE).
- The memory's own entries come with the generation and step they were remembered at.
- store_verbatim reports each maximal run of at least min_tokens tokens stored verbatim.
- Bad arguments raise 22023 naming them; the reader role may call both and write neither table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest

from hand_sets import add_set, random_set

SOURCES = ("SELECT token_id, kind, file_id, path, line, token_offset, match_tokens, license, license_source, "
           "generation, step FROM store_sources(%s, %s, %s, %s, %s)")
MAX_NEEDLE = 256


def insert_file(db: psycopg.Connection, set_id: int, file_id: int, tokens: list[int], *, split: str = "train",
                lines: list[int] | None = None, license: str | None = "MIT") -> None:
    """A row of atom_set_files as the indexer writes it (lines: the 0-based first token of each line)."""
    lines = lines if lines is not None else list(range(0, len(tokens), 5))
    db.execute("INSERT INTO atom_set_files (atom_set_id, file_id, path, content_sha256, size_bytes, n_tokens, split, "
               "license, license_source, token_ids, line_starts) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
               (set_id, file_id, f"pkg/f{file_id}.py", hashlib.sha256(bytes(tokens)).digest(), len(tokens),
                len(tokens), split, license, "spdx-header" if license else "unknown", tokens, lines))


def line_of(lines: list[int], offset: int) -> int:
    return sum(1 for start in lines if start <= offset)


def occurrences(tokens: list[int], gram: list[int]) -> list[int]:
    return [o for o in range(len(tokens) - len(gram) + 1) if tokens[o:o + len(gram)] == gram]


def reference(files: dict[int, list[int]], context: list[int], token: int | None, k: int) -> list[tuple]:
    """Brute force, with the search's bound (sql/100_sources.sql item 2): the first 16 files (4 below
    the 8-gram level) holding the needle's last 8-, 4- or 2-gram, the longest level any holds; then
    the longest suffix over those files' first 64 occurrences of that gram. (token_id, file_id,
    token_offset, match_tokens) of its occurrences."""
    needle = (context + ([token] if token is not None else []))[-MAX_NEEDLE:]
    for level, cap in ((8, 16), (4, 4), (2, 4)):
        if level > len(needle):
            continue
        holding = [f for f in sorted(files) if occurrences(files[f], needle[-level:])][:cap]
        if not holding:
            continue
        ends = [(f, o + level) for f in holding for o in occurrences(files[f], needle[-level:])[:64]]
        best = max(max(length for length in range(level, len(needle) + 1)
                       if end >= length and files[f][end - length:end] == needle[-length:]) for f, end in ends)
        hits = []
        for f, end in ends:
            tokens = files[f]
            if end < best or tokens[end - best:end] != needle[-best:]:
                continue
            if token is None:
                if end < len(tokens):
                    hits.append((tokens[end], f, end, best))
            else:
                hits.append((token, f, end - 1, best - 1))
        return hits[:k]
    return []


@pytest.fixture(scope="module")
def indexed_set(server_url: str) -> Iterator[tuple[str, int, dict[int, list[int]]]]:
    """A set of 50 tokens with eight train files over a small alphabet (so grams repeat), two of them
    sharing a 40-token passage, one calibration and one test file; committed, dropped afterwards."""
    name = "citations"
    rng = np.random.default_rng(7)
    passage = rng.integers(0, 50, 40).tolist()
    files = {}
    with psycopg.connect(server_url) as db:
        set_id = add_set(db, random_set(name, 3))
        for file_id in range(1, 9):
            tokens = rng.integers(0, 6, 300).tolist()
            if file_id in (3, 6):
                at = int(rng.integers(0, 250))
                tokens[at:at] = passage
            files[file_id] = tokens
            insert_file(db, set_id, file_id, tokens)
        insert_file(db, set_id, 20, passage + [7, 7, 7], split="calibration")
        insert_file(db, set_id, 21, [9, 9] + passage, split="test")
        db.commit()
    yield name, set_id, files
    with psycopg.connect(server_url) as db:
        db.execute("DELETE FROM atom_sets WHERE id = %s", (set_id,))
        db.commit()


@pytest.fixture
def indexed(conn: psycopg.Connection, indexed_set):
    """The set, with changes made through `conn` rolled back after the test."""
    return indexed_set


def sources(db, name: str, context: list[int], token: int | None, k: int = 5, memory: bool = True) -> list[tuple]:
    return db.execute(SOURCES, (context, name, k, token, memory)).fetchall()


def test_file_rows_are_the_longest_stored_suffix_of_context_and_token(conn, indexed) -> None:
    name, _, files = indexed
    rng = np.random.default_rng(11)
    checked = 0
    for trial in range(60):
        source = files[int(rng.integers(1, 9))]
        end = int(rng.integers(12, len(source)))
        context = source[end - int(rng.integers(2, 12)):end]
        if trial % 3 == 0:                     # a token that may never follow: shorter or no match
            context = context + [int(rng.integers(0, 50))]
        token = int(rng.integers(0, 6))
        for k in (1, 5):
            rows = sources(conn, name, context, token, k)
            got = [(r[0], r[2], r[5], r[6]) for r in rows if r[1] == "file"]
            assert got == reference(files, context, token, k)
            for r in rows:
                assert r[3] == f"pkg/f{r[2]}.py" and r[4] == line_of(list(range(0, 400, 5)), r[5])
                assert r[7] == "MIT" and r[8] == "spdx-header"
            checked += bool(got)
    assert checked > 40


def test_the_passage_is_found_at_its_full_length_across_the_levels(conn, indexed) -> None:
    name, _, files = indexed
    # the 40-token passage sits in files 3 and 6: a context ending inside it matches back to its start
    rng = np.random.default_rng(7)
    passage = rng.integers(0, 50, 40).tolist()
    rows = sources(conn, name, [49, 48] + passage[:30], passage[30], k=10)
    files_rows = [r for r in rows if r[1] == "file"]
    assert {r[2] for r in files_rows} == {3, 6}
    assert all(r[6] == 30 for r in files_rows)
    assert files_rows == sorted(files_rows, key=lambda r: (r[2], r[5]))
    for r in files_rows:
        assert files[r[2]][r[5]] == passage[30]


def test_a_file_that_only_collides_on_the_keys_takes_no_holding_files_place(conn) -> None:
    """File 1 holds every key of the 8-gram g (its five 4-grams apart, and an 8-gram whose 16-bit key
    equals g's) but not g; files 2 to 17 hold g. The 8-gram level cites the first 16 files holding
    g, as the brute force does: 2 to 17."""
    set_id = add_set(conn, random_set("collisions", 5))
    gram, sep = [11, 12, 13, 14, 15, 16, 17, 18], 40
    (key,) = conn.execute("SELECT k8 FROM ht_gram_rows(%s) WHERE i = 1", (gram,)).fetchone()
    haystack = np.random.default_rng(3).integers(0, 40, 400_000).tolist()
    (at,) = conn.execute("SELECT min(i) FROM ht_gram_rows(%s) WHERE k8 = %s", (haystack, key)).fetchone()
    twin = haystack[at - 1:at + 7]
    assert twin != gram
    collider = [t for start in range(5) for t in gram[start:start + 4] + [sep]] + twin
    files = {1: collider, **{f: [sep, f] + gram + [sep] for f in range(2, 18)}}
    for file_id, tokens in files.items():
        insert_file(conn, set_id, file_id, tokens)
    assert conn.execute("SELECT ht_needle_keys(%s) <@ ht_file_grams(%s)", (gram, collider)).fetchone()[0]
    rows = sources(conn, "collisions", gram[:7], gram[7], k=20)
    got = [(r[0], r[2], r[5], r[6]) for r in rows if r[1] == "file"]
    assert got == reference(files, gram[:7], gram[7], 20)
    assert [r[1] for r in got] == list(range(2, 18))


def test_without_a_token_the_rows_are_the_tokens_that_follow_the_longest_suffix(conn, indexed) -> None:
    name, _, files = indexed
    rng = np.random.default_rng(5)
    for _ in range(30):
        source = files[int(rng.integers(1, 9))]
        end = int(rng.integers(10, len(source)))
        context = source[end - int(rng.integers(2, 10)):end]
        rows = sources(conn, name, context, None, 8)
        assert [(r[0], r[2], r[5], r[6]) for r in rows if r[1] == "file"] == reference(files, context, None, 8)


def test_calibration_and_test_files_are_never_cited(conn, indexed) -> None:
    name, set_id, _ = indexed
    rows = sources(conn, name, [9, 9], None, 10)             # only the test file starts 9, 9 (+ passage)
    assert all(r[2] not in (20, 21) for r in rows)
    assert conn.execute("SELECT array_agg(file_id ORDER BY file_id) FROM atom_set_file_grams WHERE atom_set_id = %s",
                        (set_id,)).fetchone()[0] == list(range(1, 9))


def test_the_index_follows_changes_splits_and_deletes_of_the_file_table(conn, indexed) -> None:
    name, set_id, files = indexed
    fresh = [40, 41, 42, 43, 44, 45]
    assert [r for r in sources(conn, name, fresh[:4], fresh[4]) if r[1] == "file"] == []
    conn.execute("UPDATE atom_set_files SET token_ids = %s, n_tokens = 6 WHERE atom_set_id = %s AND file_id = 1",
                 (fresh, set_id))
    rows = [r for r in sources(conn, name, fresh[:4], fresh[4]) if r[1] == "file"]
    assert [(r[2], r[5], r[6]) for r in rows] == [(1, 4, 4)]
    conn.execute("UPDATE atom_set_files SET split = 'test' WHERE atom_set_id = %s AND file_id = 1", (set_id,))
    assert [r for r in sources(conn, name, fresh[:4], fresh[4]) if r[1] == "file"] == []
    conn.execute("UPDATE atom_set_files SET split = 'train' WHERE atom_set_id = %s AND file_id = 1", (set_id,))
    assert len([r for r in sources(conn, name, fresh[:4], fresh[4]) if r[1] == "file"]) == 1
    conn.execute("DELETE FROM atom_set_files WHERE atom_set_id = %s AND file_id = 1", (set_id,))
    assert [r for r in sources(conn, name, fresh[:4], fresh[4]) if r[1] == "file"] == []
    assert conn.execute("SELECT count(*) FROM atom_set_file_grams WHERE atom_set_id = %s AND file_id = 1",
                        (set_id,)).fetchone()[0] == 0


def test_an_unknown_license_is_null_with_its_source(conn, indexed) -> None:
    name, set_id, _ = indexed
    insert_file(conn, set_id, 30, [45, 46, 47, 48], license=None)
    rows = [r for r in sources(conn, name, [45, 46, 47], 48) if r[1] == "file"]
    assert [(r[2], r[7], r[8]) for r in rows] == [(30, None, "unknown")]


def test_memory_entries_give_the_generation_they_came_from(conn, indexed) -> None:
    name, _, _ = indexed
    context, generated = [11, 12, 13, 14], [15, 16, 17]
    (generation,) = conn.execute(
        "SELECT generation FROM remember(%s, %s, %s, 'exact', temperature => 0)", (name, context, generated)).fetchone()
    rows = [r for r in sources(conn, name, context + generated[:1], generated[1]) if r[1] == "memory"]
    assert rows and rows[0][9] == generation and rows[0][10] == 1 and rows[0][0] == generated[1]
    assert all(r[2] is None and r[3] is None for r in rows)
    assert [r for r in sources(conn, name, context + generated[:1], generated[1], memory=False) if r[1] == "memory"] == []


def test_verbatim_runs_of_twenty_tokens_name_the_file_line_and_license(conn, indexed) -> None:
    name, _, files = indexed
    rng = np.random.default_rng(7)
    passage = rng.integers(0, 50, 40).tolist()
    text = [49, 48] + passage[5:30] + [47, 49] + passage[:12]
    rows = conn.execute("SELECT start_index, length, file_id, path, line, license FROM store_verbatim(%s, %s)",
                        (text, name)).fetchall()
    assert len(rows) == 1
    start, length, file_id, path, line, license = rows[0]
    assert (start, length, file_id, license) == (2, 25, 3, "MIT")
    offset = next(i for i in range(len(files[3])) if files[3][i:i + 25] == passage[5:30])
    assert line == line_of(list(range(0, 400, 5)), offset)
    shorter = conn.execute("SELECT count(*) FROM store_verbatim(%s, %s, min_tokens => 26)", (text, name)).fetchone()[0]
    assert shorter == 0
    both = conn.execute("SELECT start_index, file_id FROM store_verbatim(%s, %s, 10, 5)", (text, name)).fetchall()
    assert both == [(2, 3), (2, 6), (29, 3), (29, 6)]


@pytest.mark.parametrize(("call", "argument"), [
    ("store_sources('{}'::int[], %(name)s)", "context"),
    ("store_sources(ARRAY[1, NULL], %(name)s)", "context"),
    ("store_sources(ARRAY[1, 50], %(name)s)", "context"),
    ("store_sources(ARRAY[1, -1], %(name)s)", "context"),
    ("store_sources(ARRAY[1, 2], %(name)s, 0)", "k"),
    ("store_sources(ARRAY[1, 2], %(name)s, 101)", "k"),
    ("store_sources(ARRAY[1, 2], %(name)s, NULL)", "k"),
    ("store_sources(ARRAY[1, 2], %(name)s, 5, 50)", "token"),
    ("store_sources(ARRAY[1, 2], %(name)s, 5, -3)", "token"),
    ("store_sources(ARRAY[1, 2], %(name)s, 5, 1, NULL)", "memory"),
    ("store_sources(ARRAY[1, 2], 'no such set')", "atom_set"),
    ("store_verbatim('{}'::int[], %(name)s)", "tokens"),
    ("store_verbatim(ARRAY[1, 99], %(name)s)", "tokens"),
    ("store_verbatim(ARRAY[1, 2], %(name)s, 1)", "min_tokens"),
    ("store_verbatim(ARRAY[1, 2], %(name)s, 257)", "min_tokens"),
    ("store_verbatim(ARRAY[1, 2], %(name)s, 20, 0)", "k"),
])
def test_bad_arguments_raise_22023_naming_them(conn, indexed, call: str, argument: str) -> None:
    name, _, _ = indexed
    with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
        conn.execute(f"SELECT * FROM {call}", {"name": name})
    assert str(error.value).startswith(argument)
    conn.rollback()


def test_the_reader_role_can_cite_and_cannot_write(reader_url: str, indexed_set) -> None:
    name, _, files = indexed_set
    context, token = files[4][100:106], files[4][106]
    with psycopg.connect(reader_url) as db:
        rows = db.execute(SOURCES, (context, name, 5, token, True)).fetchall()
        assert [(r[0], r[2], r[5], r[6]) for r in rows] == reference(files, context, token, 5)
        assert db.execute("SELECT count(*) FROM store_verbatim(%s, %s, 2)", (files[4][:30], name)).fetchone()[0] >= 1
        for statement in ("DELETE FROM atom_set_file_grams", "INSERT INTO atom_set_file_grams VALUES (1, 1, '{}')",
                          "UPDATE atom_set_files SET split = 'test'", "DELETE FROM atom_set_files"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(statement)
            db.rollback()
