"""The two storage layouts of an atom set ('rows', 'tiles') give next_token exactly the same result.

The KNN's definition (sql/015_knn.sql): the K atoms nearest to the point, ordered by (distance,
token_id, weight), the distance computed as PostGIS's `<<->>` does. Each pair of sets below holds
the same atoms in both layouts; one pair has coordinates on a coarse grid, so that many atoms lie
at exactly the same distance (and at the same point with different tokens and weights), which is
where a KNN's tie-breaking shows. Tiles are tiny here (a few atoms) so that a query reads many.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hartonomous.atomset import (AtomRows, AtomSetSpec, TokenRows, drop_atom_set, load_atom_set,
                                 write_atom_set)
from hartonomous.errors import UserError
from native_kernel import require_native_kernel

VOCAB = 40
REPO = Path(__file__).resolve().parents[1]
SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow,
                                                                           HealthCheck.function_scoped_fixture])


@dataclass(frozen=True)
class Pair:
    rows: str
    tiles: str
    positions: np.ndarray
    token_ids: np.ndarray
    weights: np.ndarray


def _atoms(seed: int, n: int, grid: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    positions = rng.random((n, 3))
    if grid:
        positions = np.round(positions / grid) * grid
        positions[: n // 4] = positions[n // 4: n // 2]          # the same points, other tokens/weights
    token_ids = rng.integers(0, VOCAB, n)
    weights = rng.choice([0.5, 1.0, 2.0], n)
    return positions, token_ids, weights


def _write_pair(url: str, prefix: str, seed: int, n: int, grid: float | None, tile_atoms: int) -> Pair:
    positions, token_ids, weights = _atoms(seed, n, grid)
    tokens = TokenRows(np.arange(VOCAB), [f"t{i}" for i in range(VOCAB)],
                       np.random.default_rng(seed + 1).random((VOCAB, 3)))
    with psycopg.connect(url) as conn:
        for layout in ("rows", "tiles"):
            spec = AtomSetSpec(name=f"{prefix}-{layout}", model="m", vocab_size=VOCAB, embedding_dim=0,
                               projection="hand-made", kind="context", centroid_window=2, centroid_decay=0.5,
                               bandwidth=0.3, history_weight=0.7, history_window=16, layout=layout,
                               tile_atoms=tile_atoms)
            write_atom_set(conn, spec, tokens, AtomRows(token_ids, positions, weights), replace=True)
    return Pair(f"{prefix}-rows", f"{prefix}-tiles", positions, token_ids, weights)


@pytest.fixture(scope="module")
def pairs(server_url: str) -> Iterator[dict[str, Pair]]:
    made = {"smooth": _write_pair(server_url, "layout-smooth", 1, 3000, None, 5),
            "ties": _write_pair(server_url, "layout-ties", 2, 3000, 0.125, 7)}
    yield made
    with psycopg.connect(server_url) as conn:
        for pair in made.values():
            for name in (pair.rows, pair.tiles):
                drop_atom_set(conn, name)


@pytest.fixture(scope="module")
def reader(reader_url: str, pairs) -> Iterator[psycopg.Connection]:
    with psycopg.connect(reader_url, autocommit=True) as conn:
        yield conn


def _set_id(conn: psycopg.Connection, name: str) -> int:
    return conn.execute("SELECT id FROM atom_sets WHERE name = %s", (name,)).fetchone()[0]


def _knn(conn, name: str, center, k: int, radius: float | None) -> list[tuple]:
    return conn.execute("SELECT * FROM ht_knn(%s, ST_MakePoint(%s, %s, %s), %s, %s::float8)",
                        (_set_id(conn, name), *map(float, center), k, radius)).fetchall()


def _reference_knn(pair: Pair, center, k: int, radius: float | None) -> list[tuple]:
    """The definition in NumPy: the same float8 operations, sorted by (distance, token_id, weight)."""
    d = pair.positions - np.asarray(center, dtype=np.float64)
    dist = np.sqrt(d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2])
    order = np.lexsort((pair.weights, pair.token_ids, dist))[:k]
    return [(int(pair.token_ids[i]), float(pair.weights[i]), float(dist[i])) for i in order
            if radius is None or dist[i] <= radius]


coordinate = st.sampled_from([0.0, 0.125, 0.5, 0.875, 1.0]) | st.floats(-0.2, 1.2)
centers = st.tuples(coordinate, coordinate, coordinate)
radii = st.none() | st.floats(0.0, 0.6)


@SETTINGS
@given(kind=st.sampled_from(["smooth", "ties"]), center=centers, k=st.integers(1, 400), radius=radii)
def test_both_layouts_return_the_reference_knn(reader, pairs, kind, center, k, radius) -> None:
    pair = pairs[kind]
    expected = _reference_knn(pair, center, k, radius)
    assert _knn(reader, pair.rows, center, k, radius) == expected
    assert _knn(reader, pair.tiles, center, k, radius) == expected


def test_a_k_beyond_the_atom_count_returns_every_atom_in_both_layouts(reader, pairs) -> None:
    pair = pairs["ties"]
    rows = _knn(reader, pair.rows, (0.5, 0.5, 0.5), 5000, None)
    assert len(rows) == len(pair.token_ids)
    assert _knn(reader, pair.tiles, (0.5, 0.5, 0.5), 5000, None) == rows


contexts = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40)
sampler = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 0.7, 1.0]), "top_k": st.sampled_from([0, 5, 40]),
    "top_p": st.sampled_from([0.5, 0.9, 1.0]), "max_neighbors": st.integers(1, 300),
    "search_radius": st.none() | st.floats(0.05, 0.5), "repetition_penalty": st.sampled_from([1.0, 1.3]),
    "history_weight": st.none() | st.sampled_from([0.0, 2.0])})
NEXT_TOKEN = ("SELECT * FROM next_token(%(context)s::int[], %(temperature)s, %(top_k)s, %(top_p)s, "
              "%(search_radius)s::float8, %(max_neighbors)s, %(atom_set)s, %(repetition_penalty)s, "
              "%(history_weight)s::float8)")
BATCH = ("SELECT * FROM next_token_batch(%(contexts)s::jsonb, %(temperature)s, %(top_k)s, %(top_p)s, "
         "%(search_radius)s::float8, %(max_neighbors)s, %(atom_set)s, %(repetition_penalty)s, "
         "%(history_weight)s::float8)")


@SETTINGS
@given(kind=st.sampled_from(["smooth", "ties"]), context=contexts, args=sampler)
def test_next_token_rows_are_identical_in_both_layouts(reader, pairs, kind, context, args) -> None:
    pair = pairs[kind]
    rows = reader.execute(NEXT_TOKEN, {**args, "context": context, "atom_set": pair.rows}).fetchall()
    tiles = reader.execute(NEXT_TOKEN, {**args, "context": context, "atom_set": pair.tiles}).fetchall()
    assert tiles == rows


@settings(SETTINGS, max_examples=25)
@given(kind=st.sampled_from(["smooth", "ties"]), batch=st.lists(contexts, min_size=1, max_size=5), args=sampler)
def test_next_token_batch_rows_are_identical_in_both_layouts(reader, pairs, kind, batch, args) -> None:
    pair = pairs[kind]
    query = {**args, "contexts": json.dumps(batch)}
    rows = reader.execute(BATCH, {**query, "atom_set": pair.rows}).fetchall()
    # No rows is a valid answer too: a search_radius may hold no atom (then neither layout has any).
    assert reader.execute(BATCH, {**query, "atom_set": pair.tiles}).fetchall() == rows


@pytest.mark.parametrize("k", [1, 5, 40, 300])
def test_ties_across_the_kth_neighbour_keep_ht_knns_atoms(reader, pairs, k) -> None:
    """On the native kernel the rows layout reads the KNN in the index's order with ties and breaks
    a tie across the k-th row by ht_knn's rule in C; the lattice set has ties at every k, and the
    tiles layout (ht_knn's own ordering) must agree."""
    if reader.execute("SELECT ht_kernel()").fetchone()[0] != "native":
        require_native_kernel()
    pair = pairs["ties"]
    args = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "max_neighbors": k, "search_radius": None,
            "repetition_penalty": 1.0, "history_weight": 0.0, "context": [3, 1]}
    (before,) = reader.execute("SELECT knn_boundary_ties FROM htk_stats()").fetchone()
    rows = reader.execute(NEXT_TOKEN, {**args, "atom_set": pair.rows}).fetchall()
    (after,) = reader.execute("SELECT knn_boundary_ties FROM htk_stats()").fetchone()
    assert after == before + 1
    assert reader.execute(NEXT_TOKEN, {**args, "atom_set": pair.tiles}).fetchall() == rows


def test_the_set_records_its_layout_and_its_tiles_hold_every_atom_once(server_url, pairs) -> None:
    pair = pairs["ties"]
    with psycopg.connect(server_url) as conn:
        assert load_atom_set(conn, pair.rows).layout == "rows"
        assert load_atom_set(conn, pair.tiles).layout == "tiles"
        set_id = _set_id(conn, pair.tiles)
        sizes, unpacked, points, biggest = conn.execute(
            "SELECT array_agg(cardinality(token_ids) ORDER BY tile_id), "
            "       sum(cardinality(xs) + cardinality(ys) + cardinality(zs) + cardinality(weights)), "
            "       sum(ST_NumGeometries(atoms)), max(pg_column_size(t.*)) "
            "  FROM atom_tiles t WHERE atom_set_id = %s", (set_id,)).fetchone()
        stored = sorted(conn.execute(
            "SELECT u.t, u.w, u.x, u.y, u.z FROM atom_tiles, "
            "       unnest(token_ids, weights, xs, ys, zs) AS u(t, w, x, y, z) WHERE atom_set_id = %s",
            (set_id,)).fetchall())
        assert not conn.execute(f"SELECT count(*) FROM atom_tiles WHERE atom_set_id = {_set_id(conn, pair.rows)}"
                                ).fetchone()[0]
    n = len(pair.token_ids)
    assert sizes == [7] * (n // 7) + ([n % 7] if n % 7 else [])
    assert unpacked == 4 * n and points == n
    assert biggest < 8000, "a tile must fit one page"
    assert stored == sorted(zip(pair.token_ids.tolist(), pair.weights.tolist(), *pair.positions.T.tolist()))


def test_dropping_a_tiles_set_drops_its_tiles(server_url: str) -> None:
    pair = _write_pair(server_url, "layout-drop", 3, 50, None, 8)
    with psycopg.connect(server_url) as conn:
        set_id = _set_id(conn, pair.tiles)
        assert conn.execute("SELECT to_regclass(%s)", (f"atom_tiles_{set_id}",)).fetchone()[0] is not None
        drop_atom_set(conn, pair.tiles)
        drop_atom_set(conn, pair.rows)
        assert conn.execute("SELECT to_regclass(%s)", (f"atom_tiles_{set_id}",)).fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM atom_tiles WHERE atom_set_id = %s", (set_id,)).fetchone()[0] == 0


@pytest.mark.parametrize("layout, tile_atoms, message", [
    ("columns", 32, "layout must be one of rows, tiles, got 'columns'"),
    ("tiles", 0, "tile_atoms must be between 1 and 128, got 0"),
    ("tiles", 129, "tile_atoms must be between 1 and 128, got 129")])
def test_a_bad_layout_is_refused_before_anything_is_written(server_url, layout, tile_atoms, message) -> None:
    positions, token_ids, weights = _atoms(4, 20, None)
    spec = AtomSetSpec(name="layout-bad", model="m", vocab_size=VOCAB, embedding_dim=0, projection="p",
                       kind="context", layout=layout, tile_atoms=tile_atoms)
    tokens = TokenRows(np.arange(VOCAB), [None] * VOCAB, np.zeros((VOCAB, 3)))
    with psycopg.connect(server_url) as conn:
        with pytest.raises(UserError, match=message):
            write_atom_set(conn, spec, tokens, AtomRows(token_ids, positions, weights))
        assert conn.execute("SELECT count(*) FROM atom_sets WHERE name = 'layout-bad'").fetchone()[0] == 0


def test_build_with_a_bad_layout_prints_one_line_and_exits_non_zero() -> None:
    done = subprocess.run([sys.executable, "-m", "hartonomous.cli", "build", "--name", "x", "--layout", "heap"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["error: --layout must be one of rows, tiles, got 'heap'"]


def test_token_positions_come_from_the_blocks_and_equal_the_tokens_table(server_url: str) -> None:
    """ht_token_positions reads token_blocks (one row per 256 ids); a set without blocks (written
    before they existed) reads `tokens`; either way the positions are tokens.position, bit for bit,
    and NULL for an id the set lacks."""
    rng = np.random.default_rng(7)
    ids = np.array([0, 1, 5, 255, 256, 700, 701, 1500])            # gaps, block edges, empty blocks
    spec = AtomSetSpec(name="layout-blocks", model="m", vocab_size=1501, embedding_dim=0, projection="p",
                       kind="context")
    positions = rng.normal(size=(len(ids), 3))
    context = [700, 0, 1500, 3, 256, 255, 700, -1, 1 << 30, 5]
    expected = [tuple(positions[list(ids).index(t)]) if t in ids else (None, None, None) for t in context]
    with psycopg.connect(server_url) as conn:
        write_atom_set(conn, spec, TokenRows(ids, [None] * len(ids), positions),
                       AtomRows(ids[:2], positions[:2]), replace=True)
        set_id = _set_id(conn, "layout-blocks")
        blocks = [r[0] for r in conn.execute("SELECT block FROM token_blocks WHERE atom_set_id = %s ORDER BY block",
                                             (set_id,))]
        query = "SELECT * FROM ht_token_positions(%s, %s::int[])"
        from_blocks = list(zip(*conn.execute(query, (set_id, context)).fetchone()))
        conn.execute("DELETE FROM token_blocks WHERE atom_set_id = %s", (set_id,))
        from_tokens = list(zip(*conn.execute(query, (set_id, context)).fetchone()))
        conn.rollback()
        drop_atom_set(conn, "layout-blocks")
    assert blocks == [0, 1, 2, 5]
    assert from_blocks == expected and from_tokens == expected


def test_the_layouts_benchmark_measures_both_layouts_and_names_the_faster(server_url: str) -> None:
    from benchmarks import layouts

    results = layouts.run(server_url, sizes=(300, 600), calls=20)
    measured = {(r["layout"], r["atoms"], r["context_length"]) for r in results["rows"]}
    assert measured == {(lay, n, length) for lay in ("rows", "tiles") for n in (300, 600) for length in (512, 8)}
    for r in results["rows"]:
        assert 0 < r["in_db_p50_ms"] <= r["in_db_p95_ms"] and r["shared_buffers_p50"] > 0
    verdict = results["verdict"]
    assert verdict["faster"] in ("rows", "tiles") and verdict["at_atoms"] == 600
    assert set(verdict["p50_ratio_600_over_300"]) == {"rows", "tiles"}
    text = layouts.markdown(results, "hartonomous bench --layouts --sizes 300,600")
    assert f"**{verdict['faster']}**" in text and text.count("\n| rows |") == 4
    with psycopg.connect(server_url) as conn:
        for n in (300, 600):
            for layout in ("rows", "tiles"):
                drop_atom_set(conn, layouts.set_name(n, layout))
