"""Control paths: the spatial path on a sibling atom set that differs in one thing only.

The random-positions control (`hartonomous build --controls`) stores the same atoms keyed by
random 3D token positions instead of the projection. It is evaluated exactly like the spatial
path (SQL next_token on that set, the same K and sampler settings), so the report itself answers
"does the geometry carry information?".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg

from hartonomous.atomset import AtomSet, load_atom_set
from hartonomous.compare.metrics import Sparse
from hartonomous.compare.spatial import spatial_distribution
from hartonomous.errors import UserError

RANDOM_POSITIONS = "spatial, random positions"
NOT_BUILT = "not built (pass --controls to hartonomous build)"
WHAT_IT_CONTROLS = ("the same atoms with random 3D token positions instead of the projection, through the same "
                    "next_token: if it scores like the spatial path, the projected positions carry no information "
                    "beyond which tokens the context holds")


@dataclass(frozen=True)
class Control:
    """One control path: scored, not built, or recorded but unusable (the note says why)."""

    status: str                                    # 'scored' | 'not built' | 'missing'
    atom_set: str | None
    note: str
    predict: Callable[[Sequence[int]], Sparse] | None = None

    def as_dict(self, path: dict | None) -> dict:
        return {"status": self.status, "atom_set": self.atom_set, "note": self.note, "path": path}


def random_positions(conn: psycopg.Connection, info: AtomSet, max_neighbors: int,
                     history_weight: float | None = None) -> Control:
    """The random-positions sibling named in stats.controls, as a predictor like the spatial path's
    (the same K and history weight)."""
    name = info.stats.controls.random_positions if info.stats.controls else None
    if not name:
        return Control("not built", None, NOT_BUILT)
    try:
        other = load_atom_set(conn, name)
    except UserError:
        return Control("missing", name, f"the stats name '{name}', but there is no such atom set any more; "
                                        "rebuild with --controls")
    if (other.vocab_size, other.kind) != (info.vocab_size, info.kind):
        return Control("missing", name, f"'{name}' is a {other.kind} set of {other.vocab_size} tokens, not a "
                                        f"{info.kind} set of {info.vocab_size}: not a control of this set")
    return Control("scored", name, WHAT_IT_CONTROLS,
                   lambda context: spatial_distribution(conn, context, name, max_neighbors, history_weight))
