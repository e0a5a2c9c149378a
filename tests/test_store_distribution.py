"""store_distribution: the store's own distribution and its features, per prefix, in one call.

- On the native kernel (htk_store) it is the PL/pgSQL reference (ht_store_step) within 1e-12, for a
  backoff lattice set and a gaussian set, with and without history atoms and the memory.
- Its probabilities are next_token's at temperature 1 without top-k, top-p or penalty, memory
  included (the KNN's stored and memory atoms merged by ht_knn's rule 4).
- positions = P gives the rows of P single calls; the features are the NumPy reference's
  (hartonomous/store.py store_step) on the same candidates; bad arguments raise 22023 naming them;
  the reader role may call it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hand_sets import add_set, random_set
from hartonomous import sqlcalls
from hartonomous.centroid import prefix_centroids
from hartonomous.errors import UserError
from hartonomous.store import StoreStep, store_step
from native_kernel import nonzero, require_native_kernel
from projection.lattice import lattice_cells, lattice_decay
from reference_next_token import AtomSetData, reference_candidates

TOL = 1e-12
COLUMNS = ("prefix_length, token_ids, probabilities, nearest_bandwidths, rung, matched_mass, candidates, "
           "top_probability, entropy, stored_share, history_share, memory_share")
STORE = (f"SELECT {COLUMNS} FROM store_distribution(%(context)s, %(atom_set)s, %(max_neighbors)s, "
         "%(history_weight)s, %(history_window)s, %(memory)s, %(positions)s)")
NEXT_TOKEN = ("SELECT token_id, probability FROM next_token(%(context)s, 1.0, 0, 1.0, NULL, %(max_neighbors)s, "
              "%(atom_set)s, 1.0, %(history_weight)s, %(history_window)s, %(memory)s)")


def lattice_set(name: str, seed: int) -> AtomSetData:
    """A backoff set on a 3^3 lattice: the contexts of a random text over 9 tokens (so deep matches
    and periodic contexts exist), window 4, each with the token that followed; history atoms on."""
    rng = np.random.default_rng(seed)
    positions = (lattice_cells(3).astype(np.float64) - 1.0)[rng.permutation(27)]
    decay = lattice_decay(3)
    text = rng.integers(0, 9, 3000)
    keys = prefix_centroids(positions[text], 4, decay)[:-1]
    merged, counts = np.unique(np.column_stack([text[1:], keys]), axis=0, return_counts=True)
    spread = math.sqrt(3) * 2
    t = spread * decay / (1 - decay)
    top = 0.5 * ((spread + t) + (1 - t) / decay) * (1 - decay)
    return AtomSetData(name=name, token_positions=positions, atom_tokens=merged[:, 0].astype(np.int64),
                       atom_positions=merged[:, 1:], atom_weights=counts.astype(np.float64), kernel="backoff",
                       bandwidth=top, window=4, decay=decay, history_weight=3.0, history_window=64)


@pytest.fixture(scope="module")
def db(server_url: str) -> Iterator[psycopg.Connection]:
    """One transaction for the module (its sets are rolled back), on either kernel per statement."""
    with psycopg.connect(server_url) as conn:
        conn.execute("SELECT 1")
        yield conn
        conn.rollback()


@pytest.fixture(scope="module")
def sets(db) -> dict[str, AtomSetData]:
    """A backoff and a gaussian set, each with a memory of two past generations."""
    made = {"backoff": lattice_set("store_backoff", 2),
            "gaussian": random_set("store_gauss", 7, kernel="gaussian", bandwidth=0.15, window=3, decay=0.6,
                                   history_weight=1.5, history_window=8)}
    for s in made.values():
        s.atom_set_id = add_set(db, s)
        db.execute("SELECT remember(%s, %s, %s, 'exact')", (s.name, [1, 2, 3, 4], [5, 6, 7, 8, 1, 2]))
        db.execute("SELECT remember(%s, %s, %s, 'exact')", (s.name, [8, 7, 6], [5, 4, 3, 2, 8, 7, 6]))
    return made


@pytest.fixture(scope="module")
def kernels(db) -> list[str]:
    """The kernels this server runs: the reference always, the native one ('') where installed (under
    CI=true it must be: native_kernel.require_native_kernel)."""
    db.execute("SELECT set_config('hartonomous.kernel', '', false)")
    if db.execute("SELECT ht_kernel()").fetchone()[0] == "native":
        return ["", "plpgsql"]
    if os.environ.get("CI"):
        require_native_kernel()
    return ["plpgsql"]


def rows(db, kernel: str, params: dict) -> list[tuple]:
    db.execute("SELECT set_config('hartonomous.kernel', %s, true)", (kernel,))
    return db.execute(STORE, params).fetchall()


def assert_same_row(got: tuple, want: tuple, tol: float = TOL) -> None:
    """Two rows agree: prefix, token ids, rung and candidates exactly; the numbers to tol (relative
    for the unbounded ones, the distance and the mass)."""
    assert got[0] == want[0] and got[1] == want[1] and got[4] == want[4] and got[6] == want[6], (got, want)
    assert got[2] == pytest.approx(want[2], abs=tol)
    for i in (3, 5):
        assert (got[i] is None) == (want[i] is None)
        if got[i] is not None:
            assert got[i] == pytest.approx(want[i], rel=tol, abs=tol)
    for g, w in zip(got[7:], want[7:]):
        assert (g is None) == (w is None) and (g is None or g == pytest.approx(w, abs=tol)), (got, want)


calls = st.fixed_dictionaries({
    "max_neighbors": st.sampled_from([5, 100, 2000]), "history_weight": st.sampled_from([None, 0.0, 2.0]),
    "history_window": st.sampled_from([None, 3]), "memory": st.booleans()})


@settings(max_examples=60, deadline=None)
@given(which=st.sampled_from(["backoff", "gaussian"]), context=st.lists(st.integers(0, 8), min_size=1, max_size=24),
       args=calls, data=st.data())
def test_native_is_the_reference_and_every_row_is_next_tokens_distribution(db, sets, kernels, which, context,
                                                                            args, data) -> None:
    s = sets[which]
    positions = data.draw(st.integers(1, min(len(context), 4)))
    params = {**args, "context": context, "atom_set": s.name, "positions": positions}
    by_kernel = {k: rows(db, k, params) for k in kernels}
    reference = by_kernel["plpgsql"]
    assert [r[0] for r in reference] == list(range(len(context) - positions + 1, len(context) + 1))
    for got in by_kernel.values():
        for got_row, want_row in zip(got, reference):
            assert_same_row(got_row, want_row)
    window = s.history_window if args["history_window"] is None else args["history_window"]
    for kernel, got in by_kernel.items():
        for row in got:
            ids, ps = row[1], row[2]
            assert ids == sorted(set(ids)) and sum(ps) == pytest.approx(1.0, abs=1e-12)
            assert len(ids) <= args["max_neighbors"] + min(window, row[0] - 1)
            assert row[9] + row[10] + row[11] == pytest.approx(1.0, abs=1e-12)
            if not args["memory"]:
                assert row[11] == 0
            db.execute("SELECT set_config('hartonomous.kernel', %s, true)", (kernel,))
            want = dict(nonzero(db.execute(NEXT_TOKEN, {**params, "context": context[:row[0]]}).fetchall()))
            got_p = {t: p for t, p in zip(ids, ps) if p > 0}
            assert sorted(got_p) == sorted(want), (kernel, row, want)
            assert [got_p[t] for t in sorted(want)] == pytest.approx([want[t] for t in sorted(want)], abs=TOL)


@pytest.mark.parametrize("which", ["backoff", "gaussian"])
def test_positions_give_the_rows_of_single_calls(db, sets, kernels, which) -> None:
    context = [3, 1, 4, 1, 5, 2, 6, 5, 3, 5, 8, 7, 6, 4, 1, 2]
    params = {"context": context, "atom_set": sets[which].name, "max_neighbors": 100, "history_weight": None,
              "history_window": None, "memory": True}
    for kernel in kernels:
        many = rows(db, kernel, {**params, "positions": 8})
        singles = [rows(db, kernel, {**params, "context": context[:n], "positions": 1})[0]
                   for n in range(len(context) - 7, len(context) + 1)]
        assert many == singles


def test_periodic_contexts_keep_the_history_key_at_the_centre(db, sets, kernels) -> None:
    """0 1 0 1 ... on window 4: from 6 tokens on, the history key two tokens back has the centroid's last
    4 tokens, so equals it in exact arithmetic (0 in C, ~1e-17 from SQL's running sums); both kernels
    keep it inside the radius (the tolerance)."""
    s = sets["backoff"]
    params = {"context": [0, 1, 0, 1, 0, 1, 0, 1], "atom_set": s.name, "max_neighbors": 100,
              "history_weight": 3.0, "history_window": 4, "memory": False, "positions": 3}
    by_kernel = {k: rows(db, k, params) for k in kernels}
    for got in by_kernel.values():
        for row in got:
            assert row[4] is None and row[3] < 1e-12 and row[10] > 0    # D counts as 0; history counts
        for got_row, want_row in zip(got, by_kernel["plpgsql"]):
            assert_same_row(got_row, want_row)


@pytest.mark.parametrize("which", ["backoff", "gaussian"])
def test_the_features_are_the_numpy_references(db, sets, kernels, which) -> None:
    s = sets[which]
    rng = np.random.default_rng(5)
    for _ in range(6):
        context = [int(t) for t in rng.integers(0, 9, rng.integers(2, 20))]
        cand = reference_candidates(s, context, None, 100, None, None)
        sources = np.where(cand.history, "history", "stored")
        want = store_step(cand.tokens, cand.distances, cand.weights, sources, s.kernel, s.bandwidth, s.decay,
                          prefix_length=len(context))
        for kernel in kernels:
            db.execute("SELECT set_config('hartonomous.kernel', %s, true)", (kernel,))
            (got,) = sqlcalls.store_distribution(db, context, atom_set=s.name)
            assert (got.prefix_length, got.token_ids, got.rung, got.candidates) == \
                (want.prefix_length, want.token_ids, want.rung, want.candidates)
            assert got.probabilities == pytest.approx(want.probabilities, abs=1e-9)
            for name in ("nearest_bandwidths", "matched_mass", "top_probability", "entropy", "stored_share",
                         "history_share", "memory_share"):
                assert getattr(got, name) == pytest.approx(getattr(want, name), rel=1e-9, abs=1e-9), name


def test_memory_atoms_are_counted_as_memory(db, sets, kernels) -> None:
    """8 7 6 was remembered followed by 5: with memory => true the memory's atoms count, and their
    share is the mass they carry; without it the memory is not read."""
    s = sets["backoff"]
    params = {"context": [8, 7, 6], "atom_set": s.name, "max_neighbors": 100, "history_weight": 0.0,
              "history_window": None, "positions": 1}
    for kernel in kernels:
        (without,) = rows(db, kernel, {**params, "memory": False})
        (with_memory,) = rows(db, kernel, {**params, "memory": True})
        assert without[11] == 0 and with_memory[11] > 0
        assert with_memory[9] + with_memory[11] == pytest.approx(1.0, abs=TOL)
        assert 5 in with_memory[1]


def test_store_step_counts_the_backoff_rung_and_the_sources() -> None:
    ids = [5, 5, 7] + [9] * 10
    dist = [0.5, 0.7, 0.6] + [5.0] * 10
    sources = ["stored", "history", "memory"] + ["stored"] * 10
    got = store_step(ids, dist, [1.0, 2.0, 1.0] + [1.0] * 10, sources, "backoff", 64.0, 1 / 8, prefix_length=4)
    assert got.token_ids == [5, 7] and got.probabilities == pytest.approx([0.75, 0.25])
    assert got.rung == 2 and got.candidates == 3 and got.matched_mass == pytest.approx(4.0)
    assert (got.stored_share, got.history_share, got.memory_share) == pytest.approx((0.25, 0.5, 0.25))
    assert got.top_probability == pytest.approx(0.75)
    assert got.entropy == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert got.nearest_bandwidths == pytest.approx(0.5 / 64)
    gauss = store_step([1, 2], [0.0, 0.1], [1.0, 1.0], ["stored", "stored"], "gaussian", 0.1)
    assert gauss.rung is None and gauss.matched_mass == pytest.approx(1 + math.exp(-1))
    assert store_step([], [], [], [], "gaussian", 1.0) == StoreStep(0, [], [], None, None, 0.0, 0, None, None, None,
                                                                    None, None)


@pytest.mark.parametrize("change, argument", [
    ({"context": None}, "context"), ({"context": []}, "context"), ({"context": [1, None]}, "context"),
    ({"context": [1, 999]}, "context"), ({"max_neighbors": 0}, "max_neighbors"),
    ({"max_neighbors": 100001}, "max_neighbors"), ({"history_weight": -1.0}, "history_weight"),
    ({"history_weight": float("nan")}, "history_weight"), ({"history_window": -1}, "history_window"),
    ({"history_window": 5000}, "history_window"), ({"memory": None}, "memory"), ({"positions": 0}, "positions"),
    ({"positions": 4}, "positions"), ({"positions": None}, "positions"), ({"atom_set": "no such set"}, "atom_set"),
])
def test_bad_arguments_raise_22023_naming_them(db, sets, kernels, change, argument) -> None:
    params = {"context": [1, 2, 3], "atom_set": sets["gaussian"].name, "max_neighbors": 100, "history_weight": None,
              "history_window": None, "memory": False, "positions": 1, **change}
    for kernel in kernels:
        db.execute("SAVEPOINT bad")
        db.execute("SELECT set_config('hartonomous.kernel', %s, true)", (kernel,))
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            db.execute(STORE, params)
        db.execute("ROLLBACK TO SAVEPOINT bad")
        assert err.value.diag.message_primary.startswith(argument), err.value.diag.message_primary


def test_positions_are_at_most_64(db, sets) -> None:
    db.execute("SAVEPOINT long")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="positions must be between 1 and 64"):
        db.execute(STORE, {"context": [1] * 70, "atom_set": sets["gaussian"].name, "max_neighbors": 100,
                           "history_weight": None, "history_window": None, "memory": False, "positions": 65})
    db.execute("ROLLBACK TO SAVEPOINT long")


def test_sqlcalls_names_the_argument_in_a_user_error(conn) -> None:
    """(Its own connection: a UserError rolls the caller's transaction back.) positions is checked
    before the atom set is looked up."""
    with pytest.raises(UserError, match="^positions must be between 1 and 2, got 3"):
        sqlcalls.store_distribution(conn, [1, 2], atom_set="no such set", positions=3)


def test_the_reader_role_may_call_it(db, sets) -> None:
    (allowed,) = db.execute("SELECT has_function_privilege('hartonomous_reader', 'store_distribution(integer[], "
                            "text, integer, double precision, integer, boolean, integer)', 'EXECUTE')").fetchone()
    assert allowed
    db.execute("SAVEPOINT reader")
    db.execute("SET LOCAL ROLE hartonomous_reader")
    got = db.execute(STORE, {"context": [8, 7, 6], "atom_set": sets["backoff"].name, "max_neighbors": 100,
                             "history_weight": None, "history_window": None, "memory": True,
                             "positions": 2}).fetchall()
    db.execute("ROLLBACK TO SAVEPOINT reader")
    assert [r[0] for r in got] == [2, 3] and all(r[1] for r in got)
