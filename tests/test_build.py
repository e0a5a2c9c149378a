"""Builds end to end into the real database with the tiny model: token and context sets, the
SQL centroid against the Python one, interrupted ingests, and the CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psycopg
import pytest

from hartonomous.centroid import context_centroid as py_centroid
from hartonomous.errors import UserError
from hartonomous.atomset import write as ingest
from projection.build import BuildOptions, build
from hartonomous.corpus.sources import load_corpus
from hartonomous.corpus.origin import recorded_training_text, sha256_file, sha256_text
from projection.distill import chunk_ids, distill, tokenize
from projection.project import load_projector
from tiny_model import tiny_model

REPO = Path(__file__).resolve().parents[1]
SENTENCES = [
    "The capital of France is Paris.", "The capital of Italy is Rome.", "Return the sum of the numbers.",
    "Raise ValueError if the list is empty.", "def add(a, b): return a + b", "héllo wörld, 東京 🙂",
    "Return a new list with the items sorted.", "The value of the flag is True.",
]


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> Path:
    """80 short paragraphs of mixed sentences, deterministic."""
    rng = np.random.default_rng(0)
    paragraphs = [" ".join(rng.choice(SENTENCES, size=4)) for _ in range(80)]
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n\n".join(paragraphs), encoding="utf-8")
    return path


def options(name: str, kind: str, corpus_path: Path, **extra) -> BuildOptions:
    base = dict(name=name, kind=kind, model="tiny", corpus=[corpus_path], max_tokens=3000, landmarks=32,
                holdout_chars=1500, context_length=64, batch_tokens=512)
    return BuildOptions(**{**base, **extra})


def run_build(url: str, opts: BuildOptions):
    model, tokenizer = tiny_model(0)
    with psycopg.connect(url) as conn:
        return build(conn, opts, model=model, tokenizer=tokenizer)


def one(url: str, sql: str, *params):
    with psycopg.connect(url) as conn:
        return conn.execute(sql, params).fetchone()


def atom_tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute(
            "SELECT relname FROM pg_class WHERE relname ~ '^atoms_[0-9]+$' AND relkind = 'r'").fetchall()}


@pytest.fixture(scope="module")
def token_set(server_url: str, corpus_file: Path):
    return run_build(server_url, options("tiny-token", "token", corpus_file, replace=True))


@pytest.fixture(scope="module")
def context_set(server_url: str, corpus_file: Path):
    return run_build(server_url, options("tiny-context", "context", corpus_file, window=3, decay=0.5,
                                         full_keys=True, replace=True, target="argmax"))


def test_token_build_writes_every_token_as_an_atom(server_url: str, token_set) -> None:
    model, _ = tiny_model(0)
    vocab = model.config.vocab_size
    assert token_set.atoms == vocab and token_set.tokens == vocab
    count, tokens, landmarks, window, decay, h, kind = one(
        server_url, """SELECT (SELECT count(*) FROM atoms WHERE atom_set_id = s.id),
                              (SELECT count(*) FROM tokens WHERE atom_set_id = s.id),
                              (SELECT count(*) FROM landmarks WHERE atom_set_id = s.id),
                              centroid_window, centroid_decay, bandwidth, kind
                         FROM atom_sets s WHERE name = 'tiny-token'""")
    assert (count, tokens, landmarks, window, decay, kind) == (vocab, vocab, 32, None, 1.0, "token")
    assert h == pytest.approx(token_set.stats.bandwidth.h) and h > 0
    stats = one(server_url, "SELECT stats FROM atom_sets WHERE name = 'tiny-token'")[0]
    assert 0 <= stats["projection"]["trustworthiness"] <= 1 and 0 <= stats["projection"]["recall_at_10"] <= 1
    assert len(stats["bandwidth"]["curve"]) > 20
    assert stats["holdout"]["text"] and stats["holdout"]["source"]
    assert stats["ingest"]["atoms"] == vocab


def test_context_build_keeps_every_position_as_weight(server_url: str, context_set, corpus_file: Path) -> None:
    stats = context_set.stats
    positions = stats.atoms.before_merge
    total_weight, count, keyed, dim = one(
        server_url, """SELECT sum(weight), count(*), count(key), max(vector_dims(key)) FROM atoms a
                        JOIN atom_sets s ON s.id = a.atom_set_id WHERE s.name = 'tiny-context'""")
    assert total_weight == pytest.approx(positions)
    assert count == context_set.atoms < positions  # window 3 over a small vocabulary repeats (key, value)
    assert keyed == count and dim == tiny_model(0)[0].config.hidden_size
    holdout = stats.holdout.text
    text = recorded_training_text(stats.corpus, holdout).text   # rebuilt from the recorded files and sha256
    assert stats.corpus.text is None and stats.corpus.train_sha256 == sha256_text(text)
    assert stats.corpus.files == [str(corpus_file.resolve())] and stats.corpus.sha256 == [sha256_file(corpus_file)]
    train = tokenize(tiny_model(0)[1], text, stats.corpus.max_tokens)[1]   # what the build's tokens cover
    assert holdout and holdout not in train
    assert all(p not in train for p in holdout.split("\n\n"))


def test_context_atoms_sit_where_sql_puts_their_context(server_url: str, context_set, corpus_file: Path) -> None:
    """The key of a training position is SQL context_centroid of its context, value = the exact argmax."""
    model, tokenizer = tiny_model(0)
    opts = options("tiny-context", "context", corpus_file)
    corpus = load_corpus(opts.corpus, opts.max_tokens, opts.holdout_chars, opts.seed)
    chunks = chunk_ids(tokenize(tokenizer, corpus.train_text, opts.max_tokens)[0], opts.context_length)
    labels = distill(model, chunks[:2])
    with psycopg.connect(server_url) as conn:
        set_id = conn.execute("SELECT id FROM atom_sets WHERE name = 'tiny-context'").fetchone()[0]
        for c, chunk in enumerate(chunks[:2]):
            for t in (0, 1, 5, 40):
                context = chunk[: t + 1].tolist()
                rows = conn.execute(
                    """SELECT a.token_id, a.position <<->> c.p FROM atoms a,
                              (SELECT context_centroid(%s, 'tiny-context') AS p) c
                        WHERE a.atom_set_id = %s AND a.position <<->> c.p < 1e-9""",
                    (context, set_id)).fetchall()
                assert int(labels.argmax[c][t]) in {r[0] for r in rows}


def test_python_centroid_equals_sql_context_centroid(server_url: str, token_set, context_set) -> None:
    rng = np.random.default_rng(1)
    with psycopg.connect(server_url) as conn:
        for name, window, decay in (("tiny-token", None, 1.0), ("tiny-context", 3, 0.5)):
            positions = np.array(conn.execute(
                """SELECT ST_X(position), ST_Y(position), ST_Z(position) FROM tokens t
                     JOIN atom_sets s ON s.id = t.atom_set_id WHERE s.name = %s ORDER BY token_id""",
                (name,)).fetchall())
            for length in (1, 2, 3, 7, 40):
                context = rng.integers(0, len(positions), length).tolist()
                sql = conn.execute("SELECT ST_X(c), ST_Y(c), ST_Z(c) FROM context_centroid(%s, %s) c",
                                   (context, name)).fetchone()
                assert np.array(sql) == pytest.approx(py_centroid(positions[context], window, decay),
                                                      rel=1e-12, abs=1e-12)


def test_next_token_answers_from_both_sets(server_url: str, token_set, context_set) -> None:
    with psycopg.connect(server_url) as conn:
        for name in ("tiny-token", "tiny-context"):
            rows = conn.execute("SELECT token_id, probability, cumulative_probability "
                                "FROM next_token(ARRAY[5, 17, 42], top_k => 0, top_p => 1, atom_set => %s)",
                                (name,)).fetchall()
            assert rows and rows[-1][2] == pytest.approx(1.0)
            assert sum(r[1] for r in rows) == pytest.approx(1.0)


def test_calibration_scores_the_distribution_sql_next_token_returns(server_url: str, context_set) -> None:
    """The bandwidth is calibrated on exactly what next_token computes (all atoms as neighbours,
    so no tie at the K boundary can differ)."""
    from projection.calibrate import nearest_atoms, score

    with psycopg.connect(server_url) as conn:
        set_id, h, window, decay = conn.execute("SELECT id, bandwidth, centroid_window, centroid_decay "
                                                "FROM atom_sets WHERE name = 'tiny-context'").fetchone()
        atoms = np.array(conn.execute("SELECT ST_X(position), ST_Y(position), ST_Z(position), token_id, weight "
                                      "FROM atoms WHERE atom_set_id = %s", (set_id,)).fetchall())
        tokens = np.array(conn.execute("SELECT ST_X(position), ST_Y(position), ST_Z(position) FROM tokens "
                                       "WHERE atom_set_id = %s ORDER BY token_id", (set_id,)).fetchall())
        rng = np.random.default_rng(2)
        for _ in range(5):
            context = rng.integers(0, len(tokens), 6).tolist()
            sql = conn.execute("SELECT token_id, probability FROM next_token(%s, 1.0, 0, 1.0, NULL, %s, "
                               "'tiny-context')", (context, len(atoms))).fetchall()
            query = py_centroid(tokens[context], window, decay)[None]
            nb = nearest_atoms(atoms[:, :3], atoms[:, 3].astype(int), atoms[:, 4], query, k=len(atoms))
            for token_id, probability in sql[:10]:
                s = score(nb, np.array([token_id]), h, "gaussian", len(tokens), smoothing=0.0)
                assert np.exp(s.log_probs[0]) == pytest.approx(probability, rel=1e-9, abs=1e-12)
            assert s.argmax[0] == sql[0][0]


def test_stored_landmarks_project_new_vectors_like_the_build(server_url: str, token_set) -> None:
    with psycopg.connect(server_url) as conn:
        set_id, params = conn.execute(
            "SELECT id, projection_params FROM atom_sets WHERE name = 'tiny-token'").fetchone()
        marks = np.array([json.loads(r[0]) for r in conn.execute(  # float4 text -> float32 is exact
            "SELECT embedding::text FROM landmarks WHERE atom_set_id = %s ORDER BY landmark_id", (set_id,))], dtype=np.float32)
        rows = conn.execute("SELECT embedding::text, ST_X(position), ST_Y(position), ST_Z(position) "
                            "FROM tokens WHERE atom_set_id = %s ORDER BY token_id LIMIT 50", (set_id,)).fetchall()
    projector = load_projector(params, marks)
    embeddings = np.array([json.loads(r[0]) for r in rows], dtype=np.float32)
    assert projector.transform(embeddings) == pytest.approx(np.array([r[1:] for r in rows]), abs=1e-9)


def test_sweep_keeps_the_best_held_out_window_and_decay(server_url: str, corpus_file: Path) -> None:
    from projection.sweep import CANDIDATES

    result = run_build(server_url, options("tiny-sweep", "context", corpus_file, sweep=True, replace=True,
                                           bandwidth_objective="top1"))
    rows = result.stats.centroid_sweep
    assert [(r["window"], r["decay"]) for r in rows] == CANDIDATES
    best = max(rows, key=lambda r: (r["top1"], r["log_likelihood"]))
    stored = one(server_url, "SELECT centroid_window, centroid_decay, bandwidth FROM atom_sets WHERE name = 'tiny-sweep'")
    assert stored == (best["window"], best["decay"], pytest.approx(best["h"]))
    assert result.stats.bandwidth.top1 == best["top1"] == result.stats.bandwidth.best_top1["top1"]


def test_bad_options_are_user_errors_before_any_work(server_url: str, corpus_file: Path) -> None:
    for bad, match in ((dict(kind="bogus"), "--kind"), (dict(decay=0.0), "--decay"), (dict(window=0), "window"),
                       (dict(name="has space"), "--name"), (dict(max_neighbors=0), "--max-neighbors"),
                       (dict(corpus=[Path("/nonexistent.txt")]), "corpus file '/nonexistent.txt' does not exist"),
                       (dict(bandwidth_objective="bogus"), "--bandwidth-objective")):
        with pytest.raises(UserError, match=match):
            run_build(server_url, options(bad.pop("name", "bad"), bad.pop("kind", "context"), corpus_file, **bad))


def test_existing_name_needs_replace(server_url: str, token_set, corpus_file: Path) -> None:
    with pytest.raises(UserError, match="already exists"):
        run_build(server_url, options("tiny-token", "token", corpus_file))


def test_a_failure_mid_copy_leaves_nothing_and_keeps_the_old_set(server_url: str, corpus_file: Path,
                                                                  monkeypatch) -> None:
    first = run_build(server_url, options("tiny-interrupted", "context", corpus_file, replace=True, window=3))
    before_tables = atom_tables(server_url)
    real = ingest.fixed_width_payload
    calls = {"n": 0}

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # the landmarks COPY is call 1; atom chunks follow
            raise RuntimeError("injected failure in the middle of COPY")
        return real(*args, **kwargs)

    monkeypatch.setattr(ingest, "COPY_CHUNK_ROWS", 100)
    monkeypatch.setattr(ingest, "fixed_width_payload", failing)
    with pytest.raises(RuntimeError, match="injected"):
        run_build(server_url, options("tiny-interrupted", "context", corpus_file, replace=True, window=2))
    assert calls["n"] == 3
    monkeypatch.undo()
    set_id, atoms, window = one(server_url, """SELECT s.id, (SELECT count(*) FROM atoms WHERE atom_set_id = s.id),
                                                      centroid_window FROM atom_sets s
                                                WHERE name = 'tiny-interrupted'""")
    assert (set_id, atoms, window) == (first.atom_set_id, first.atoms, 3)  # the old set, untouched
    assert atom_tables(server_url) == before_tables
    again = run_build(server_url, options("tiny-interrupted", "context", corpus_file, replace=True, window=2))
    assert one(server_url, "SELECT centroid_window FROM atom_sets WHERE name = 'tiny-interrupted'")[0] == 2
    assert f"atoms_{first.atom_set_id}" not in atom_tables(server_url)
    assert f"atoms_{again.atom_set_id}" in atom_tables(server_url)


def test_a_build_whose_gate_fails_keeps_the_set_without_a_gate_and_says_so(server_url: str,
                                                                          corpus_file: Path) -> None:
    """The gate is fitted after the ingest committed: a failure there (the server refuses the gate's
    write) keeps the set, which every path but the augmented one serves, and the one-line error
    says that it is kept, without a gate, and how to fit one or drop the set."""
    from hartonomous.augment.gates import load_gate

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION refuse_gate_in_test() RETURNS trigger LANGUAGE plpgsql AS "
                     "$$BEGIN RAISE EXCEPTION USING ERRCODE = '53100', MESSAGE = 'no space left for the gate'; END$$")
        conn.execute("CREATE TRIGGER refuse_gate_in_test BEFORE INSERT ON augment_gates "
                     "FOR EACH ROW EXECUTE FUNCTION refuse_gate_in_test()")
    try:
        with pytest.raises(UserError) as failed:
            run_build(server_url, options("tiny-gate-failed", "context", corpus_file, target="corpus", replace=True))
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute("DROP TRIGGER refuse_gate_in_test ON augment_gates")
            conn.execute("DROP FUNCTION refuse_gate_in_test()")
    message = str(failed.value)
    assert "\n" not in message and "no space left for the gate" in message
    assert "'tiny-gate-failed'" in message and "kept without a gate" in message
    assert "hartonomous gate fit tiny-gate-failed" in message and "hartonomous atom-sets drop tiny-gate-failed" in message
    set_id, atoms, gates = one(server_url, """SELECT s.id, (SELECT count(*) FROM atoms WHERE atom_set_id = s.id),
                                                     (SELECT count(*) FROM augment_gates WHERE atom_set_id = s.id)
                                                FROM atom_sets s WHERE name = 'tiny-gate-failed'""")
    assert atoms > 0 and gates == 0
    assert f"{atoms:,} atoms" in message
    with psycopg.connect(server_url) as conn:
        assert conn.execute("SELECT count(*) FROM next_token(ARRAY[1, 2, 3], atom_set => 'tiny-gate-failed')"
                            ).fetchone()[0] > 0                      # the kept set serves
        with pytest.raises(UserError, match="hartonomous gate fit tiny-gate-failed"):
            load_gate(conn, "tiny-gate-failed")                      # the augmented path says what to do


KILLED_BUILD = """
import sys, time, numpy as np, psycopg
from hartonomous.atomset import write as ingest
from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
if sys.argv[2] == "copy":  # small, slow COPY chunks, so that the kill lands in the middle of the COPY
    ingest.COPY_CHUNK_ROWS, real = 20_000, ingest.fixed_width_payload
    def slow(*args, **kwargs):
        print("copy chunk", flush=True)
        time.sleep(0.2)
        return real(*args, **kwargs)
    ingest.fixed_width_payload = slow
rng = np.random.default_rng(0)
n, vocab = 400_000, 1000
tokens = TokenRows(np.arange(vocab), [None] * vocab, rng.normal(size=(vocab, 3)))
atoms = AtomRows(rng.integers(0, vocab, n), rng.normal(size=(n, 3)))
with psycopg.connect(sys.argv[1], application_name="ht-test-killed-build") as conn:
    write_atom_set(conn, AtomSetSpec("killed-" + sys.argv[2], "synthetic", vocab, 3, "none", "context"), tokens,
                   atoms, progress=lambda m: print(m, flush=True))
print("finished", flush=True)
"""


COPY_PROGRESS = ("SELECT coalesce(max(p.tuples_processed), 0) FROM pg_stat_progress_copy p "
                 "JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'ht-test-killed-build'")


@pytest.mark.parametrize("phase", ["copy", "index"])
def test_a_killed_build_leaves_nothing_and_the_next_build_succeeds(server_url: str, corpus_file: Path,
                                                                   phase: str) -> None:
    """SIGKILL during the atoms' COPY (rows already sent) or during the GiST index build."""
    before_tables = atom_tables(server_url)
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, server_url, phase], stdout=subprocess.PIPE,
                            text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        chunks = 0
        for line in proc.stdout:
            chunks += line.startswith("copy chunk")
            if (phase == "copy" and chunks == 3) or (phase == "index" and line.startswith("building the GiST")):
                break
        else:
            pytest.fail(f"the build subprocess ended before the {phase} phase")
        if phase == "copy":
            deadline = time.monotonic() + 60
            while one(server_url, COPY_PROGRESS)[0] == 0:   # rows have reached the server: mid-COPY
                assert time.monotonic() < deadline, "no COPY in progress"
                time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert one(server_url, "SELECT count(*) FROM atom_sets WHERE name = %s", f"killed-{phase}")[0] == 0
    deadline = time.monotonic() + 180  # the server aborts the transaction once it sees the client gone
    while one(server_url, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'ht-test-killed-build'")[0]:
        assert time.monotonic() < deadline, "the killed build's transaction is still open"
        time.sleep(0.5)
    assert atom_tables(server_url) == before_tables
    assert one(server_url, "SELECT count(*) FROM atom_sets WHERE name = %s", f"killed-{phase}")[0] == 0
    result = run_build(server_url, options(f"killed-{phase}", "token", corpus_file))
    assert one(server_url, "SELECT count(*) FROM atoms WHERE atom_set_id = %s", result.atom_set_id)[0] == result.atoms


def test_the_ingest_shows_the_copy_and_the_index_build_as_bars(server_url: str) -> None:
    """Two bars: atoms sent by the COPY, then heap blocks the GiST build has scanned, followed
    while the build runs (from a second connection) and complete when it ends."""
    from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
    rng = np.random.default_rng(1)
    n, vocab = 400_000, 1000
    bars: dict[str, tuple[int, list[int]]] = {}

    @contextmanager
    def bar(description: str, total: int, unit: str):
        steps: list[int] = []
        bars[description] = (total, steps)
        yield steps.append

    with psycopg.connect(server_url) as conn:
        write_atom_set(conn, AtomSetSpec("progress-bars", "synthetic", vocab, 3, "none", "context"),
                       TokenRows(np.arange(vocab), [None] * vocab, rng.normal(size=(vocab, 3))),
                       AtomRows(rng.integers(0, vocab, n), rng.normal(size=(n, 3))), replace=True, bar=bar)
    heap = one(server_url, "SELECT pg_relation_size(('atoms_' || id)::regclass) / 8192 FROM atom_sets "
                           "WHERE name = 'progress-bars'")[0]
    assert list(bars) == ["COPY atoms", "GiST nd index (heap scan)"]
    copy_total, copy_steps = bars["COPY atoms"]
    assert copy_total == n and sum(copy_steps) == n and len(copy_steps) == -(-n // ingest.COPY_CHUNK_ROWS)
    index_total, index_steps = bars["GiST nd index (heap scan)"]
    assert index_total == heap > 0 and sum(index_steps) == heap
    assert len(index_steps) >= 2 and all(step > 0 for step in index_steps), "no progress seen mid-build"


def cli(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hartonomous.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=600, env={**os.environ, "HARTONOMOUS_DATABASE_URL": url,
                                                      "COLUMNS": "200"})


def test_cli_build_list_default_drop(server_url: str, corpus_file: Path, tmp_path: Path) -> None:
    model, tokenizer = tiny_model(0)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    done = cli("build", "--name", "cli-tiny", "--kind", "context", "--model", str(tmp_path / "tiny"),
               "--corpus", str(corpus_file), "--landmarks", "32", "--max-tokens", "2000",
               "--holdout-chars", "1500", "--context-length", "64", "--device", "cpu", url=server_url)
    assert done.returncode == 0, done.stderr
    assert "held-out top-1" in done.stdout and "teacher forcing" in done.stdout
    listed = json.loads(cli("atom-sets", "--json", url=server_url).stdout)
    row = {r["name"]: r for r in listed}["cli-tiny"]
    assert row["kind"] == "context" and row["atoms"] > 0 and row["bandwidth"] > 0
    assert 0 <= row["trustworthiness"] <= 1 and 0 <= row["recall_at_10"] <= 1
    table = cli("atom-sets", url=server_url).stdout
    assert "cli-tiny" in table and "trustworthiness" in table
    assert cli("atom-sets", "default", "cli-tiny", url=server_url).returncode == 0
    assert one(server_url, "SELECT is_default FROM atom_sets WHERE name = 'cli-tiny'")[0] is True
    assert cli("atom-sets", "drop", "cli-tiny", url=server_url).returncode == 0
    assert one(server_url, "SELECT count(*) FROM atom_sets WHERE name = 'cli-tiny'")[0] == 0
    for args, message in ((("atom-sets", "drop", "cli-tiny"), "error: no atom set named 'cli-tiny'"),
                          (("build", "--name", "x", "--window", "-2"), "error: --window must be")):
        bad = cli(*args, url=server_url)
        assert bad.returncode == 1 and bad.stderr.startswith(message), bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1


def test_mixed_labels_are_soft_on_the_first_chunks_and_counts_after(server_url: str, corpus_file: Path) -> None:
    """--target mixed: the teacher labels the first chunks (soft top-k mass, one per position), the
    corpus the rest (weight 1 each); identical (key, token) atoms merge, so the total weight is the
    soft mass plus the corpus positions, and the stats say where the cut fell."""
    result = run_build(server_url, options("tiny-mixed", "context", corpus_file, target="mixed", teacher_tokens=200,
                                           soft_k=4, replace=True))
    distill = result.stats.distill
    assert distill.target == "mixed" and distill.soft_k == 4
    assert 200 <= distill.teacher_tokens < 200 + 64              # whole chunks of --context-length 64
    train = result.stats.corpus.train_tokens
    chunks = -(-train // 64)
    taught_chunks = distill.teacher_tokens // 64
    (total,) = one(server_url, "SELECT sum(weight) FROM atoms a JOIN atom_sets s ON s.id = a.atom_set_id "
                               "WHERE s.name = 'tiny-mixed'")
    corpus_positions = train - distill.teacher_tokens - (chunks - taught_chunks)
    taught_positions = distill.teacher_tokens - taught_chunks
    soft_mass = total - corpus_positions          # each taught position adds its top-k probabilities, at most 1
    assert 0 < soft_mass <= taught_positions * (1 + 1e-6)      # (the tiny model spreads its mass thin)
    assert result.stats.stage_seconds["label"] > 0 and result.stats.ingest.disk_bytes > 0


def test_lattice_builds_key_every_token_on_its_own_cell(server_url: str, corpus_file: Path) -> None:
    result = run_build(server_url, options("tiny-lattice", "context", corpus_file, target="corpus",
                                           positions="lattice", replace=True))
    assert (result.window, result.kind) == (8, "context")
    with psycopg.connect(server_url) as conn:
        kernel, decay, projection = conn.execute("SELECT kernel, centroid_decay, projection FROM atom_sets "
                                                 "WHERE name = 'tiny-lattice'").fetchone()
        cells = conn.execute("SELECT count(DISTINCT (ST_X(t.position), ST_Y(t.position), ST_Z(t.position))), "
                             "count(*), bool_and(ST_X(t.position) = round(ST_X(t.position))) FROM tokens t "
                             "JOIN atom_sets s ON s.id = t.atom_set_id WHERE s.name = 'tiny-lattice'").fetchone()
    assert (kernel, projection) == ("backoff", "lattice") and decay == result.decay < 1
    assert cells[0] == cells[1] == result.tokens and cells[2]


def test_code_corpora_get_deep_keys_by_default_and_prose_keeps_gaussian_keys(tmp_path: Path) -> None:
    """The default keys per corpus kind (docs/fidelity.md, "Default keys per corpus"): lattice
    positions and the backoff kernel for context sets of code, the window-3 Gaussian keys for the
    rest, and any option that belongs to the Gaussian keys keeps them."""
    from projection.options import BuildOptions, code_corpus

    code_dir = tmp_path / "src"
    code_dir.mkdir()
    script = tmp_path / "tool.py"
    script.write_text("print(1)\n")
    notes = tmp_path / "notes.txt"
    notes.write_text("words\n")
    assert code_corpus([Path("python-source")], []) and code_corpus([script], [])
    assert code_corpus([code_dir], ["*.py"]) and code_corpus([code_dir, script], ["*.py", "pkg/*.py"])
    assert not code_corpus([], []) and not code_corpus([Path("python-docstrings")], [])
    assert not code_corpus([notes], []) and not code_corpus([code_dir], []) and not code_corpus([code_dir], ["*.txt"])
    assert not code_corpus([script, notes], [])

    code = BuildOptions(name="c", corpus=[Path("python-source")])
    assert (code.positions, code.kernel, code.resolved_window()) == ("lattice", "backoff", 8)
    for prose in (BuildOptions(name="p"), BuildOptions(name="p", corpus=[notes])):
        assert (prose.positions, prose.kernel, prose.resolved_window()) == ("projection", "gaussian", 3)
    for keeps_gaussian_keys in (dict(window=4), dict(decay=0.1), dict(sweep=True), dict(kernel="gaussian"),
                                dict(kind="token"), dict(positions="projection")):
        options = BuildOptions(name="c", corpus=[Path("python-source")], **keeps_gaussian_keys)
        assert options.positions == "projection", keeps_gaussian_keys
    assert BuildOptions(name="c", corpus=[script], kernel="backoff").positions == "lattice"
