"""SQL next_token and friends on a real PostGIS: hand-computed vectors, a NumPy reference,
history atoms, sampling and generation, bad input (SQLSTATE 22023), the KNN plan, the migration.

Every atom set here is written inside one module-long transaction that is rolled back at the
end, so nothing is left behind and other test modules never see these sets.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psycopg
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hartonomous import centroid
from hartonomous.db import migrate
from hartonomous.sampling import pick_by_uniform, seeded_uniform
from hand_sets import add_set, reference_sets, sets_digest
from native_kernel import module_connection
from reference_next_token import AtomSetData, reference_rows

VECTOR_DIR = Path(__file__).parent / "vectors"
VECTORS = json.loads((VECTOR_DIR / "sampler_cases.json").read_text())
CASES = VECTORS["cases"]
HISTORY = json.loads((VECTOR_DIR / "history_cases.json").read_text())
RECORDED_BEFORE_HISTORY = json.loads((VECTOR_DIR / "next_token_before_history.json").read_text())
NEXT_TOKEN = "SELECT * FROM next_token(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


@pytest.fixture(scope="module", params=["native", "plpgsql"])
def db(server_url: str, request) -> Iterator[psycopg.Connection]:
    """One connection whose transaction spans the module; atom sets are savepoints inside it.

    Every test of this module runs twice: on the native kernel (the hartonomous_kernel C
    extension, which `make install` builds and `migrate` creates) and on the PL/pgSQL reference
    (SET hartonomous.kernel = 'plpgsql'), so both answer the same shared vectors.
    """
    with module_connection(server_url, request.param) as conn:
        yield conn


def vector_set(case: dict) -> AtomSetData:
    """Every token and atom at the origin: an atom of weight w has logit ln w."""
    tokens = sorted(int(t) for t in case["weights"])
    n = VECTORS["vocab_size"]
    return AtomSetData(name=f"sqltest_vec_{case['name']}", token_positions=np.zeros((n, 3)),
                       atom_tokens=np.array(tokens), atom_positions=np.zeros((len(tokens), 3)),
                       atom_weights=np.array([float(case["weights"][str(t)]) for t in tokens]))


@pytest.fixture(scope="module")
def vector_sets(db: psycopg.Connection) -> dict[str, AtomSetData]:
    sets = {case["name"]: vector_set(case) for case in CASES}
    for s in sets.values():
        add_set(db, s)
    return sets


@pytest.fixture(scope="module")
def ref_sets(db: psycopg.Connection) -> dict[str, AtomSetData]:
    """The random reference sets (tests/hand_sets.py), written into the module's transaction."""
    sets = reference_sets()
    for s in sets.values():
        s.atom_set_id = add_set(db, s)
    return sets


def rows(db: psycopg.Connection, context, temperature=1.0, top_k=40, top_p=0.9, search_radius=None,
         max_neighbors=100, atom_set=None, repetition_penalty=1.0, history_weight=None,
         history_window=None) -> list[tuple]:
    return db.execute(NEXT_TOKEN, (context, temperature, top_k, top_p, search_radius, max_neighbors,
                                   atom_set, repetition_penalty, history_weight, history_window)).fetchall()


def assert_rows_equal(got: list[tuple], want: list[tuple], tol: float) -> None:
    assert [r[0] for r in got] == [r[0] for r in want]
    for (_, p, cum), (_, want_p, want_cum) in zip(got, want):
        assert p == pytest.approx(want_p, abs=tol)
        assert cum == pytest.approx(want_cum, abs=tol)


# --- the shared hand-computed vectors ------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_hand_computed_vectors(db, vector_sets, case: dict) -> None:
    name = vector_sets[case["name"]].name
    got = rows(db, case["context"], case["temperature"], case["top_k"], case["top_p"], None, 100, name,
               case["repetition_penalty"])
    assert_rows_equal(got, [tuple(r) for r in case["expected"]], 1e-12)
    for u, token in case["draws"]:
        (picked,) = db.execute(
            "SELECT ht_sample(s.id, s.kernel, s.bandwidth, context_centroid(%s, s.name), %s, %s, %s, %s,"
            " NULL, 100, %s, NULL, 0, %s) FROM atom_sets s WHERE s.name = %s",
            (case["context"], case["context"], case["temperature"], case["top_k"], case["top_p"],
             case["repetition_penalty"], u, name)).fetchone()
        assert picked == token, f"u = {u}"


@pytest.mark.parametrize("seed, step, hex_prefix, u", VECTORS["seeded_uniform"]["values"])
def test_seeded_uniform_is_bit_identical_to_python(db, seed, step, hex_prefix, u) -> None:
    (got,) = db.execute("SELECT seeded_uniform(%s, %s)", (seed, step)).fetchone()
    assert got == u == seeded_uniform(seed, step)


# --- the kernel and the centroid ----------------------------------------------------------------

@pytest.mark.parametrize("kernel, h, scores", [
    # token 1: one atom at distance 1 (weight 1); token 2: distance 2 (weight 1) and 1 (weight 2)
    ("gaussian", 1.0, (math.exp(-1), math.exp(-4) + 2 * math.exp(-1))),
    ("gaussian", 2.0, (math.exp(-1 / 4), math.exp(-1) + 2 * math.exp(-1 / 4))),
    ("exponential", 2.0, (math.exp(-1 / 2), math.exp(-1) + 2 * math.exp(-1 / 2))),
])
def test_kernel_sums_weighted_atom_scores_per_token(db, kernel: str, h: float, scores) -> None:
    s = AtomSetData(name=f"sqltest_kernel_{kernel}_{h:g}", token_positions=np.zeros((3, 3)),
                    atom_tokens=np.array([1, 2, 2]),
                    atom_positions=np.array([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 1.0]]),
                    atom_weights=np.array([1.0, 1.0, 2.0]), kernel=kernel, bandwidth=h)
    add_set(db, s)
    total = sum(scores)
    want = sorted([(1, scores[0] / total), (2, scores[1] / total)], key=lambda r: -r[1])
    got = rows(db, [0], top_k=0, top_p=1.0, atom_set=s.name)
    assert [(t, pytest.approx(p, abs=1e-12)) for t, p, _ in got] == want


@pytest.mark.parametrize("which", ["gauss", "expo"])
def test_context_centroid_matches_centroid_py(db, ref_sets, which: str) -> None:
    s = ref_sets[which]
    rng = np.random.default_rng(11)
    for n in (1, 2, 3, 4, 9):
        context = rng.integers(0, s.vocab_size, n).tolist()
        x, y, z, ndims, srid = db.execute(
            "SELECT ST_X(c), ST_Y(c), ST_Z(c), ST_NDims(c), ST_SRID(c) FROM context_centroid(%s, %s) c",
            (context, s.name)).fetchone()
        want = centroid.context_centroid(s.token_positions[context], s.window, s.decay)
        np.testing.assert_allclose([x, y, z], want, rtol=0, atol=1e-12)
        assert (ndims, srid) == (3, 0)


# --- next_token against the NumPy reference -----------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_next_token_matches_the_numpy_reference(db, ref_sets, data) -> None:
    s = ref_sets[data.draw(st.sampled_from(sorted(ref_sets)))]
    context = data.draw(st.one_of(st.lists(st.integers(0, s.vocab_size - 1), min_size=1, max_size=12),
                                  st.lists(st.integers(0, 6), min_size=13, max_size=40)))   # repeats
    args = dict(
        temperature=data.draw(st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.2, 3.0))),
        top_k=data.draw(st.sampled_from([None, 0, 1, 3, 10, 40])),
        top_p=data.draw(st.one_of(st.sampled_from([None, 1.0, 0.9]), st.floats(0.05, 1.0))),
        search_radius=data.draw(st.one_of(st.none(), st.floats(0.0, 0.4))),
        max_neighbors=data.draw(st.sampled_from([1, 5, 30, 100, 700])),
        repetition_penalty=data.draw(st.sampled_from([1.0, 1.3, 0.7])),
        history_weight=data.draw(st.one_of(st.none(), st.sampled_from([0.0, 1.0, 10.0]), st.floats(0.01, 50))),
        history_window=data.draw(st.one_of(st.none(), st.sampled_from([0, 1, 4096]), st.integers(0, 45))),
    )
    want, near = reference_rows(s, context, **args)
    assume(not near)
    got = rows(db, context, args["temperature"], args["top_k"], args["top_p"], args["search_radius"],
               args["max_neighbors"], s.name, args["repetition_penalty"], args["history_weight"],
               args["history_window"])
    assert_rows_equal(got, want, 1e-9)
    if got:
        assert got[-1][2] == pytest.approx(1.0, abs=1e-9)


# --- history atoms ------------------------------------------------------------------------------

def history_set(name: str) -> AtomSetData:
    spec = HISTORY["sets"][name]
    return AtomSetData(name=f"sqltest_hist_{name}", token_positions=np.array(spec["token_positions"], float),
                       atom_tokens=np.array([a[0] for a in spec["atoms"]]),
                       atom_positions=np.array([a[1] for a in spec["atoms"]], float),
                       atom_weights=np.array([a[2] for a in spec["atoms"]], float), kernel=spec["kernel"],
                       bandwidth=spec["bandwidth"], window=spec["window"], decay=spec["decay"],
                       history_weight=spec["history_weight"], history_window=spec["history_window"])


@pytest.fixture(scope="module")
def history_sets(db: psycopg.Connection) -> dict[str, AtomSetData]:
    sets = {name: history_set(name) for name in HISTORY["sets"]}
    for s in sets.values():
        add_set(db, s)
    return sets


HISTORY_ARGS = ("temperature", "top_k", "top_p", "search_radius", "max_neighbors", "repetition_penalty",
                "history_weight", "history_window")


@pytest.mark.parametrize("case", HISTORY["cases"], ids=[c["name"] for c in HISTORY["cases"]])
def test_history_vectors_in_sql(db, history_sets, case: dict) -> None:
    s = history_sets[case["set"]]
    got = rows(db, case["context"], *(case[k] for k in HISTORY_ARGS[:5]), s.name,
               *(case[k] for k in HISTORY_ARGS[5:]))
    assert_rows_equal(got, [tuple(r) for r in case["expected"]], 1e-12)


@pytest.mark.parametrize("case", HISTORY["cases"], ids=[c["name"] for c in HISTORY["cases"]])
def test_history_vectors_in_the_numpy_reference(case: dict) -> None:
    got, _ = reference_rows(history_set(case["set"]), case["context"], **{k: case[k] for k in HISTORY_ARGS})
    assert_rows_equal(got, [tuple(r) for r in case["expected"]], 1e-12)


@pytest.mark.parametrize("window, decay", [(None, 1.0), (3, 0.6), (None, math.exp(-100)), (6, 0.9), (1, 0.5),
                                           (None, 0.5), (20, math.exp(-10))])
def test_history_atoms_are_keyed_by_the_centroid_of_each_prefix(window, decay) -> None:
    rng = np.random.default_rng(5)
    context = rng.integers(0, 20, 30)
    positions = rng.random((20, 3))[context]
    for history_window in (0, 1, 7, 29, 512):
        keys, tokens = centroid.history_atoms(context, positions, window, decay, history_window)
        m = min(history_window, len(context) - 1)
        want = [centroid.context_centroid(positions[:i], window, decay) for i in range(len(context) - m, len(context))]
        np.testing.assert_allclose(keys.reshape(-1, 3), np.array(want).reshape(-1, 3), rtol=0, atol=1e-12)
        assert tokens.tolist() == context[len(context) - m:].tolist()


@pytest.mark.parametrize("weight, window, argument", [
    (-1.0, None, "history_weight"), (math.nan, None, "history_weight"), (math.inf, None, "history_weight"),
    (None, -1, "history_window"), (None, 4097, "history_window")])
def test_python_history_checks_match_sql(weight, window, argument: str) -> None:
    with pytest.raises(ValueError, match=f"^{argument}"):
        centroid.validate_history(weight, window)


def test_history_off_is_exactly_the_result_before_history_atoms(db, ref_sets) -> None:
    """history_weight 0 (or history_window 0, or a set whose history_weight is 0) changes nothing.

    The other side is the output of the code from before history atoms, recorded on these sets
    (tests/vectors/record_before_history.py says how and from which commit): the same token ids
    in the same order, probabilities within 1e-12; the ways of turning history off agree bit for bit.
    """
    assert sets_digest(ref_sets) == RECORDED_BEFORE_HISTORY["sets_digest"], \
        "the reference sets are not the ones the recording was made on (tests/hand_sets.py)"
    sets = {s.name: s for s in ref_sets.values()}
    for case in RECORDED_BEFORE_HISTORY["cases"]:
        s = sets[case["atom_set"]]
        args = (case["context"], case["temperature"], case["top_k"], case["top_p"], case["search_radius"],
                case["max_neighbors"], s.name, case["repetition_penalty"])
        before = [tuple(r) for r in case["rows"]]
        assert before
        off = rows(db, *args, 0.0, None)
        assert_rows_equal(off, before, 1e-12)
        assert rows(db, *args, 7.0, 0) == off
        if s.history_weight == 0:
            assert rows(db, *args) == off


def test_null_history_arguments_take_the_atom_sets_values(db, ref_sets) -> None:
    s = ref_sets["expo"]                              # the set's own: weight 1.5, window 8
    context = [3, 9, 3, 9, 3, 12, 40, 3, 9, 3, 22, 3]
    own = rows(db, context, top_k=0, top_p=1.0, atom_set=s.name)
    assert own == rows(db, context, top_k=0, top_p=1.0, atom_set=s.name, history_weight=1.5, history_window=8)
    assert own != rows(db, context, top_k=0, top_p=1.0, atom_set=s.name, history_weight=0.0)
    assert own != rows(db, context, top_k=0, top_p=1.0, atom_set=s.name, history_window=2)


@pytest.mark.parametrize("which", ["gauss", "steep", "slow", "long"])
def test_long_contexts_use_only_the_last_history_window_tokens(db, ref_sets, which: str) -> None:
    """A 5000-token context: the history atoms are those of its last history_window tokens."""
    s = ref_sets[which]
    context = np.random.default_rng(8).integers(0, 8, 5000).tolist()
    for history_window in (512, 4096):
        args = dict(temperature=1.0, top_k=0, top_p=1.0, search_radius=None, max_neighbors=50,
                    repetition_penalty=1.0, history_weight=0.05, history_window=history_window)
        want, _ = reference_rows(s, context, **args)
        got = rows(db, context, 1.0, 0, 1.0, None, 50, s.name, 1.0, 0.05, history_window)
        assert_rows_equal(got, want, 1e-9)


def test_default_atom_set_is_used_when_atom_set_is_null(db, ref_sets) -> None:
    with db.transaction(force_rollback=True):
        db.execute("UPDATE atom_sets SET is_default = false WHERE is_default")
        db.execute("UPDATE atom_sets SET is_default = true WHERE name = %s", (ref_sets["expo"].name,))
        assert rows(db, [1, 2, 3]) == rows(db, [1, 2, 3], atom_set=ref_sets["expo"].name)


def test_knn_reads_only_the_sets_own_atoms(db, ref_sets) -> None:
    """Another set whose atoms sit right at the centroid must not leak into the answer."""
    s = ref_sets["gauss"]
    (cx, cy, cz) = db.execute("SELECT ST_X(c), ST_Y(c), ST_Z(c) FROM context_centroid(%s, %s) c",
                              ([4, 5], s.name)).fetchone()
    intruder = AtomSetData(name="sqltest_intruder", token_positions=s.token_positions,
                           atom_tokens=np.array([49] * 5), atom_positions=np.tile([cx, cy, cz], (5, 1)),
                           atom_weights=np.full(5, 100.0))
    with db.transaction(force_rollback=True):
        add_set(db, intruder)
        want, _ = reference_rows(s, [4, 5], 1.0, 40, 0.9, None, 100, 1.0)
        assert_rows_equal(rows(db, [4, 5], atom_set=s.name), want, 1e-9)


# --- no candidates ------------------------------------------------------------------------------

def test_search_radius_excluding_every_atom_gives_zero_rows_and_a_notice(db, ref_sets) -> None:
    notices: list[str] = []
    handler = lambda diag: notices.append(diag.message_primary)  # noqa: E731
    db.add_notice_handler(handler)
    try:
        name = ref_sets["gauss"].name
        assert rows(db, [1, 2], search_radius=1e-6, atom_set=name) == []
        assert db.execute("SELECT sample_next_token(ARRAY[1, 2], search_radius => 1e-6, atom_set => %s,"
                          " seed => 1)", (name,)).fetchone() == (None,)
        assert db.execute("SELECT generate_tokens(ARRAY[1, 2], 5, search_radius => 1e-6, atom_set => %s,"
                          " seed => 1)", (name,)).fetchone() == ([],)
    finally:
        db.remove_notice_handler(handler)
    assert len(notices) == 3
    assert all("search_radius" in n and "sqltest_gauss" in n for n in notices)


# --- sampling and generation --------------------------------------------------------------------

def test_sample_next_token_is_the_inverse_cdf_at_seeded_uniform(db, ref_sets) -> None:
    name = ref_sets["gauss"].name
    distribution = rows(db, [3, 7], temperature=1.5, top_k=10, top_p=1.0, atom_set=name)
    assert len(distribution) > 1
    ids, probs = [r[0] for r in distribution], [r[1] for r in distribution]
    for seed, step in [(0, 0), (1, 0), (1, 1), (99, 5), (-4, 2)]:
        (picked,) = db.execute(
            "SELECT sample_next_token(ARRAY[3, 7], 1.5, 10, 1.0, NULL, 100, %s, 1.0, %s, %s)",
            (name, seed, step)).fetchone()
        assert picked == pick_by_uniform(ids, probs, seeded_uniform(seed, step))


def test_sample_next_token_at_temperature_zero_is_the_argmax(db, ref_sets) -> None:
    name = ref_sets["expo"].name
    (best,) = rows(db, [8, 9], temperature=0.0, atom_set=name)
    assert best[1:] == (1.0, 1.0)
    for seed in (None, 5, 6):
        assert db.execute("SELECT sample_next_token(ARRAY[8, 9], 0.0, atom_set => %s, seed => %s)",
                          (name, seed)).fetchone() == (best[0],)


@pytest.mark.parametrize("history", [(None, None), (0.0, None), (4.0, 6), (20.0, 4096)])
def test_generate_tokens_equals_sampling_step_by_step(db, ref_sets, history) -> None:
    """Also with history atoms: generated tokens become history for the next steps."""
    for s in ref_sets.values():
        prompt = [1, 2, 3, 1, 2]
        (generated,) = db.execute(
            "SELECT generate_tokens(%s, 12, 1.2, 20, 0.95, NULL, 50, %s, 1.3, 2024, NULL, %s, %s)",
            (prompt, s.name, *history)).fetchone()
        assert len(generated) == 12
        context = list(prompt)
        for step, token in enumerate(generated):
            (want,) = db.execute(
                "SELECT sample_next_token(%s, 1.2, 20, 0.95, NULL, 50, %s, 1.3, 2024, %s, %s, %s)",
                (context, s.name, step, *history)).fetchone()
            assert token == want, f"step {step}"
            context.append(token)


def test_sample_next_token_draws_from_the_rows_with_history_atoms(db, ref_sets) -> None:
    name = ref_sets["slow"].name
    context = [3, 7, 3, 7, 3]
    distribution = rows(db, context, temperature=1.5, top_k=10, top_p=1.0, atom_set=name,
                        history_weight=30.0, history_window=64)
    assert distribution != rows(db, context, temperature=1.5, top_k=10, top_p=1.0, atom_set=name)
    ids, probs = [r[0] for r in distribution], [r[1] for r in distribution]
    for seed, step in [(0, 0), (1, 0), (99, 5)]:
        (picked,) = db.execute(
            "SELECT sample_next_token(%s, 1.5, 10, 1.0, atom_set => %s, seed => %s, step => %s,"
            " history_weight => 30, history_window => 64)", (context, name, seed, step)).fetchone()
        assert picked == pick_by_uniform(ids, probs, seeded_uniform(seed, step))


def test_generate_tokens_stops_after_a_stop_token(db, ref_sets) -> None:
    name = ref_sets["gauss"].name
    call = "SELECT generate_tokens(ARRAY[5], 10, 2.0, 0, 1.0, atom_set => %s, seed => 7, stop_tokens => %s)"
    (full,) = db.execute(call, (name, None)).fetchone()
    stop = full[3]
    (cut,) = db.execute(call, (name, [stop, -1])).fetchone()
    assert cut == full[:full.index(stop) + 1]
    assert db.execute("SELECT generate_tokens(ARRAY[5], 0, atom_set => %s)", (name,)).fetchone() == ([],)


def test_generate_tokens_without_a_seed_gives_valid_ids(db, ref_sets) -> None:
    s = ref_sets["gauss"]
    (generated,) = db.execute("SELECT generate_tokens(ARRAY[5, 6], 6, atom_set => %s)", (s.name,)).fetchone()
    assert len(generated) == 6 and set(generated) <= set(s.atom_tokens.tolist())


def test_generate_tokens_greedy_follows_the_argmax(db, ref_sets) -> None:
    name = ref_sets["expo"].name
    (generated,) = db.execute("SELECT generate_tokens(ARRAY[10, 11], 5, 0.0, atom_set => %s)", (name,)).fetchone()
    context = [10, 11]
    for token in generated:
        assert rows(db, context, temperature=0.0, atom_set=name)[0][0] == token
        context.append(token)


@pytest.mark.parametrize("history", [(None, None), (3.0, 2), (0.5, None)])
def test_next_token_batch_equals_next_token_per_context(db, ref_sets, history) -> None:
    for name in (ref_sets["gauss"].name, ref_sets["expo"].name):
        contexts = [[1, 2, 3, 1, 2], [4], [5, 5, 6, 5, 5, 6]]
        got = db.execute("SELECT * FROM next_token_batch(%s::jsonb, 0.8, 5, 0.9, NULL, 60, %s, 1.2, %s, %s)",
                         (json.dumps(contexts), name, *history)).fetchall()
        want = [(i, *r) for i, c in enumerate(contexts)
                for r in rows(db, c, 0.8, 5, 0.9, None, 60, name, 1.2, *history)]
        assert got == want


# --- bad input ----------------------------------------------------------------------------------

BAD_INPUTS = [
    ("SELECT * FROM next_token(NULL::int[], atom_set => 'sqltest_gauss')", "context"),
    ("SELECT * FROM next_token('{}'::int[], atom_set => 'sqltest_gauss')", "context"),
    ("SELECT * FROM next_token(ARRAY[1, NULL], atom_set => 'sqltest_gauss')", "context"),
    ("SELECT * FROM next_token(ARRAY[1, 50], atom_set => 'sqltest_gauss')", "context"),
    ("SELECT * FROM next_token(ARRAY[1], -1, atom_set => 'sqltest_gauss')", "temperature"),
    ("SELECT * FROM next_token(ARRAY[1], 'NaN', atom_set => 'sqltest_gauss')", "temperature"),
    ("SELECT * FROM next_token(ARRAY[1], 'Infinity', atom_set => 'sqltest_gauss')", "temperature"),
    ("SELECT * FROM next_token(ARRAY[1], NULL, atom_set => 'sqltest_gauss')", "temperature"),
    ("SELECT * FROM next_token(ARRAY[1], top_p => 0, atom_set => 'sqltest_gauss')", "top_p"),
    ("SELECT * FROM next_token(ARRAY[1], top_p => 1.5, atom_set => 'sqltest_gauss')", "top_p"),
    ("SELECT * FROM next_token(ARRAY[1], top_p => 'NaN', atom_set => 'sqltest_gauss')", "top_p"),
    ("SELECT * FROM next_token(ARRAY[1], top_k => -1, atom_set => 'sqltest_gauss')", "top_k"),
    ("SELECT * FROM next_token(ARRAY[1], max_neighbors => 0, atom_set => 'sqltest_gauss')", "max_neighbors"),
    ("SELECT * FROM next_token(ARRAY[1], max_neighbors => 100001, atom_set => 'sqltest_gauss')", "max_neighbors"),
    ("SELECT * FROM next_token(ARRAY[1], repetition_penalty => 0, atom_set => 'sqltest_gauss')",
     "repetition_penalty"),
    ("SELECT * FROM next_token(ARRAY[1], repetition_penalty => 'NaN', atom_set => 'sqltest_gauss')",
     "repetition_penalty"),
    ("SELECT * FROM next_token(ARRAY[1], search_radius => -1, atom_set => 'sqltest_gauss')", "search_radius"),
    ("SELECT * FROM next_token(ARRAY[1], atom_set => 'sqltest_no_such_set')", "atom_set"),
    ("SELECT context_centroid(ARRAY[1, 999], 'sqltest_gauss')", "context"),
    ("SELECT sample_next_token(ARRAY[1], top_k => -2, atom_set => 'sqltest_gauss')", "top_k"),
    ("SELECT sample_next_token(ARRAY[1], atom_set => 'sqltest_gauss', seed => 1, step => NULL)", "step"),
    ("SELECT generate_tokens(ARRAY[1], -1, atom_set => 'sqltest_gauss')", "max_new_tokens"),
    ("SELECT generate_tokens(ARRAY[1], 4097, atom_set => 'sqltest_gauss')", "max_new_tokens"),
    ("SELECT generate_tokens(ARRAY[1], NULL, atom_set => 'sqltest_gauss')", "max_new_tokens"),
    ("SELECT * FROM next_token(ARRAY[1], atom_set => 'sqltest_gauss', history_weight => -1)", "history_weight"),
    ("SELECT * FROM next_token(ARRAY[1], atom_set => 'sqltest_gauss', history_weight => 'NaN')", "history_weight"),
    ("SELECT * FROM next_token(ARRAY[1], atom_set => 'sqltest_gauss', history_weight => 'Infinity')",
     "history_weight"),
    ("SELECT * FROM next_token(ARRAY[1], atom_set => 'sqltest_gauss', history_window => -1)", "history_window"),
    ("SELECT * FROM next_token(ARRAY[1], atom_set => 'sqltest_gauss', history_window => 4097)", "history_window"),
    ("SELECT sample_next_token(ARRAY[1], atom_set => 'sqltest_gauss', history_weight => '-Infinity')",
     "history_weight"),
    ("SELECT generate_tokens(ARRAY[1], 3, atom_set => 'sqltest_gauss', history_window => 5000)", "history_window"),
    ("SELECT * FROM next_token_batch('[[1]]', atom_set => 'sqltest_gauss', history_window => -2)",
     "history_window"),
    ("SELECT generate_tokens(ARRAY[1, 77], 3, atom_set => 'sqltest_gauss')", "context"),
    ("SELECT * FROM next_token_batch('[[1], 2]', atom_set => 'sqltest_gauss')", "contexts[1]"),
    ("SELECT * FROM next_token_batch('[[1], [1.5]]', atom_set => 'sqltest_gauss')", "contexts[1]"),
    ("SELECT * FROM next_token_batch('[]', atom_set => 'sqltest_gauss')", "contexts"),
    ("SELECT * FROM next_token_batch('[[1], []]', atom_set => 'sqltest_gauss')", "contexts[1]"),
    ("SELECT * FROM next_token_batch('[[1], [99]]', atom_set => 'sqltest_gauss')", "context"),
]


@pytest.mark.parametrize("sql, argument", BAD_INPUTS, ids=[f"{i}-{a}" for i, (_, a) in enumerate(BAD_INPUTS)])
def test_bad_input_raises_22023_naming_the_argument(db, ref_sets, sql: str, argument: str) -> None:
    with pytest.raises(psycopg.Error) as err:
        with db.transaction():
            db.execute(sql)
    assert err.value.sqlstate == "22023"
    assert err.value.diag.message_primary.startswith(argument)


def test_no_default_atom_set_raises_22023(db, ref_sets) -> None:
    with db.transaction(force_rollback=True):
        db.execute("UPDATE atom_sets SET is_default = false WHERE is_default")
        with pytest.raises(psycopg.Error) as err:
            with db.transaction():
                db.execute("SELECT * FROM next_token(ARRAY[1])")
    assert err.value.sqlstate == "22023"
    assert err.value.diag.message_primary.startswith("atom_set")


# --- the plan -----------------------------------------------------------------------------------

def _knn_path(plan: str) -> list[str]:
    """Node names from the atoms index scan up to the nearest Limit above it."""
    lines = plan.splitlines()
    start = next(i for i, line in enumerate(lines) if "Index Scan using atoms_" in line)
    indent = len(lines[start]) - len(lines[start].lstrip(" ->"))
    path = [lines[start].strip(" ->")]
    for line in reversed(lines[:start]):
        own = len(line) - len(line.lstrip(" ->"))
        if "(cost=" in line and own < indent:
            path.append(line.strip(" ->"))
            indent = own
            if path[-1].startswith("Limit"):
                break
    return path


def test_explain_shows_the_gist_index_scan_of_the_sets_own_partition(db, ref_sets) -> None:
    plans: list[str] = []
    handler = lambda diag: plans.append(diag.message_primary)  # noqa: E731
    s, other = ref_sets["gauss"], ref_sets["expo"]
    with db.transaction(force_rollback=True):
        try:
            db.execute("LOAD 'auto_explain'")
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("LOAD 'auto_explain' needs a superuser")
        db.execute("SET LOCAL auto_explain.log_min_duration = 0")
        db.execute("SET LOCAL auto_explain.log_nested_statements = on")
        db.execute("SET LOCAL client_min_messages = log")
        db.add_notice_handler(handler)
        try:
            rows(db, [1, 2, 3], atom_set=s.name)
        finally:
            db.remove_notice_handler(handler)
    plan = next(p for p in plans if "Index Scan using atoms_" in p)
    assert f"Index Scan using atoms_{s.atom_set_id}_position_idx" in plan
    assert f"atoms_{other.atom_set_id}_position_idx" not in plan
    # The atoms are never scanned sequentially; the small tokens lookup may be (the planner's
    # choice for a few hundred test rows), which says nothing about the KNN.
    assert "Seq Scan on atoms" not in plan
    path = _knn_path(plan)
    assert path[-1].startswith("Limit")
    # The incremental sort only orders atoms at equal distances by (token_id, weight) (sql/015_knn.sql).
    assert all(node.startswith(("Index Scan", "Append", "Incremental Sort", "Limit")) for node in path), path
    assert "Order By: (\"position\" <<->>" in plan


# --- the migration ------------------------------------------------------------------------------

def test_migration_installs_and_removes_the_functions(scratch_database: str) -> None:
    def functions() -> set[str]:
        with psycopg.connect(scratch_database) as conn:
            return {r[0] for r in conn.execute(
                "SELECT proname FROM pg_proc WHERE pronamespace = 'public'::regnamespace").fetchall()}

    migrate.upgrade(scratch_database)   # 0002 installs sql/; only a schema with what it reads keeps it
    with psycopg.connect(scratch_database) as conn:
        defined = set(migrate.sql_function_names(conn))  # what sql/ defines, read from pg_proc
    assert {"context_centroid", "next_token", "generate_tokens"} <= defined <= functions()
    assert migrate.function_drift(scratch_database) == []
    migrate.downgrade(scratch_database, "0001")
    assert not defined & functions()


# What a database migrated before history atoms holds: these signatures must not survive a migrate.
BEFORE_HISTORY = {
    "ht_atom_set": "text",
    "ht_context_centroid": "integer, integer, double precision, integer[]",
    "ht_check_sampler_args": "double precision, integer, double precision, double precision, integer, "
                             "double precision",
    "ht_next_token": "integer, text, double precision, geometry, integer[], double precision, integer, "
                     "double precision, double precision, integer, double precision",
    "next_token": "integer[], double precision, integer, double precision, double precision, integer, text, "
                  "double precision",
    "next_token_batch": "jsonb, double precision, integer, double precision, double precision, integer, text, "
                        "double precision",
    "ht_sample": "integer, text, double precision, geometry, integer[], double precision, integer, "
                 "double precision, double precision, integer, double precision, double precision",
    "sample_next_token": "integer[], double precision, integer, double precision, double precision, integer, "
                         "text, double precision, bigint, integer",
    "generate_tokens": "integer[], integer, double precision, integer, double precision, double precision, "
                       "integer, text, double precision, bigint, integer[]",
}
SAMPLER_ARGS = ("temperature double precision, top_k integer, top_p double precision, "
                "search_radius double precision, max_neighbors integer, atom_set text, "
                "repetition_penalty double precision")
HISTORY_TAIL = "history_weight double precision, history_window integer"
PUBLIC_SIGNATURES = {
    "next_token": f"context integer[], {SAMPLER_ARGS}, {HISTORY_TAIL}, memory boolean",
    "next_token_batch": f"contexts jsonb, {SAMPLER_ARGS}, {HISTORY_TAIL}",
    "sample_next_token": f"context integer[], {SAMPLER_ARGS}, seed bigint, step integer, {HISTORY_TAIL}",
    "generate_tokens": f"context integer[], max_new_tokens integer, {SAMPLER_ARGS}, seed bigint, "
                       f"stop_tokens integer[], {HISTORY_TAIL}",
    "context_centroid": "context integer[], atom_set text",
    "seeded_uniform": "seed bigint, step integer",
}


def _signatures(url: str) -> dict[str, list[str]]:
    with psycopg.connect(url) as conn:
        found: dict[str, list[str]] = {}
        for name, args in conn.execute(
                "SELECT proname, pg_get_function_identity_arguments(oid) FROM pg_proc"
                " WHERE pronamespace = 'public'::regnamespace AND proname = ANY(%s) ORDER BY 1, 2",
                (list(BEFORE_HISTORY) + list(PUBLIC_SIGNATURES),)):
            found.setdefault(name, []).append(args)
    return found


def test_migrate_replaces_the_signatures_from_before_history_atoms(scratch_database: str) -> None:
    """A fresh migrate and `hartonomous migrate` on an older database end with the same, new signatures."""
    import os
    import subprocess
    import sys

    migrate.upgrade(scratch_database)
    fresh = _signatures(scratch_database)
    assert {name: args[0] for name, args in fresh.items() if name in PUBLIC_SIGNATURES} == PUBLIC_SIGNATURES
    assert all(len(args) == 1 for args in fresh.values()), fresh
    with psycopg.connect(scratch_database) as conn:     # turn it into a database from before
        for name, args in BEFORE_HISTORY.items():
            conn.execute(f"DROP FUNCTION {name}({fresh[name][0]})")
            conn.execute(f"CREATE FUNCTION {name}({args}) RETURNS void LANGUAGE sql AS ''")
    assert migrate.function_drift(scratch_database)
    result = subprocess.run([sys.executable, "-m", "hartonomous.cli", "migrate"], capture_output=True, text=True,
                            env={**os.environ, "HARTONOMOUS_DATABASE_URL": scratch_database}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert _signatures(scratch_database) == fresh
    assert migrate.function_drift(scratch_database) == []
    with psycopg.connect(scratch_database) as conn:
        for name, args in PUBLIC_SIGNATURES.items():
            types = ", ".join(arg.split(" ", 1)[1] for arg in args.split(", "))
            assert conn.execute("SELECT has_function_privilege('hartonomous_reader', %s, 'EXECUTE')",
                                (f"{name}({types})",)).fetchone() == (True,), name
