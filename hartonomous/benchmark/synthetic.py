"""Synthetic atom sets for scale benchmarks: uniform random atoms in the unit cube."""

from __future__ import annotations

import numpy as np
import psycopg

from projection.ingest import AtomRows, AtomSetSpec, IngestReport, TokenRows, write_atom_set

SYNTHETIC_VOCAB = 1000


def synthetic_name(n_atoms: int) -> str:
    return f"bench-synthetic-{n_atoms}"


def ensure_synthetic_atom_set(conn: psycopg.Connection, n_atoms: int, seed: int = 0,
                              rebuild: bool = False) -> IngestReport | None:
    """Create `bench-synthetic-<n>` unless it exists; returns the ingest report when built."""
    name = synthetic_name(n_atoms)
    exists = conn.execute("SELECT 1 FROM atom_sets WHERE name = %s", (name,)).fetchone()
    conn.commit()
    if exists and not rebuild:
        return None
    rng = np.random.default_rng(seed)
    spec = AtomSetSpec(name=name, model="synthetic", vocab_size=SYNTHETIC_VOCAB, embedding_dim=0,
                       projection="synthetic", kind="context",
                       stats={"synthetic": True, "distribution": "uniform unit cube", "seed": seed})
    tokens = TokenRows(np.arange(SYNTHETIC_VOCAB), [f"tok{i}" for i in range(SYNTHETIC_VOCAB)],
                       rng.random((SYNTHETIC_VOCAB, 3)))
    atoms = AtomRows(rng.integers(0, SYNTHETIC_VOCAB, n_atoms), rng.random((n_atoms, 3)))
    # Atoms are already written in Morton order, so CLUSTER would only repeat that work.
    return write_atom_set(conn, spec, tokens, atoms, replace=True, cluster=False)


def random_contexts(n: int, vocab: int, length: int = 8, seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, (n, length)).tolist()
