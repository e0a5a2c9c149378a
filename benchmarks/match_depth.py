"""How deep the longest stored match is at held-out code positions: what routing by the last one
or the last two tokens' lattice cells would each have to fan out (docs/scale-out.md).

On a lattice set with decay d, a stored key that agrees with the context's last s tokens and not
the one before lies at a distance D in [0.505 d^s, 0.49 d^(s-1)] (projection/lattice.py), so
s = ceil(ln(D / 0.5) / ln d) from the nearest stored atom's distance D. Routing by one token's
cell keeps every neighbour of a match of depth >= 1 on one shard; routing by two tokens' cells
needs depth >= 2, so the positions of depth <= 1 would fan out.

    python -m benchmarks.match_depth --atom-set code-src-1e7 --positions 2000 --out FILE

The held-out text is this repository's own Python source (hartonomous/**/*.py, not in the
python-source corpus), 8-token contexts ending at seeded random positions; single node.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parents[1]


def held_out_ids() -> list[int]:
    from hartonomous.model import load_tokenizer

    tokenizer = load_tokenizer()
    ids: list[int] = []
    for path in sorted((ROOT / "hartonomous").rglob("*.py")):
        ids += tokenizer(path.read_text())["input_ids"]
    return ids


def match_depths(url: str, atom_set: str, positions: int, window: int = 8, seed: int = 0) -> np.ndarray:
    ids = held_out_ids()
    ends = np.random.default_rng(seed).integers(2 * window, len(ids), positions)
    depths = []
    with psycopg.connect(url) as conn:
        set_id, decay, full = conn.execute("SELECT id, centroid_decay, centroid_window FROM atom_sets WHERE name = %s",
                                           (atom_set,)).fetchone()
        for end in ends:
            (nearest,) = conn.execute("SELECT min(k.distance) FROM ht_knn(%s, context_centroid(%s, %s), 1) k",
                                      (set_id, ids[end - window:end], atom_set)).fetchone()
            depths.append(full if nearest < 1e-12 else max(0, math.ceil(math.log(nearest / 0.5) / math.log(decay))))
    return np.array(depths)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atom-set", default="code-src-1e7")
    parser.add_argument("--positions", type=int, default=2000)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from hartonomous.db.connection import embedded_cluster

    load = os.getloadavg()[0]
    depths = match_depths(embedded_cluster().url(), args.atom_set, args.positions)  # the single node
    share = {int(k): float(np.mean(depths == k)) for k in range(int(depths.max()) + 1)}
    result = {"command": "python -m benchmarks.match_depth " + " ".join(argv or sys.argv[1:]),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "atom_set": args.atom_set,
              "positions": len(depths), "share_by_depth": share,
              "fans_out_routing_by_one_token": share.get(0, 0.0),
              "fans_out_routing_by_two_tokens": share.get(0, 0.0) + share.get(1, 0.0),
              "load_1m": [round(load, 2), round(os.getloadavg()[0], 2)]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
