"""Routing keys (migration 0018) on a single node: which sets route, the cell codes, and that
nothing routes here.

A set routes when its keys provably stay in their tokens' lattice cells: integer token positions
and decay x (the widest axis range) below 1/2 (hartonomous/atomset/routing.py). Its atoms carry
the cell code of their position, computed by the build in NumPy and by ht_route_cell in SQL, and
the two must agree bit for bit: on Citus the build places an atom by the one and the KNN looks
for it by the other. On a single node `ht_routes()` is false and the KNN never reads `route`
(tests/test_citus.py covers the cluster).
"""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, write_atom_set
from hartonomous.atomset.routing import atom_routes, route_cells, route_spread
from hartonomous.centroid import prefix_centroids

SIDE, DECAY, WINDOW, VOCAB = 5, 1 / 16, 4, 100


def lattice() -> np.ndarray:
    axis = np.arange(SIDE)
    return np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), axis=-1).reshape(-1, 3)[:VOCAB] - (SIDE - 1) / 2


def test_a_lattice_routes_with_its_decayed_spread() -> None:
    assert route_spread(lattice(), DECAY, WINDOW) == pytest.approx((SIDE - 1) * DECAY)


@pytest.mark.parametrize("positions, decay, window, why", [
    (lattice() + 0.25, DECAY, WINDOW, "positions off the integer cells"),
    (lattice(), 0.2, WINDOW, "a decay whose spread reaches 1/2"),
    (lattice(), DECAY, None, "no window: not a context set"),
    (np.zeros((VOCAB, 3)), DECAY, WINDOW, "every token on one cell: spread 0"),
])
def test_sets_whose_keys_may_leave_their_cells_do_not_route(positions, decay, window, why) -> None:
    assert route_spread(positions, decay, window) is None, why


def test_the_keys_of_a_lattice_corpus_stay_within_the_spread_and_foreign_atoms_refuse_routing() -> None:
    rng = np.random.default_rng(0)
    cells = lattice()
    keys = prefix_centroids(cells[rng.integers(0, VOCAB, 5000)], WINDOW, DECAY)
    spread = route_spread(cells, DECAY, WINDOW)
    routes = atom_routes(keys, spread)
    assert routes is not None and np.array_equal(routes, route_cells(np.rint(keys)))
    assert atom_routes(rng.random((50, 3)), spread) is None
    assert atom_routes(keys, None) is None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(*[st.floats(-1000, 1000, allow_nan=False)] * 3), min_size=1, max_size=20))
def test_the_cell_code_is_sqls_bit_for_bit(conn: psycopg.Connection, points) -> None:
    points = np.array(points, dtype=np.float64)
    sql = [conn.execute("SELECT ht_route_cell(%s, %s, %s)", tuple(map(float, p))).fetchone()[0] for p in points]
    assert route_cells(points).tolist() == sql


def test_half_way_points_round_to_even_in_both(conn: psycopg.Connection) -> None:
    halves = np.array([[0.5, 1.5, -2.5], [-0.5, 2.5, 3.5]])
    assert route_cells(halves).tolist() == route_cells(np.array([[0.0, 2.0, -2.0], [0.0, 2.0, 4.0]])).tolist()
    assert route_cells(halves).tolist() == [
        conn.execute("SELECT ht_route_cell(%s, %s, %s)", tuple(map(float, p))).fetchone()[0] for p in halves]


def test_keys_within_rounding_of_the_spread_still_route() -> None:
    spread = (SIDE - 1) * DECAY
    assert atom_routes(np.array([[spread + 1e-14, 0.0, 0.0]]), spread) is not None
    assert atom_routes(np.array([[spread + 1e-6, 0.0, 0.0]]), spread) is None


def test_a_build_stores_the_routes_and_the_single_node_does_not_route(conn: psycopg.Connection) -> None:
    rng = np.random.default_rng(1)
    cells = lattice()
    chain = rng.integers(0, VOCAB, 3001)
    keys = prefix_centroids(cells[chain[:-1]], WINDOW, DECAY)
    tokens = TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)], cells)
    with conn.transaction(force_rollback=True):
        ids = {}
        for name, positions, atoms in (("routetest_lattice", cells, keys),
                                        ("routetest_random", rng.random((VOCAB, 3)), rng.random((3000, 3)))):
            spec = AtomSetSpec(name=name, model="test", vocab_size=VOCAB, embedding_dim=3, projection="lattice",
                               kind="context", centroid_window=WINDOW, centroid_decay=DECAY, kernel="backoff",
                               bandwidth=1.0)
            ids[name] = write_atom_set(conn, spec, TokenRows(tokens.token_ids, tokens.texts, positions),
                                       AtomRows(chain[1:], atoms)).atom_set_id
        spreads = dict(conn.execute("SELECT name, route_spread FROM atom_sets WHERE name LIKE 'routetest_%'").fetchall())
        assert spreads == {"routetest_lattice": pytest.approx((SIDE - 1) * DECAY), "routetest_random": None}
        (wrong,) = conn.execute(
            "SELECT count(*) FROM atoms WHERE atom_set_id = %s "
            "AND route IS DISTINCT FROM ht_route_cell(ST_X(position), ST_Y(position), ST_Z(position))",
            (ids["routetest_lattice"],)).fetchone()
        assert wrong == 0
        (wrong,) = conn.execute("SELECT count(*) FROM atoms WHERE atom_set_id = %s AND route IS DISTINCT FROM atom_id",
                                (ids["routetest_random"],)).fetchone()
        assert wrong == 0
        conn.execute("SET hartonomous.knn_routed = 0")
        conn.execute("SET hartonomous.knn_fanned_out = 0")
        rows = conn.execute("SELECT * FROM next_token(%s, atom_set => 'routetest_lattice')",
                            ([int(t) for t in chain[:6]],)).fetchall()
        assert rows
        assert conn.execute("SELECT ht_routes(), routed, fanned_out FROM knn_routing()").fetchone() == (False, 0, 0)
