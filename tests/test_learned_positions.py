"""Learned token positions (projection/learned.py) on synthetic corpora whose answer is known by
construction, and `build --positions learned` end to end with the tiny model.

The synthetic language: 40 tokens in two classes, A = 0..19 and B = 20..39; after an A token the
next token is uniform over B, after a B token uniform over A (the "exact model's" soft labels are
exactly that). Contexts are the last two tokens. Training text uses only the pairs (a, b) with
a + b not divisible by 3, the calibration and test texts only the others: every held-out context
is unseen, and can only be predicted by borrowing from contexts whose last token is of the same
class. Random positions cannot do that; positions that put each class together can.
"""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from hartonomous.atomset import load_atom_set
from hartonomous.corpus.origin import recorded_training_text
from hartonomous.errors import UserError
from projection import calibrate as cal
from projection.atoms import context_keys
from projection.learned import Settings, Validation, context_centroids, distinct_contexts, learn, validate
from test_build import cli, corpus_file, options, run_build  # noqa: F401 (corpus_file is a fixture)
from tiny_model import tiny_model

V, HALF, WINDOW, DECAY = 40, 20, 2, 0.5


def walk(rng: np.random.Generator, n: int, seen: bool) -> np.ndarray:
    """n tokens alternating between the classes; pairs with (a + b) % 3 != 0 iff `seen`."""
    seq = [int(rng.integers(0, V))]
    while len(seq) < n:
        last = seq[-1]
        nxt = int(rng.integers(HALF, V) if last < HALF else rng.integers(0, HALF))
        if ((last + nxt) % 3 != 0) == seen:
            seq.append(nxt)
    return np.array(seq)


def soft_labels(chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The exact distribution after every token: uniform over the other class."""
    ids = np.array([np.arange(HALF, V) if t < HALF else np.arange(HALF) for t in chunk])
    return ids, np.full(ids.shape, 1.0 / HALF)


@pytest.fixture(scope="module")
def synthetic():
    rng = np.random.default_rng(0)
    train = [walk(rng, 64, seen=True) for _ in range(30)]
    labels = [soft_labels(c) for c in train]
    contexts = distinct_contexts(train, [i for i, _ in labels], [p for _, p in labels], WINDOW, V)
    calibration = [walk(rng, 64, seen=False) for _ in range(4)]
    validation = Validation(calibration, np.concatenate([c[1:] for c in calibration]))
    test = [walk(rng, 64, seen=False) for _ in range(4)]
    random_positions = rng.normal(size=(V, 3))
    result = learn(random_positions, contexts, validation,
                   Settings(window=WINDOW, decay=DECAY, epochs=12, learning_rate=0.05, patience=12))
    return contexts, validation, test, random_positions, result


def class_mass(contexts, positions: np.ndarray, chunks: list[np.ndarray], h: float) -> float:
    """Mean probability the kernel prediction (100 nearest atoms, bandwidth h) puts on the right class."""
    keys = context_centroids(positions, contexts.ids, DECAY)
    queries = context_keys(chunks, positions, WINDOW, DECAY)
    nb = cal.nearest_atoms(keys[contexts.pair_context], contexts.pair_token, contexts.pair_weight, queries, 100)
    log_k = nb.log_weights - (nb.distances / h) ** 2
    log_k -= np.maximum.reduceat(log_k, np.flatnonzero(np.r_[True, np.diff(nb.query) != 0]))[nb.query]
    last = np.concatenate([c[:-1] for c in chunks])
    right = (nb.tokens >= HALF) == (last[nb.query] < HALF)
    k = np.exp(log_k)
    return float(np.mean(np.bincount(nb.query, k * right) / np.bincount(nb.query, k)))


def test_distinct_contexts_merge_atoms_like_the_build() -> None:
    chunks = [np.array([5, 6, 5, 6, 7])]
    ids = [np.array([[1, 2], [3, 4], [1, 9], [3, 4], [0, 0]])]
    probs = [np.array([[0.5, 0.5], [1.0, 0.0], [0.25, 0.75], [0.5, 0.5], [1.0, 0.0]])]
    ctx = distinct_contexts(chunks, ids, probs, 2, 10)
    # positions 0..3 have contexts (-1,5), (5,6), (6,5), (5,6): three distinct, (5,6) twice
    assert ctx.ids.tolist() == [[-1, 5], [5, 6], [6, 5]]
    atoms = sorted(zip(ctx.pair_context.tolist(), ctx.pair_token.tolist(), ctx.pair_weight.tolist()))
    assert atoms == [(0, 1, 0.5), (0, 2, 0.5), (1, 3, 1.5), (1, 4, 0.5), (2, 1, 0.25), (2, 9, 0.75)]
    assert ctx.mass.tolist() == [1.0, 2.0, 1.0]
    assert ctx.targets[1, :2].tolist() == [3, 4] and ctx.target_probs[1, :2].tolist() == [0.75, 0.25]
    positions = np.random.default_rng(1).normal(size=(10, 3))
    # the keys are the build's context keys (hartonomous.centroid) of the same positions
    expected = context_keys(chunks, positions, 2, 0.3)
    assert np.allclose(context_centroids(positions, ctx.ids, 0.3)[[0, 1, 2, 1]], expected)


def test_unbounded_windows_are_refused() -> None:
    with pytest.raises(UserError, match="finite centroid window"):
        distinct_contexts([np.array([1, 2, 3])], [np.array([1, 2, 3])], None, None, 5)  # type: ignore[arg-type]


def test_the_training_loss_decreases(synthetic) -> None:
    *_, result = synthetic
    kl = [row["train_kl"] for row in result.curve]
    assert kl[-1] < 0.5 * kl[0]
    assert all(b <= a + 1e-3 for a, b in zip(kl, kl[1:]))  # and never rises by more than noise
    assert result.best_epoch > 0


def test_learned_positions_beat_random_ones_on_contexts_never_seen_in_training(synthetic) -> None:
    contexts, validation, test, random_positions, result = synthetic
    before = validate(random_positions, DECAY, WINDOW, contexts, validation)
    after = validate(result.positions, DECAY, WINDOW, contexts, validation)
    # the best possible log-likelihood of the next token is log(1/20) = -3.0: learned gets close
    assert after["log_likelihood"] > before["log_likelihood"] + 0.5
    assert after["log_likelihood"] > np.log(1 / HALF) - 0.15
    # on the test text, which nothing was tuned on: the mass on the right class
    random_mass = class_mass(contexts, random_positions, test, before["h"])
    learned_mass = class_mass(contexts, result.positions, test, after["h"])
    assert random_mass < 0.75 and learned_mass > 0.95


def test_the_best_epoch_is_kept_and_epoch_zero_is_the_start(synthetic) -> None:
    contexts, validation, _, random_positions, result = synthetic
    rows = result.curve
    assert rows[0]["epoch"] == 0 and rows[0]["rms_displacement"] == 0.0
    best = max(rows, key=lambda r: (r["calibration_log_likelihood"], r["calibration_top1"]))
    assert result.best_epoch == best["epoch"]
    again = validate(result.positions, DECAY, WINDOW, contexts, validation)
    assert again["log_likelihood"] == pytest.approx(best["calibration_log_likelihood"])


def test_zero_epochs_return_the_initial_positions(synthetic) -> None:
    contexts, validation, _, random_positions, _ = synthetic
    result = learn(random_positions, contexts, validation, Settings(window=WINDOW, decay=DECAY, epochs=0))
    assert np.array_equal(result.positions, random_positions) and result.best_epoch == 0
    assert len(result.curve) == 1


def test_keep_last_returns_the_last_epoch_even_when_an_earlier_one_was_better(synthetic) -> None:
    contexts, validation, _, random_positions, _ = synthetic
    result = learn(random_positions, contexts, validation,
                   Settings(window=WINDOW, decay=DECAY, epochs=2, learning_rate=0.05, keep="last"))
    assert result.best_epoch == 2 and not result.stopped_early and len(result.curve) == 3
    with pytest.raises(UserError, match="--keep-epoch"):
        Settings(window=WINDOW, decay=DECAY, keep="first").check()


def test_untrained_tokens_follow_their_embedding_neighbours() -> None:
    """Token 3 appears in no context; its embedding equals token 1's, so it moves like token 1."""
    rng = np.random.default_rng(2)
    chunks = [np.array([0, 1, 2, 0, 1, 2, 1, 0, 2, 2, 0, 1])]
    ids = [rng.integers(0, 3, size=(12, 2))]
    embeddings = np.eye(4)
    embeddings[3] = embeddings[1]
    contexts = distinct_contexts(chunks, ids, None, 1, 4)
    start = rng.normal(size=(4, 3))
    result = learn(start, contexts, Validation(chunks, np.concatenate([c[1:] for c in chunks])),
                   Settings(window=1, decay=1.0, epochs=3, learning_rate=0.1, patience=3, neighbours=2),
                   embeddings=embeddings)
    # k = 3 trained neighbours, all at the same embedding distance except token 1 (distance 0)
    moved = result.positions - start
    assert result.trained_tokens == 3 and result.carried_tokens == 1
    assert np.allclose(moved[3], moved[:3].mean(axis=0))


def test_learning_works_when_the_caller_turned_gradients_off(synthetic) -> None:
    """hartonomous.model.load_model disables gradients process-wide before the build trains."""
    import torch

    contexts, validation, _, random_positions, _ = synthetic
    with torch.no_grad():
        result = learn(random_positions, contexts, validation,
                       Settings(window=WINDOW, decay=DECAY, epochs=1, learning_rate=0.05))
    assert result.curve[1]["train_kl"] < result.curve[0]["train_kl"]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(UserError, match="--epochs"):
        Settings(window=1, decay=1.0, epochs=-1).check()
    with pytest.raises(UserError, match="--learning-rate"):
        Settings(window=1, decay=1.0, learning_rate=0.0).check()


# --- build --positions learned, end to end --------------------------------------------------------

@pytest.fixture(scope="module")
def learned_set(server_url: str, corpus_file):  # noqa: F811
    return run_build(server_url, options("tiny-learned", "context", corpus_file, window=3, decay=0.5, soft_k=4,
                                         positions="learned", epochs=3, learning_rate=0.05, replace=True))


def test_a_learned_build_records_the_training_in_its_stats(learned_set) -> None:
    stats = learned_set.stats.learned_positions
    assert stats is not None and stats.epochs == 3 and stats.learning_rate == 0.05
    assert [row["epoch"] for row in stats.curve] == list(range(len(stats.curve)))
    assert 0 <= stats.best_epoch < len(stats.curve) and stats.seconds > 0
    assert stats.split == "calibration" and stats.contexts > 0
    assert set(stats.displacement) >= {"trained_mean", "trained_max", "spread"}
    # the kept epoch was validated exactly as the build then calibrates the set (history atoms included)
    kept = stats.curve[stats.best_epoch]
    final = learned_set.stats.bandwidth
    assert (final.top1, final.log_likelihood) == pytest.approx(
        (kept["calibration_top1"], kept["calibration_log_likelihood"]))
    assert final.h == pytest.approx(kept["calibration_h"])
    assert final.history_weight == learned_set.history_weight


def test_a_learned_set_stores_the_learned_positions_and_atoms_keyed_with_them(server_url: str,
                                                                             learned_set) -> None:
    """The tokens' stored positions are the learned ones, and SQL context_centroid of a training
    context is the key of a stored atom, so next_token needs nothing new."""
    model, tokenizer = tiny_model(0)
    stats = learned_set.stats
    with psycopg.connect(server_url) as conn:
        info = load_atom_set(conn, "tiny-learned")
        assert info.projection == "learned" and info.projection_params["initialised_from"] == "lmds"
        stored = np.array(conn.execute("SELECT ST_X(position), ST_Y(position), ST_Z(position) FROM tokens "
                                       "WHERE atom_set_id = %s ORDER BY token_id", (info.id,)).fetchall())
        from projection.project import fit_projection
        projected = fit_projection(model.get_input_embeddings().weight.detach().numpy(), "lmds", 32, seed=0).positions
        if stats.learned_positions.best_epoch > 0:
            assert not np.allclose(stored, projected)
        from projection.distill import chunk_ids, tokenize
        text = recorded_training_text(stats.corpus, stats.holdout.text).text
        chunk = chunk_ids(tokenize(tokenizer, text, stats.corpus.max_tokens)[0], stats.corpus.context_length)[0][:6]
        hit = conn.execute("SELECT min(ST_3DDistance(a.position, context_centroid(%s::int[], 'tiny-learned'))) "
                           "FROM atoms a WHERE a.atom_set_id = %s", (chunk.tolist(), info.id)).fetchone()[0]
        assert hit < 1e-9


def test_learned_positions_need_a_context_set_and_a_finite_window(corpus_file) -> None:  # noqa: F811
    with pytest.raises(UserError, match="--positions learned"):
        options("x", "token", corpus_file, positions="learned").check()
    with pytest.raises(UserError, match="--positions"):
        options("x", "context", corpus_file, positions="magic").check()
    with pytest.raises(UserError, match="finite"):
        options("x", "context", corpus_file, positions="learned", window=None).check()


def test_the_cli_prints_the_loss_curve_and_refuses_bad_values_in_one_line(server_url: str, corpus_file,  # noqa: F811
                                                                          tmp_path) -> None:
    model, tokenizer = tiny_model(0)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    done = cli("build", "--name", "cli-learned", "--model", str(tmp_path / "tiny"), "--corpus", str(corpus_file),
               "--landmarks", "32", "--max-tokens", "2000", "--holdout-chars", "1500", "--context-length", "64",
               "--device", "cpu", "--positions", "learned", "--epochs", "2", "--learning-rate", "0.05",
               "--no-teacher-cache", "--replace", url=server_url)
    assert done.returncode == 0, done.stderr
    assert "loss curve" in done.stdout and "learned positions" in done.stdout
    bad = cli("build", "--name", "x", "--positions", "learned", "--learning-rate", "-1", url=server_url)
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0 and "--learning-rate" in bad.stderr
