"""store_distribution: the store's own distribution and its features, per prefix, in one call.

- On the native kernel (htk_store) it is the PL/pgSQL reference (ht_store_step) within 1e-12, for a
  backoff lattice set and a gaussian set, with and without history atoms and the memory.
- Its probabilities are next_token's at temperature 1 without top-k, top-p or penalty, memory
  included (the KNN's stored and memory atoms merged by ht_knn's rule 4).
- positions = P gives the rows of P single calls; the features are the NumPy reference's
  (hartonomous/store.py store_step) on the same candidates; bad arguments raise 22023 naming them;
  the reader role may call it.
- Without memory, the native kernel serves a call in C from the session's kept context state
  (htk_store_step): a context growing by one token computes one key a call, whatever positions;
  a context that leaves the kept one (a rollback, a new generation, a return) cuts it back to the
  common prefix; every row is the per-prefix path's (htk_keys, ht_store_knn, htk_store) bit for
  bit, and the reference's within 1e-12.
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
    """A backoff and a gaussian set, and an exponential one whose keys come from running sums (no
    window, decay 0.97), each with a memory of two past generations."""
    made = {"backoff": lattice_set("store_backoff", 2),
            "gaussian": random_set("store_gauss", 7, kernel="gaussian", bandwidth=0.15, window=3, decay=0.6,
                                   history_weight=1.5, history_window=8),
            "running": random_set("store_running", 9, kernel="exponential", bandwidth=0.2, decay=0.97,
                                  history_weight=1.0, history_window=16)}
    for s in made.values():
        s.atom_set_id = add_set(db, s)
        db.execute("SELECT remember(%s, %s, %s, 'exact', temperature => 0)", (s.name, [1, 2, 3, 4], [5, 6, 7, 8, 1, 2]))
        db.execute("SELECT remember(%s, %s, %s, 'exact', temperature => 0)", (s.name, [8, 7, 6], [5, 4, 3, 2, 8, 7, 6]))
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


# --- the kept context state (htk_store_step) --------------------------------------------------------

PER_PREFIX = """
SELECT %(prefix_length)s, r.token_ids, r.probabilities, r.nearest_bandwidths, r.rung, r.matched_mass, r.candidates,
       r.top_probability, r.entropy, r.stored_share, r.history_share, r.memory_share
  FROM ht_atom_set(%(atom_set)s, %(history_weight)s, %(history_window)s) s,
       LATERAL (SELECT htk_keys(ht_context_positions(s.id, %(prefix)s), s.centroid_window,
                                s.centroid_decay, s.history_window) AS keys) k,
       LATERAL ht_store_knn(s.id, ST_MakePoint(k.keys[1], k.keys[2], k.keys[3]), %(max_neighbors)s, false) n,
       LATERAL htk_store(%(prefix)s, k.keys, n.token_ids, n.weights, n.distances, n.memory, s.kernel,
                         s.bandwidth, s.centroid_decay, s.history_weight) r"""


def per_prefix_rows(db, params: dict) -> list[tuple]:
    """The rows of the per-prefix native path (the positions read, the keys computed, the KNN run in SQL
    for each prefix): what store_distribution returns without the kept state."""
    n = len(params["context"])
    return [db.execute(PER_PREFIX, {**params, "prefix": params["context"][:length], "prefix_length": length})
            .fetchone() for length in range(n - params["positions"] + 1, n + 1)]


def keys_computed(db) -> int:
    return db.execute("SELECT keys_computed FROM htk_stats()").fetchone()[0]


@pytest.fixture
def native(db, kernels) -> None:
    if "" not in kernels:
        pytest.skip("the kept context state is the native kernel's")
    db.execute("SELECT set_config('hartonomous.kernel', '', true)")


def store_params(s: AtomSetData, context: list[int], positions: int, history_weight: float | None = None) -> dict:
    return {"context": context, "atom_set": s.name, "max_neighbors": 100, "history_weight": history_weight,
            "history_window": None, "memory": False, "positions": positions}


@pytest.mark.parametrize("which", ["backoff", "gaussian", "running"])
@pytest.mark.parametrize("positions", [1, 8])
def test_a_growing_context_computes_one_key_a_call_and_gives_the_per_prefix_rows(db, sets, native, which,
                                                                                   positions) -> None:
    """As generation calls it: ctx[:n] for n = 20 .. 44. After the first call each computes the new
    token's key only (the other P - 1 prefixes' keys are kept), and its rows are the per-prefix path's,
    bit for bit, and the reference's within 1e-12."""
    s = sets[which]
    rng = np.random.default_rng(11 + positions)
    context = [int(t) for t in rng.integers(0, 9, 44)]
    for n in range(20, 45):
        params = store_params(s, context[:n], positions)
        before = keys_computed(db)
        got = rows(db, "", params)
        if n > 20:
            assert keys_computed(db) - before == 1, n
        assert got == per_prefix_rows(db, params)
        if n % 8 == 0:
            for got_row, want_row in zip(got, rows(db, "plpgsql", params)):
                assert_same_row(got_row, want_row)


@pytest.mark.parametrize("which", ["backoff", "gaussian", "running"])
def test_a_context_that_leaves_the_kept_one_cuts_it_back(db, sets, native, which) -> None:
    """A rejected draft rolled back and replaced, a new generation, and the first context again: each
    computes the keys of the tokens past the common prefix only, and gives the per-prefix rows."""
    s = sets[which]
    rng = np.random.default_rng(23)
    context = [int(t) for t in rng.integers(0, 9, 40)]
    rows(db, "", store_params(s, context, 4))
    changed = 5
    rolled_back = context[:-changed] + [(t + 1) % 9 for t in context[-changed:]]    # the last 5 differ
    other = [int(t) for t in rng.integers(0, 9, 30)]
    other[0] = (context[0] + 1) % 9                                 # shares no prefix with the first
    for ctx, new_keys in ((rolled_back, changed), (other, len(other)), (context, changed)):
        params = store_params(s, ctx, 4)
        before = keys_computed(db)
        got = rows(db, "", params)
        assert keys_computed(db) - before == new_keys, ctx
        assert got == per_prefix_rows(db, params)
        for got_row, want_row in zip(got, rows(db, "plpgsql", params)):
            assert_same_row(got_row, want_row)


def test_positions_and_history_arguments_read_the_kept_keys(db, sets, native) -> None:
    """positions = P for P = 1 .. 16 and history on or off over one kept context: no key computed
    after the first call, every row the per-prefix path's, and the P rows those of P single calls."""
    s = sets["gaussian"]
    context = [int(t) for t in np.random.default_rng(31).integers(0, 9, 16)]
    rows(db, "", store_params(s, context, 1))
    before = keys_computed(db)
    for history_weight in (None, 0.0, 2.0):
        for positions in (1, 2, 7, 16):
            params = store_params(s, context, positions, history_weight)
            got = rows(db, "", params)
            assert got == per_prefix_rows(db, params)
            assert [r[0] for r in got] == list(range(17 - positions, 17))
    assert keys_computed(db) == before
    many = rows(db, "", store_params(s, context, 16))
    assert many == [rows(db, "", store_params(s, context[:n], 1))[0] for n in range(1, 17)]


def test_memory_and_a_foreign_token_take_the_checked_path(db, sets, native) -> None:
    """With memory the C step does not serve the call (as next_token's): no key is computed there. A
    token the set lacks is named by the checked path."""
    s = sets["backoff"]
    before = keys_computed(db)
    got = rows(db, "", {**store_params(s, [8, 7, 6, 5], 2), "memory": True})
    assert keys_computed(db) == before and [r[0] for r in got] == [3, 4]
    db.execute("SAVEPOINT foreign_token")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="^context"):
        rows(db, "", store_params(s, [1, 2, 999], 1))
    db.execute("ROLLBACK TO SAVEPOINT foreign_token")


STEP = "SELECT prefix_length FROM htk_store_step(%s::integer[], %s, %s, %s::float8, %s, %s)"


@pytest.mark.parametrize("argument, value", [
    (0, None), (0, []), (0, [1, None]), (0, [[1, 2], [3, 4]]), (0, [1, 2, 999]), (1, "no such set"),
    (2, None), (2, 0), (2, 100001), (3, -1.0), (3, float("nan")), (3, float("inf")), (4, -1), (4, 4097),
    (5, None), (5, 0), (5, 4),
])
def test_the_c_step_serves_nothing_it_should_not(db, sets, native, argument, value) -> None:
    """htk_store_step answers no rows where store_distribution's checked path must answer (and raise):
    each bad argument, an unknown set, a token the set lacks."""
    good = [[1, 2, 3], sets["gaussian"].name, 100, None, None, 2]
    assert [r[0] for r in db.execute(STEP, good).fetchall()] == [2, 3]
    bad = [value if i == argument else v for i, v in enumerate(good)]
    assert db.execute(STEP, bad).fetchall() == []


def test_the_reader_role_is_served_in_c(db, sets, native) -> None:
    db.execute("SAVEPOINT reader_c")
    db.execute("SET LOCAL ROLE hartonomous_reader")
    params = store_params(sets["backoff"], [8, 7, 6, 5, 4], 3)
    got = db.execute(STORE, params).fetchall()
    served = db.execute("SELECT count(*) FROM htk_store_step(%(context)s, %(atom_set)s, %(max_neighbors)s, "
                        "%(history_weight)s, %(history_window)s, %(positions)s)", params).fetchone()[0]
    db.execute("ROLLBACK TO SAVEPOINT reader_c")
    assert served == 3 and [r[0] for r in got] == [3, 4, 5] and got == per_prefix_rows(db, params)
