"""Deep keys and the backoff kernel: the lattice keeps suffix order, and SQL counts the longest match.

- On SmolLM2's real vocabulary, lattice positions (projection/lattice.py) make distance order
  longest-suffix order: every context sharing a longer suffix with the query is strictly nearer
  than every context sharing a shorter one, in NumPy and through the GiST KNN (ht_knn).
- The backoff kernel (hartonomous/kernel.py) counts exactly the candidates in the radius rung of
  the nearest one; SQL next_token, on the native kernel's routing and on the PL/pgSQL path,
  returns the NumPy reference's rows for a hand-made lattice set, and the loops, batch and
  signals functions serve it.
- The native kernel runs it in C on every entry point (next_token with memory, ht_step_logits,
  the loops and the batch), with the PL/pgSQL reference's rows, tokens and signals, and without
  calling the reference's step (pg_stat_xact_user_functions, htk_stats).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from hand_sets import add_set
from hartonomous.centroid import context_centroid, prefix_centroids
from hartonomous.kernel import backoff_radius, token_logits
from hartonomous.signals import candidate_signals
from native_kernel import assert_same_rows, assert_same_rows_but, both, module_connection, nonzero, undecided_rows, use
from projection.lattice import lattice_cells, lattice_decay, lattice_positions, lattice_side
from projection.options import BuildOptions
from reference_next_token import AtomSetData, reference_candidates, reference_rows
from hartonomous.errors import UserError

WINDOW = 8


# --- the radius ladder ------------------------------------------------------------------------

def test_the_radius_is_the_smallest_rung_of_the_ladder_that_holds_the_nearest_candidate() -> None:
    h, d = 64.0, 1 / 8
    t = min(h * 1e-12, 1e-14)
    assert backoff_radius(0.0, h, d) == t                  # D = 0: the tolerance
    assert backoff_radius(t / 10, h, d) == t               # within the tolerance D counts as 0
    # the cap: on a wide ladder (h = 63.5) a 6-token match (D ~ 2e-13) is not merged with D = 0
    assert backoff_radius(0.0, 63.5, 1 / 128) == 1e-14 < 2e-13
    assert backoff_radius(50.0, h, d) == 64.0            # inside the top rung
    assert backoff_radius(7.0, h, d) == 8.0              # h d
    assert backoff_radius(0.9, h, d) == 1.0              # h d^2
    assert backoff_radius(100.0, h, d) == 512.0          # beyond h: h / d
    assert backoff_radius(8.0, h, d) == 8.0              # a rung holds what lies on it


def test_the_backoff_kernel_counts_only_the_longest_match_class() -> None:
    # two atoms of token 5 and one of token 7 in the nearest rung, ten of token 9 one rung out
    ids = np.array([5, 5, 7] + [9] * 10)
    dist = np.array([0.5, 0.7, 0.6] + [5.0] * 10)
    ids_out, logits = token_logits(ids, dist, np.ones(len(ids)), "backoff", 64.0, decay=1 / 8)
    assert ids_out.tolist() == [5, 7]
    assert logits == pytest.approx(np.log([2.0, 1.0]))


def test_backoff_needs_a_decay_below_one() -> None:
    with pytest.raises(ValueError, match="decay"):
        backoff_radius(1.0, 1.0, 1.0)
    with pytest.raises(UserError, match="decay below 1"):
        BuildOptions(name="x", kernel="backoff", decay=1.0).check()


def test_lattice_positions_need_a_context_set_and_learned_positions_refuse_the_backoff_kernel() -> None:
    with pytest.raises(UserError, match="--kind context"):
        BuildOptions(name="x", kind="token", positions="lattice").check()
    with pytest.raises(UserError, match="drop --kernel backoff"):
        BuildOptions(name="x", positions="learned", kernel="backoff", decay=0.5).check()
    options = BuildOptions(name="x", positions="lattice")
    options.check()
    assert (options.kernel, options.resolved_window(), options.resolved_decay(49152)) == ("backoff", 8, 1 / 128)


def test_full_keys_are_refused_at_scale_with_the_reason() -> None:
    with pytest.raises(UserError, match="GB at --max-tokens 10,000,000"):
        BuildOptions(name="x", full_keys=True, max_tokens=10_000_000).check()
    BuildOptions(name="x", full_keys=True, max_tokens=100_000).check()


# --- the lattice --------------------------------------------------------------------------------

def test_the_lattice_is_the_smallest_cube_and_its_decay_the_largest_that_keeps_suffix_order() -> None:
    assert lattice_side(49152) == 37 and lattice_side(27) == 3 and lattice_side(28) == 4
    for side in (3, 10, 37):
        d = lattice_decay(side)
        t = np.sqrt(3) * (side - 1) * d / (1 - d)
        assert t < 0.5 <= np.sqrt(3) * (side - 1) * (2 * d) / (1 - 2 * d)
        assert np.log2(d) == int(np.log2(d))             # a power of two: exact scaling


def test_consecutive_lattice_cells_are_neighbours() -> None:
    cells = lattice_cells(37).astype(np.int64)
    steps = np.abs(np.diff(cells, axis=0)).sum(axis=1)
    assert len(cells) == 37 ** 3 and len({tuple(c) for c in cells}) == len(cells)
    assert np.mean(steps == 1) > 0.95                    # the curve leaves the sub-cube only now and then


@pytest.fixture(scope="module")
def smollm2_lattice():
    """Lattice positions of SmolLM2's 49,152 tokens, placed from the build's default projection."""
    from hartonomous.model import load_model
    from projection.project import fit_projection

    embeddings = load_model("smollm2", "cpu").get_input_embeddings().weight.detach().float().numpy()
    return lattice_positions(fit_projection(embeddings, "lmds", 512, "kmeans++", "euclidean", 0).positions)


def suffix_family(rng: np.random.Generator, vocab: int, per_length: int = 30) -> tuple[np.ndarray, list]:
    """A random query context of WINDOW + 4 tokens, and contexts sharing exactly s = 0..WINDOW of its
    last tokens (the token before the shared suffix differs; older ones are random)."""
    query = rng.integers(0, vocab, WINDOW + 4)
    family = []
    for s in range(WINDOW + 1):
        for _ in range(per_length if s < WINDOW else 3):
            other = rng.integers(0, vocab, len(query))
            other[len(query) - s:] = query[len(query) - s:]
            if s < len(query):
                while other[-s - 1] == query[-s - 1]:
                    other[-s - 1] = rng.integers(0, vocab)
            family.append((s, other))
    return query, family


def key(positions: np.ndarray, ids: np.ndarray, decay: float) -> np.ndarray:
    return prefix_centroids(positions[ids], WINDOW, decay)[-1]


def test_knn_order_is_longest_suffix_order_on_the_real_vocabulary(smollm2_lattice) -> None:
    lat = smollm2_lattice
    assert lat.side == 37 and lat.decay == 1 / 128
    assert len(np.unique(lat.positions, axis=0)) == 49152
    rng = np.random.default_rng(0)
    for _ in range(200):
        query, family = suffix_family(rng, 49152)
        q = key(lat.positions, query, lat.decay)
        shared = np.array([s for s, _ in family])
        dist = np.array([np.linalg.norm(key(lat.positions, ids, lat.decay) - q) for _, ids in family])
        order = np.argsort(dist, kind="stable")
        assert np.all(np.diff(shared[order]) <= 0), "a shorter match came before a longer one"
        for s in range(WINDOW):                          # strictly: every longer match is nearer
            assert dist[shared > s].max() < dist[shared == s].min()
        assert np.all(dist[shared == WINDOW] == 0.0)     # the whole window shared: the same key, bit for bit


def test_the_gist_knn_returns_atoms_in_longest_suffix_order(conn, smollm2_lattice) -> None:
    """Atoms keyed by the family's contexts (token id = shared suffix length), read back by ht_knn
    through the float4 GiST boxes and the exact recheck on the stored doubles."""
    lat = smollm2_lattice
    rng = np.random.default_rng(1)
    query, family = suffix_family(rng, 49152, per_length=12)
    atoms = np.array([key(lat.positions, ids, lat.decay) for _, ids in family])
    s = AtomSetData(name="backoff_suffix_order", token_positions=lat.positions,
                    atom_tokens=np.array([s for s, _ in family]), atom_positions=atoms,
                    atom_weights=np.ones(len(family)), kernel="backoff", bandwidth=lat.ladder_top,
                    window=WINDOW, decay=lat.decay)
    set_id = add_set(conn, s)
    center = key(lat.positions, query, lat.decay)
    got = conn.execute("SELECT token_id, distance FROM ht_knn(%s, ST_MakePoint(%s, %s, %s), %s)",
                       (set_id, *map(float, center), len(family))).fetchall()
    sql_center = conn.execute("SELECT ST_X(c), ST_Y(c), ST_Z(c) FROM ht_context_centroid(%s, %s, %s, %s) x(c, k)",
                              (set_id, WINDOW, lat.decay, [int(t) for t in query])).fetchone()
    assert np.array_equal(np.array(sql_center), center)  # SQL keys the context exactly as the atoms were
    assert [t for t, _ in got] == sorted((t for t, _ in got), reverse=True)
    assert [t for t, _ in got][:3] == [WINDOW] * 3 and got[0][1] == 0.0
    (disk,) = conn.execute("SELECT (stats->'ingest'->>'disk_bytes')::bigint FROM atom_sets WHERE id = %s",
                           (set_id,)).fetchone()
    assert disk >= 8192 * 2                              # the partition's heap and its GiST index, at least a page each


# --- SQL next_token on a lattice set against the NumPy reference --------------------------------

def lattice_set(name: str, seed: int, history_weight: float = 0.0, window: int = 4) -> AtomSetData:
    """27 tokens on a 3^3 lattice; atoms are the contexts of a random text over the first 9 tokens
    (so contexts repeat and deep matches exist), each with the token that followed, merged."""
    rng = np.random.default_rng(seed)
    cells = lattice_cells(3).astype(np.float64) - 1.0
    positions = cells[rng.permutation(27)]
    decay = lattice_decay(3)
    text = rng.integers(0, 9, 3000)
    keys = prefix_centroids(positions[text], window, decay)[:-1]
    table = np.column_stack([text[1:], keys])
    merged, counts = np.unique(table, axis=0, return_counts=True)
    spread = np.sqrt(3) * 2
    t = spread * decay / (1 - decay)
    top = 0.5 * ((spread + t) + (1 - t) / decay) * (1 - decay)
    return AtomSetData(name=name, token_positions=positions, atom_tokens=merged[:, 0].astype(np.int64),
                       atom_positions=merged[:, 1:], atom_weights=counts.astype(np.float64), kernel="backoff",
                       bandwidth=top, window=window, decay=decay, history_weight=history_weight, history_window=64)


@pytest.fixture(scope="module", params=["native", "plpgsql"])
def db(server_url: str, request) -> Iterator[psycopg.Connection]:
    """A connection whose transaction spans the module, on either kernel setting."""
    with module_connection(server_url, request.param) as conn:
        yield conn


@pytest.fixture(scope="module")
def sets(db) -> dict[str, AtomSetData]:
    made = {"plain": lattice_set("backoff_plain", 1), "history": lattice_set("backoff_history", 2, 3.0)}
    for s in made.values():
        s.atom_set_id = add_set(db, s)
    return made


NEXT_TOKEN = "SELECT * FROM next_token(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_next_token_matches_the_numpy_reference(db, sets, data) -> None:
    s = sets[data.draw(st.sampled_from(sorted(sets)))]
    context = data.draw(st.lists(st.integers(0, 8), min_size=1, max_size=30))
    args = dict(temperature=data.draw(st.sampled_from([0.0, 0.7, 1.0])),
                top_k=data.draw(st.sampled_from([None, 0, 3, 40])),
                top_p=data.draw(st.sampled_from([None, 1.0, 0.9])),
                search_radius=data.draw(st.one_of(st.none(), st.floats(0.05, 3.0))),
                max_neighbors=data.draw(st.sampled_from([5, 100, 2000])),
                repetition_penalty=data.draw(st.sampled_from([1.0, 1.3])),
                history_weight=data.draw(st.sampled_from([None, 0.0, 2.0])), history_window=None)
    want, near = reference_rows(s, context, **args)
    assume(not near)
    got = db.execute(NEXT_TOKEN, (context, args["temperature"], args["top_k"], args["top_p"], args["search_radius"],
                                  args["max_neighbors"], s.name, args["repetition_penalty"], args["history_weight"],
                                  args["history_window"])).fetchall()
    assert [r[0] for r in got] == [r[0] for r in want]
    assert [r[1] for r in got] == pytest.approx([r[1] for r in want], abs=1e-9)


def test_next_token_runs_in_one_c_step_on_the_native_kernel(db, sets) -> None:
    if db.execute("SELECT ht_kernel()").fetchone()[0] != "native":
        pytest.skip("the PL/pgSQL path has no C steps")
    (before,) = db.execute("SELECT steps FROM htk_stats()").fetchone()
    db.execute(NEXT_TOKEN, ([1, 2, 3, 1, 2], 1.0, 40, 0.9, None, 100, sets["history"].name, 1.0, None, None))
    (after,) = db.execute("SELECT steps FROM htk_stats()").fetchone()
    assert after == before + 1


def test_a_deep_match_outvotes_a_frequent_short_one(db, sets) -> None:
    """The reference's greedy token is the majority continuation of the longest match in the data."""
    s = sets["plain"]
    context = [1, 2, 3, 4, 5, 6, 7]
    cand = reference_candidates(s, context, None, 2000, 0.0, None)
    radius = backoff_radius(cand.distances.min(), s.bandwidth, s.decay)
    inside = cand.distances <= radius
    assert 0 < inside.sum() < len(inside)                # the rung holds some candidates, not all
    (top,) = db.execute(NEXT_TOKEN, (context, 0.0, None, None, None, 2000, s.name, 1.0, 0.0, None)).fetchone()[:1]
    votes = np.bincount(cand.tokens[inside], weights=cand.weights[inside], minlength=s.vocab_size)
    assert top == int(np.argmax(votes))


def test_loops_batch_and_sampling_serve_a_backoff_set(db, sets) -> None:
    s = sets["history"]
    prompt = [1, 2, 3, 4]
    (generated,) = db.execute("SELECT generate_tokens(%s, 6, 0.0, 40, 0.9, NULL, 100, %s, 1.0, 7)",
                              (prompt, s.name)).fetchone()
    context = list(prompt)
    for token in generated:
        (top,) = db.execute(NEXT_TOKEN, (context, 0.0, 40, 0.9, None, 100, s.name, 1.0, None, None)).fetchone()[:1]
        assert token == top
        context.append(token)
    batch = db.execute("SELECT context_index, token_id, probability FROM next_token_batch(%s::jsonb, 1.0, 40, 0.9, "
                       "NULL, 100, %s)", ('[[1, 2, 3], [4, 5]]', s.name)).fetchall()
    single = db.execute(NEXT_TOKEN, ([4, 5], 1.0, 40, 0.9, None, 100, s.name, 1.0, None, None)).fetchall()
    assert [(t, p) for i, t, p in batch if i == 1] == [(t, pytest.approx(p, abs=1e-12)) for t, p, _ in single]
    drafted = db.execute("SELECT token_id FROM draft_tokens(%s, 3, 0.0, 40, 0.9, NULL, 100, %s) ORDER BY step",
                         (prompt, s.name)).fetchall()
    assert [t for (t,) in drafted] == list(generated[:3])


def test_signals_match_the_python_signals(db, sets) -> None:
    s = sets["history"]
    context = [3, 1, 4, 1, 5, 2, 6, 5, 3, 5]
    cand = reference_candidates(s, context, None, 100, None, None)
    want = candidate_signals(cand.tokens, cand.distances, cand.weights, cand.history, "backoff", s.bandwidth,
                             cand.nearest_stored, s.decay)
    row = db.execute("SELECT distinct_tokens, h, history_share, ln_top_stored_votes FROM next_token_signals(%s, "
                     "NULL, 100, %s)", (context, s.name)).fetchone()
    assert row[0] == want.distinct_tokens
    assert row[1:] == pytest.approx((want.h, want.history_share, want.ln_top_stored_votes), abs=1e-9)


def test_the_schema_refuses_a_backoff_set_without_a_contraction(db) -> None:
    db.execute("SAVEPOINT decay")
    with pytest.raises(psycopg.errors.CheckViolation, match="backoff_decay"):
        db.execute("UPDATE atom_sets SET centroid_decay = 1 WHERE kernel = 'backoff'")
    db.execute("ROLLBACK TO SAVEPOINT decay")


def test_the_python_key_is_the_centroid_definition() -> None:
    rng = np.random.default_rng(3)
    positions = rng.integers(-18, 19, (40, 3)).astype(np.float64)
    keys = prefix_centroids(positions, WINDOW, 1 / 128)
    for t in (0, 5, 39):
        assert keys[t] == pytest.approx(context_centroid(positions[:t + 1], WINDOW, 1 / 128), abs=1e-12)



# --- the native kernel runs the backoff kernel in C on every entry point --------------------------

TOL = 1e-12


@pytest.fixture(scope="module")
def native(db) -> psycopg.Connection:
    """The module's connection where it runs the native kernel (the sets are written in its
    transaction, which a second one would wait on), counting every function's calls in
    pg_stat_xact_user_functions (C functions included)."""
    if db.execute("SELECT ht_kernel()").fetchone()[0] != "native":
        pytest.skip("compares the native kernel with the reference side by side")
    db.execute("SET track_functions = 'all'")
    return db


@pytest.fixture(scope="module")
def native_sets(native, sets) -> dict[str, AtomSetData]:
    """The lattice sets, each with a memory of two past generations (read only with memory => true)."""
    for s in sets.values():
        native.execute("SELECT remember(%s, %s, %s, 'exact', temperature => 0)", (s.name, [1, 2, 3, 4], [5, 6, 7, 8, 1, 2]))
        native.execute("SELECT remember(%s, %s, %s, 'exact', temperature => 0)", (s.name, [8, 7, 6], [5, 4, 3, 2, 8, 7, 6]))
    return sets


def calls(conn: psycopg.Connection, *functions: str) -> dict[str, int]:
    """This transaction's calls of each function so far."""
    rows = dict(conn.execute("SELECT funcname, sum(calls)::integer FROM pg_stat_xact_user_functions "
                             "WHERE funcname = ANY(%s) GROUP BY funcname", (list(functions),)).fetchall())
    return {f: rows.get(f, 0) for f in functions}


def c_steps(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT steps FROM htk_stats()").fetchone()[0]


NAMED = ("SELECT * FROM next_token(%(context)s, %(temperature)s, %(top_k)s, %(top_p)s, %(search_radius)s, "
         "%(max_neighbors)s, %(atom_set)s, %(repetition_penalty)s, %(history_weight)s, %(history_window)s, "
         "%(memory)s)")
backoff_calls = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 0.7, 1.0]), "top_k": st.sampled_from([None, 0, 3, 40]),
    "top_p": st.sampled_from([None, 1.0, 0.9]), "search_radius": st.none() | st.floats(0.05, 3.0),
    "max_neighbors": st.sampled_from([5, 100, 2000]), "repetition_penalty": st.sampled_from([1.0, 1.3]),
    "history_weight": st.sampled_from([None, 0.0, 2.0]), "history_window": st.sampled_from([None, 3])})


def assert_same_step(conn, params: dict, got: list, want: list) -> None:
    """Native and reference rows agree to TOL, but for rows a tie at the top-k boundary or the top-p
    cut lets rounding decide (native_kernel.undecided_rows); at T = 0 tied picks may differ."""
    if params["temperature"] == 0 and got != want:
        use(conn, "plpgsql")
        relaxed = conn.execute(NAMED, {**params, "temperature": 1.0, "top_k": 0, "top_p": 1.0}).fetchall()
        use(conn, "")
        p = {r[0]: r[1] for r in relaxed}
        assert p[got[0][0]] == pytest.approx(p[want[0][0]], abs=TOL), (got, want)
        return
    try:
        assert_same_rows(nonzero(got), nonzero(want), TOL)
    except AssertionError:
        use(conn, "plpgsql")
        relaxed = conn.execute(NAMED, {**params, "temperature": params["temperature"], "top_k": 0,
                                       "top_p": 1.0}).fetchall()
        use(conn, "")
        undecided = undecided_rows(relaxed, params["top_k"], params["top_p"])
        if not undecided:
            raise
        assert_same_rows_but(nonzero(got), nonzero(want), undecided, TOL)


@settings(max_examples=60, deadline=None)
@given(which=st.sampled_from(["plain", "history"]), context=st.lists(st.integers(0, 8), min_size=1, max_size=30),
       memory=st.booleans(), args=backoff_calls)
def test_native_next_token_is_the_reference_with_and_without_memory(native, native_sets, which, context, memory,
                                                                     args) -> None:
    params = {**args, "context": context, "atom_set": native_sets[which].name, "memory": memory}
    before = calls(native, "ht_next_token", "htk_distribution")
    use(native, "")
    got = native.execute(NAMED, params).fetchall()
    after = calls(native, "ht_next_token", "htk_distribution")
    assert after["ht_next_token"] == before["ht_next_token"]          # the reference's step did not run
    if memory:
        assert after["htk_distribution"] == before["htk_distribution"] + 1
    use(native, "plpgsql")
    want = native.execute(NAMED, params).fetchall()
    use(native, "")
    assert_same_step(native, params, got, want)


def test_memory_changes_the_backoff_rows(native, native_sets) -> None:
    """The memory is read: the remembered continuation 8 7 6 -> 5 is the deepest match after it."""
    s = native_sets["plain"]
    args = dict(context=[8, 7, 6], temperature=1.0, top_k=0, top_p=1.0, search_radius=None, max_neighbors=100,
                atom_set=s.name, repetition_penalty=1.0, history_weight=0.0, history_window=None)
    without, _ = both(native, NAMED, {**args, "memory": False})
    got, want = both(native, NAMED, {**args, "memory": True})
    assert got != without
    assert_same_rows(got, want, TOL)


SIGNAL_COLUMNS = ("h, h2, varentropy, r, top_probability, nearest_bandwidths, history_share, distinct_tokens, "
                  "ln_top_nearest_bandwidths, ln_top_stored_votes, ln_top_history_nearest_bandwidths, risk, "
                  "predicted_gap")


@settings(max_examples=60, deadline=None)
@given(which=st.sampled_from(["plain", "history"]), context=st.lists(st.integers(0, 8), min_size=1, max_size=30),
       args=backoff_calls)
def test_step_logits_serve_a_backoff_set_with_the_references_signals_and_rows(native, native_sets, which, context,
                                                                              args) -> None:
    from hartonomous.backends.spatial import sample_logits
    from hartonomous.generation_config import SamplerArgs

    use(native, "")
    params = {**args, "context": context, "atom_set": native_sets[which].name, "memory": False}
    fn_args = "(%(context)s, %(search_radius)s, %(max_neighbors)s, %(atom_set)s, %(history_weight)s, %(history_window)s)"
    before = c_steps(native), calls(native, "htk_step_logits")["htk_step_logits"]
    (got,) = native.execute(f"SELECT {SIGNAL_COLUMNS} FROM ht_step_logits{fn_args}", params).fetchall()
    assert calls(native, "htk_step_logits")["htk_step_logits"] == before[1] + 1
    (want,) = native.execute(f"SELECT {SIGNAL_COLUMNS} FROM next_token_signals{fn_args}", params).fetchall()
    assert [v is None for v in got] == [v is None for v in want]
    assert [v for v in got if v is not None] == pytest.approx([v for v in want if v is not None], abs=1e-9)
    ids, logits = native.execute(f"SELECT token_ids, logits FROM ht_step_logits{fn_args}", params).fetchone()
    dist = sample_logits(ids, logits, context, SamplerArgs(args["temperature"], args["top_k"],
                                                           1.0 if args["top_p"] is None else args["top_p"],
                                                           args["repetition_penalty"]))
    use(native, "plpgsql")
    rows = native.execute(NAMED, params).fetchall()
    use(native, "")
    assert_same_step(native, params, list(zip(dist.token_ids, dist.probabilities)), [r[:2] for r in rows])


def test_htk_logits_on_arrays_is_the_step_logits(native, native_sets) -> None:
    """ht_step_logits' SQL path (the tiles layout) calls htk_logits with the keys and the KNN as arrays:
    the same record as the whole step in C."""
    s = native_sets["history"]
    context = [3, 1, 4, 1, 5, 2, 6, 5, 3, 5]
    whole = native.execute("SELECT * FROM htk_step_logits(%s, %s, %s, %s, 'backoff', %s, %s, %s, 100, 1.5)",
                           (s.atom_set_id, s.window, s.decay, s.history_window, s.bandwidth, s.history_weight,
                            context)).fetchone()
    arrays = native.execute(
        "SELECT l.* FROM (SELECT htk_keys(ht_context_positions(%(id)s, %(ctx)s), %(w)s, %(d)s, %(hw)s) k) k,"
        " ht_knn_arrays(%(id)s, ST_MakePoint(k.k[1], k.k[2], k.k[3]), 100, NULL) n,"
        " htk_logits(%(ctx)s, k.k, n.token_ids, n.weights, n.distances, 'backoff', %(h)s, %(d)s, %(hwt)s, 1.5) l",
        dict(id=s.atom_set_id, ctx=context, w=s.window, d=s.decay, hw=s.history_window, h=s.bandwidth,
             hwt=s.history_weight)).fetchone()
    assert whole[0] == arrays[0]
    assert whole[1] == pytest.approx(arrays[1], abs=TOL)
    assert whole[2:] == pytest.approx(arrays[2:], abs=TOL)


@settings(max_examples=25, deadline=None)
@given(which=st.sampled_from(["plain", "history"]), context=st.lists(st.integers(0, 8), min_size=1, max_size=20),
       seed=st.integers(0, 2**31), args=backoff_calls)
def test_the_loops_and_the_batch_run_the_backoff_kernel_in_c(native, native_sets, which, context, seed, args) -> None:
    """generate_tokens, sample_next_token, draft_tokens, draft_tree and next_token_batch give the
    reference's tokens and rows, each step a C step (htk_stats' counter), the reference's never."""
    name = native_sets[which].name
    p = {**args, "context": context, "atom_set": name, "seed": seed, "memory": False}
    tail = "%(repetition_penalty)s, %(seed)s"
    hist = "history_weight => %(history_weight)s, history_window => %(history_window)s"
    sampler = "%(temperature)s, %(top_k)s, %(top_p)s, %(search_radius)s, %(max_neighbors)s, %(atom_set)s"
    queries = {
        "generate_tokens": (f"SELECT generate_tokens(%(context)s, 8, {sampler}, {tail}, {hist})", 8),
        "sample_next_token": (f"SELECT sample_next_token(%(context)s, {sampler}, {tail}, 3, {hist})", 1),
        "draft_tokens": (f"SELECT step, token_id, token_ids, probabilities FROM draft_tokens(%(context)s, 5, {sampler}, "
                         f"{tail}, {hist})", 5),
        "draft_tree": ("SELECT * FROM draft_tree(%(context)s, 3, 2, %(search_radius)s, %(max_neighbors)s, %(atom_set)s, "
                       f"%(repetition_penalty)s, {hist})", None),
        "next_token_batch": (f"SELECT * FROM next_token_batch(%(batch)s::jsonb, {sampler}, %(repetition_penalty)s, "
                             "%(history_weight)s, %(history_window)s)", 2),
    }
    p["batch"] = f"[{context}, [4, 5]]"
    for fn, (sql, steps) in queries.items():
        before_steps, before_ref = c_steps(native), calls(native, "ht_next_token", "ht_sample")
        use(native, "")
        got = native.execute(sql, p).fetchall()
        assert calls(native, "ht_next_token", "ht_sample") == before_ref, fn
        ran = c_steps(native) - before_steps
        assert ran >= 1 and (steps is None or ran <= steps), (fn, ran)
        use(native, "plpgsql")
        want = native.execute(sql, p).fetchall()
        use(native, "")
        if fn == "next_token_batch":
            for i in (0, 1):
                rows_got, rows_want = [r[1:] for r in got if r[0] == i], [r[1:] for r in want if r[0] == i]
                assert_same_step(native, {**p, "context": context if i == 0 else [4, 5]}, rows_got, rows_want)
        elif fn == "draft_tokens":
            assert [r[:2] for r in got] == [r[:2] for r in want] or args["temperature"] > 0, (got, want)
        elif args["temperature"] == 0 or fn == "draft_tree":
            assert got == want, (fn, got, want)


def test_the_spatial_backend_takes_one_c_call_per_step_on_a_backoff_set(native, native_sets) -> None:
    """The hybrid and adaptive paths ask for a step's signals and distribution together: on a
    backoff set that is one ht_step_logits call, giving next_token's own rows."""
    from hartonomous.backends.spatial import SpatialBackend
    from hartonomous.generation_config import SamplerArgs

    use(native, "")
    backend = SpatialBackend(native, native_sets["history"].name, tokenizer=object())
    assert backend.native
    state = backend.start([1, 2, 3, 4, 5, 1, 2])
    before = calls(native, "htk_step_logits")["htk_step_logits"]
    backend.signals(state)
    dist = backend.distribution(state, SamplerArgs(1.0, 0, 1.0, 1.0))
    assert calls(native, "htk_step_logits")["htk_step_logits"] == before + 1
    rows = native.execute("SELECT token_id, probability FROM next_token(%s, 1.0, 0, 1.0, atom_set => %s)",
                          (state.ids, native_sets["history"].name)).fetchall()
    got = dict(zip(dist.token_ids, dist.probabilities))
    assert sorted(got) == sorted(r[0] for r in rows)
    assert [got[token] for token, _ in rows] == pytest.approx([p for _, p in rows], abs=1e-12)
    assert not SpatialBackend(native, native_sets["history"].name, tokenizer=object(), memory=True).native
