"""Deep keys and the backoff kernel: the lattice keeps suffix order, and SQL counts the longest match.

- On SmolLM2's real vocabulary, lattice positions (projection/lattice.py) make distance order
  longest-suffix order: every context sharing a longer suffix with the query is strictly nearer
  than every context sharing a shorter one, in NumPy and through the GiST KNN (ht_knn).
- The backoff kernel (hartonomous/kernel.py) counts exactly the candidates in the radius rung of
  the nearest one; SQL next_token, on the native kernel's routing and on the PL/pgSQL path,
  returns the NumPy reference's rows for a hand-made lattice set, and the loops, batch and
  signals functions serve it.
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
from native_kernel import module_connection
from projection.lattice import lattice_cells, lattice_decay, lattice_positions, lattice_side
from projection.options import BuildOptions
from reference_next_token import AtomSetData, reference_candidates, reference_rows
from hartonomous.errors import UserError

WINDOW = 8


# --- the radius ladder ------------------------------------------------------------------------

def test_the_radius_is_the_smallest_rung_of_the_ladder_that_holds_the_nearest_candidate() -> None:
    h, d = 64.0, 1 / 8
    assert backoff_radius(0.0, h, d) == 0.0
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


def test_step_logits_refuses_a_backoff_set_with_a_clear_error(db, sets) -> None:
    if db.execute("SELECT ht_kernel()").fetchone()[0] != "native":
        pytest.skip("ht_step_logits is on the native kernel only")
    db.execute("SAVEPOINT refuse")
    with pytest.raises(psycopg.errors.FeatureNotSupported, match="backoff kernel"):
        db.execute("SELECT * FROM ht_step_logits(%s, NULL, 100, %s)", ([1, 2], sets["plain"].name))
    db.execute("ROLLBACK TO SAVEPOINT refuse")


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
