"""Synthetic atom sets for scale benchmarks: uniform random atoms in the unit cube.

Each set has 1,000 tokens at uniform random positions and `centroid_window = 1`, so the query
point of a context is its last token's position: the KNN searches land uniformly over the
cube, as they do for context atom sets keyed by the last token. (With the whole context
averaged, 8 random positions would put every query within ~0.1 of the cube's centre, a region
that stays cached and flatters large sets.)
"""

from __future__ import annotations

import numpy as np
import psycopg

from hartonomous.atomset import (INDEX_LAYOUT, AtomRows, AtomSetSpec, BuildStats, IngestReport, SyntheticStats,
                                 TokenRows, atom_set_exists, load_atom_set, write_atom_set)

SYNTHETIC_VOCAB = 1000


def synthetic_name(n_atoms: int) -> str:
    return f"bench-synthetic-{n_atoms}"


def stored_layout(conn: psycopg.Connection, name: str) -> tuple[bool, str | None]:
    """(exists, the index layout it was built with)."""
    if not atom_set_exists(conn, name):
        conn.commit()
        return False, None
    stats = load_atom_set(conn, name).stats
    conn.commit()
    return True, stats.synthetic.layout if stats.synthetic else None


def ensure_synthetic_atom_set(conn: psycopg.Connection, n_atoms: int, seed: int = 0,
                              rebuild: bool = False) -> IngestReport | None:
    """Create `bench-synthetic-<n>` unless it exists with the current index layout; returns the
    ingest report when it was built now."""
    name = synthetic_name(n_atoms)
    exists, layout = stored_layout(conn, name)
    if exists and layout == INDEX_LAYOUT and not rebuild:
        return None
    rng = np.random.default_rng(seed)
    spec = AtomSetSpec(name=name, model="synthetic", vocab_size=SYNTHETIC_VOCAB, embedding_dim=0,
                       projection="synthetic", kind="context", centroid_window=1,
                       stats=BuildStats(synthetic=SyntheticStats(distribution="uniform unit cube", seed=seed,
                                                                 layout=INDEX_LAYOUT)))
    tokens = TokenRows(np.arange(SYNTHETIC_VOCAB), [f"tok{i}" for i in range(SYNTHETIC_VOCAB)],
                       rng.random((SYNTHETIC_VOCAB, 3)))
    atoms = AtomRows(rng.integers(0, SYNTHETIC_VOCAB, n_atoms), rng.random((n_atoms, 3)))
    return write_atom_set(conn, spec, tokens, atoms, replace=True)


def stored_ingest(conn: psycopg.Connection, name: str) -> dict | None:
    """The ingest timings recorded in atom_sets.stats when the set was built, with the date."""
    if not atom_set_exists(conn, name):
        conn.commit()
        return None
    found = load_atom_set(conn, name)
    conn.commit()
    if found.stats.ingest is None:
        return None
    built = found.created_at.strftime("%Y-%m-%d %H:%M") if found.created_at else None
    return {**found.stats.ingest.model_dump(mode="json"), "built_at": built}


def random_contexts(n: int, vocab: int, length: int = 8, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, (n, length)).tolist()
