"""Ingest benchmark: N synthetic context atoms -> binary COPY, GiST nd, CLUSTER, ANALYZE, attach.

    .venv/bin/python benchmarks/ingest.py --atoms 1000000

Atoms are clustered around a few thousand 3D "token" positions (like real context atoms), and
the timing covers write_atom_set only (no model). The set is dropped afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hartonomous.db.connection import connect, owner_url
from hartonomous.atomset import AtomRows, AtomSetSpec, TokenRows, drop_atom_set, write_atom_set


def synthetic(n: int, vocab: int, seed: int) -> tuple[TokenRows, AtomRows]:
    rng = np.random.default_rng(seed)
    token_pos = rng.normal(size=(vocab, 3))
    tokens = TokenRows(np.arange(vocab), [f"t{i}" for i in range(vocab)], token_pos)
    last = rng.integers(0, vocab, n)
    positions = token_pos[last] * 0.7 + rng.normal(scale=0.3, size=(n, 3))
    return tokens, AtomRows(rng.integers(0, vocab, n), positions, rng.integers(1, 4, n).astype(float))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--atoms", type=int, default=1_000_000)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--name", default="bench-ingest")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--no-cluster", action="store_true")
    args = parser.parse_args()
    tokens, atoms = synthetic(args.atoms, args.vocab, 0)
    with connect(owner_url()) as conn:
        report = write_atom_set(conn, AtomSetSpec(args.name, "synthetic", args.vocab, 3, "none", "context"),
                                tokens, atoms, replace=True, cluster=not args.no_cluster,
                                progress=lambda m: print(f"[{time.strftime('%X')}] {m}", flush=True))
        print(f"atoms={report.atoms} copy={report.copy_seconds:.1f}s index={report.index_seconds:.1f}s "
              f"cluster+analyze={report.cluster_seconds:.1f}s total={report.total_seconds:.1f}s "
              f"-> {report.atoms_per_second:,.0f} atoms/s")
        if not args.keep:
            drop_atom_set(conn, args.name)


if __name__ == "__main__":
    main()
