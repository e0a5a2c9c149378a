"""Builds with soft atoms, a calibrated history weight and the random-positions control, into the
real database with the tiny model: what is stored, what was tuned on which half of the holdout,
the NumPy evaluator against SQL next_token with history atoms, and dropping a set with its control."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from hartonomous.atomset import drop_atom_set, load_atom_set
from hartonomous.corpus.origin import recorded_training_text
from hartonomous.errors import UserError
from hartonomous.splits import split_holdout
from projection.calibrate import nearest_atoms, score, with_history
from projection.distill import chunk_ids, distill, tokenize
from projection.history import HISTORY_GRID, TOP1_TOLERANCE, history_pairs, select_top1
from test_build import cli, corpus_file, one, options, run_build  # noqa: F401 (corpus_file is a fixture)
from tiny_model import tiny_model


@pytest.fixture(scope="module")
def soft_set(server_url: str, corpus_file):  # noqa: F811
    return run_build(server_url, options("tiny-soft", "context", corpus_file, window=3, decay=0.5, soft_k=4,
                                         controls=True, replace=True))


def test_soft_atoms_carry_the_exact_top_k_probabilities(server_url: str, soft_set) -> None:
    """Total atom weight = the sum of the exact top-k probabilities over every training position."""
    model, tokenizer = tiny_model(0)
    stats = soft_set.stats
    text = recorded_training_text(stats.corpus, stats.holdout.text).text
    chunks = chunk_ids(tokenize(tokenizer, text, stats.corpus.max_tokens)[0], stats.corpus.context_length)
    forced = distill(model, chunks, top_k=4)
    expected = sum(float(p[:-1].astype(np.float64).sum()) for p in forced.top_probs)
    total, count = one(server_url, """SELECT sum(weight), count(*) FROM atoms a
                                                 JOIN atom_sets s ON s.id = a.atom_set_id WHERE s.name = 'tiny-soft'""")
    assert total == pytest.approx(expected, rel=1e-6)
    # identical (key, token) pairs (window 3 over a small vocabulary repeats keys) merged, weights summed
    assert count == soft_set.atoms < stats.atoms.before_merge == sum(len(c) - 1 for c in chunks) * 4
    assert stats.distill.target == "soft" and stats.distill.soft_k == 4


def test_everything_is_tuned_on_the_calibration_half_and_both_halves_are_recorded(server_url: str,
                                                                                   soft_set) -> None:
    _, tokenizer = tiny_model(0)
    stats = soft_set.stats
    halves = split_holdout(stats.holdout.text)
    for split, text in ((stats.calibration_split, halves.calibration), (stats.test_split, halves.test)):
        chunks = chunk_ids(tokenize(tokenizer, text)[0], stats.corpus.context_length)
        assert (split.chars, split.tokens, split.positions) == (
            len(text), sum(map(len, chunks)), sum(len(c) - 1 for c in chunks))
    assert stats.bandwidth.positions == stats.calibration_split.positions
    assert stats.history["split"] == "calibration"


def test_the_history_weight_is_chosen_on_the_grid_and_written_to_the_set(server_url: str, soft_set) -> None:
    """The default criterion (top1): the best calibration top-1 over every (weight, h) point, near-ties
    by log-likelihood; every point is recorded in stats.history."""
    history = soft_set.stats.history
    assert [r["history_weight"] for r in history["grid"]] == list(HISTORY_GRID)
    assert history["criterion"] == "top1" and history["top1_tolerance"] == TOP1_TOLERANCE
    assert {c["history_weight"] for c in history["candidates"]} == set(HISTORY_GRID)
    best = select_top1(history["candidates"])
    weight, window, h = one(server_url, "SELECT history_weight, history_window, bandwidth FROM atom_sets "
                                        "WHERE name = 'tiny-soft'")
    assert (weight, window) == (best["history_weight"], 512) == (history["weight"], history["window"])
    assert h == pytest.approx(best["h"])
    assert (soft_set.stats.bandwidth.top1, soft_set.stats.bandwidth.log_likelihood) == pytest.approx(
        (best["top1"], best["log_likelihood"]))
    assert history["grid"][0]["h"] != history["grid"][-1]["h"]  # the bandwidth is re-fitted at each weight


def test_calibrate_by_loglik_keeps_the_previous_choice(server_url: str, corpus_file) -> None:  # noqa: F811
    built = run_build(server_url, options("tiny-loglik", "context", corpus_file, window=3, decay=0.5, soft_k=4,
                                          calibrate_by="loglik", replace=True))
    history = built.stats.history
    best = max(history["grid"], key=lambda r: (r["log_likelihood"], r["top1"], -r["history_weight"]))
    assert history["criterion"] == "loglik" and "candidates" not in history
    assert (history["weight"], built.bandwidth) == (best["history_weight"], pytest.approx(best["h"]))
    assert built.stats.bandwidth.log_likelihood == best["log_likelihood"]


def test_the_random_positions_control_has_the_same_labels_at_permuted_positions(server_url: str, soft_set) -> None:
    name = "tiny-soft.random-positions"
    assert soft_set.stats.controls.random_positions == name == soft_set.control.name
    with psycopg.connect(server_url) as conn:
        main, control = load_atom_set(conn, "tiny-soft"), load_atom_set(conn, name)

        def positions(set_id: int) -> np.ndarray:
            return np.array(conn.execute("SELECT ST_X(position), ST_Y(position), ST_Z(position) FROM tokens "
                                         "WHERE atom_set_id = %s ORDER BY token_id", (set_id,)).fetchall())

        def weight_by_token(set_id: int) -> dict[int, float]:
            return dict(conn.execute("SELECT token_id, sum(weight) FROM atoms WHERE atom_set_id = %s "
                                     "GROUP BY token_id", (set_id,)).fetchall())

        real, shuffled = positions(main.id), positions(control.id)
        assert not np.allclose(real, shuffled)
        assert sorted(map(tuple, real)) == sorted(map(tuple, shuffled))  # the same points, permuted
        assert weight_by_token(main.id) == pytest.approx(weight_by_token(control.id))
    assert not control.is_default  # a control never takes the default (whichever set had it keeps it)
    assert (control.centroid_window, control.centroid_decay) == (main.centroid_window, main.centroid_decay)
    assert control.projection == "random-positions" and control.stats.control_of["atom_set"] == "tiny-soft"
    assert [r["history_weight"] for r in control.stats.history["grid"]] == list(HISTORY_GRID)
    assert control.bandwidth == pytest.approx(control.stats.bandwidth.h)
    assert control.stats.calibration_split == main.stats.calibration_split


@pytest.mark.parametrize("history_weight,history_window", [(3.0, 512), (0.7, 4), (0.0, 512)])
def test_the_numpy_evaluator_is_sql_next_token_with_history_atoms(server_url: str, soft_set, history_weight,
                                                                   history_window) -> None:
    """Every stored atom as a neighbour (so no tie at the K boundary can differ), T = 1, no top-k/top-p."""
    _, tokenizer = tiny_model(0)
    stats = soft_set.stats
    chunk = chunk_ids(tokenize(tokenizer, split_holdout(stats.holdout.text).calibration)[0],
                      stats.corpus.context_length)[0]
    with psycopg.connect(server_url) as conn:
        record = load_atom_set(conn, "tiny-soft")
        atoms = np.array(conn.execute("SELECT ST_X(position), ST_Y(position), ST_Z(position), token_id, weight "
                                      "FROM atoms WHERE atom_set_id = %s", (record.id,)).fetchall())
        tokens = np.array(conn.execute("SELECT ST_X(position), ST_Y(position), ST_Z(position) FROM tokens "
                                       "WHERE atom_set_id = %s ORDER BY token_id", (record.id,)).fetchall())
        from hartonomous.centroid import prefix_centroids
        queries = prefix_centroids(tokens[chunk], record.centroid_window, record.centroid_decay)[:-1]
        pairs = history_pairs([chunk], tokens, record.centroid_window, record.centroid_decay, history_window)
        nb = with_history(nearest_atoms(atoms[:, :3], atoms[:, 3].astype(int), atoms[:, 4], queries, k=len(atoms)),
                          pairs.query, pairs.tokens, pairs.distances)
        for t in (0, 1, 6, len(chunk) - 2):
            rows = conn.execute("SELECT token_id, probability FROM next_token(%s, 1.0, 0, 1.0, NULL, %s, 'tiny-soft', "
                                "1.0, %s, %s)", (chunk[:t + 1].tolist(), len(atoms), history_weight,
                                                 history_window)).fetchall()
            for token_id, probability in rows[:12]:
                targets = np.zeros(len(queries), dtype=np.int64)
                targets[t] = token_id
                s = score(nb, targets, record.bandwidth, record.kernel, len(tokens), smoothing=0.0,
                          history_weight=history_weight)
                assert np.exp(s.log_probs[t]) == pytest.approx(probability, rel=1e-9, abs=1e-12)
            assert s.argmax[t] == rows[0][0]


def test_dropping_a_set_drops_its_control(server_url: str, corpus_file) -> None:  # noqa: F811
    run_build(server_url, options("tiny-dropped", "context", corpus_file, soft_k=2, controls=True,
                                  history_weight=1.0, replace=True))
    assert one(server_url, "SELECT history_weight FROM atom_sets WHERE name = 'tiny-dropped'")[0] == 1.0
    with psycopg.connect(server_url) as conn:
        assert drop_atom_set(conn, "tiny-dropped") == ["tiny-dropped.random-positions"]
    assert one(server_url, "SELECT count(*) FROM atom_sets WHERE name LIKE 'tiny-dropped%%'")[0] == 0


def test_bad_soft_history_and_control_options_are_user_errors(server_url: str, corpus_file) -> None:  # noqa: F811
    for bad, match in ((dict(soft_k=0), "--soft-k"), (dict(soft_k=65), "--soft-k"), (dict(target="x"), "--target"),
                       (dict(history_weight=-1.0), "--history-weight"),
                       (dict(history_weight=float("nan")), "--history-weight"),
                       (dict(history_window=5000), "--history-window"), (dict(calibrate_by="x"), "--calibrate-by"), (dict(history_window=-1), "--history-window"),
                       (dict(kind="token", controls=True), "--controls"),
                       (dict(name="n" * 60, controls=True), "too long for --controls")):
        with pytest.raises(UserError, match=match):
            run_build(server_url, options(bad.pop("name", "bad"), bad.pop("kind", "context"), corpus_file, **bad))


def test_cli_builds_with_history_off_and_controls_then_drops_both(server_url: str, corpus_file, tmp_path) -> None:  # noqa: F811
    model, tokenizer = tiny_model(0)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    done = cli("build", "--name", "cli-hist", "--model", str(tmp_path / "tiny"), "--corpus", str(corpus_file),
               "--landmarks", "32", "--max-tokens", "2000", "--holdout-chars", "1500", "--context-length", "64",
               "--device", "cpu", "--soft-k", "3", "--history-weight", "0", "--history-window", "64", "--controls",
               "--replace", url=server_url)
    assert done.returncode == 0, done.stderr
    assert "history" in done.stdout and "cli-hist.random-positions" in done.stdout
    assert one(server_url, "SELECT history_weight, history_window FROM atom_sets WHERE name = 'cli-hist'") == (0.0, 64)
    dropped = cli("atom-sets", "drop", "cli-hist", url=server_url)
    assert dropped.returncode == 0 and "cli-hist.random-positions" in dropped.stdout
    assert one(server_url, "SELECT count(*) FROM atom_sets WHERE name LIKE 'cli-hist%%'")[0] == 0
    bad = cli("build", "--name", "x", "--soft-k", "0", url=server_url)
    assert bad.returncode == 1 and bad.stderr.startswith("error: --soft-k must be") and len(bad.stderr.splitlines()) == 1


def test_a_rebuild_and_compare_labels_read_the_builds_teacher_labels(server_url: str, corpus_file,  # noqa: F811
                                                                     tmp_path) -> None:
    """The build stores its teacher pass in the teacher-label cache; a re-build with other calibration
    reads every label from it, and compare's n-gram labels (teacher.argmax_labels over the same
    training tokens, in chunks of the build's context length) find them there too."""
    from hartonomous.corpus.teacher import argmax_labels

    first = run_build(server_url, options("tiny-cached", "context", corpus_file, soft_k=2, teacher_cache=tmp_path,
                                          replace=True))
    assert first.stats.distill.cached_tokens == 0 and any(tmp_path.rglob("*.npz"))
    again = run_build(server_url, options("tiny-cached", "context", corpus_file, soft_k=2, teacher_cache=tmp_path,
                                          calibrate_by="loglik", replace=True))
    assert again.stats.distill.cached_tokens == again.stats.distill.tokens == first.stats.distill.tokens
    assert again.stats.distill.tokens_per_second is None
    model, tokenizer = tiny_model(0)
    text = recorded_training_text(again.stats.corpus, again.stats.holdout.text).text
    ids = tokenize(tokenizer, text, again.stats.corpus.max_tokens)[0]
    context = again.stats.corpus.context_length
    whole = len(ids) - len(ids) % context               # the full chunks: the ones the build labelled
    entries = len(list(tmp_path.rglob("*.npz")))
    labels = argmax_labels(model, ids[:whole], window=context, cache_dir=tmp_path)
    assert len(list(tmp_path.rglob("*.npz"))) == entries   # nothing new was run and stored
    forced = distill(model, chunk_ids(ids[:whole], context))
    assert labels.tolist() == np.concatenate(forced.argmax).tolist()
