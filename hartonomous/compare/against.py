"""`compare --against SET`: a second atom set's spatial path, scored on the same positions.

The report compares it with the spatial path of the compared set by a paired test on every
headline metric. Both must predict over the same tokens, so SET must exist and come from the
same model with the same vocabulary; anything else is one clear line, before any work is done.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import psycopg

from hartonomous.atomset import AtomSet, load_atom_set
from hartonomous.compare.metrics import Sparse
from hartonomous.compare.spatial import spatial_distribution
from hartonomous.errors import UserError


def path_name(atom_set: str) -> str:
    """The report's name for the other set's spatial path (a key of fidelity paths and comparisons)."""
    return f"spatial on {atom_set}"


@dataclass(frozen=True)
class Against:
    """The other set and how its spatial path is called (its own calibrated history weight unless given)."""

    atom_set: str
    history_weight: float | None
    predict: Callable[[Sequence[int]], Sparse]

    @property
    def name(self) -> str:
        return path_name(self.atom_set)

    def as_dict(self, path: dict) -> dict:
        return {"atom_set": self.atom_set, "name": self.name, "history_weight": self.history_weight, "path": path}


def _model(info: AtomSet) -> str:
    return info.model_key or info.model


def _holdout(info: AtomSet) -> str | None:
    entry = info.stats.holdout
    return entry.text if entry is not None else None


def load_against(conn: psycopg.Connection, info: AtomSet, name: str, max_neighbors: int,
                 history_weight: float | None = None, scores_holdout: bool = True) -> Against:
    """The set named by --against, checked against the compared set `info`.

    When the compared set's own held-out text is scored (`scores_holdout`, no --text), SET must hold
    out the very same text: a set built from another corpus or --max-tokens cuts another holdout,
    and its training text may then contain the positions scored here (it would be scored on text it
    learned from).
    """
    if name == info.name:
        raise UserError(f"--against {name}: that is the atom set being compared; name another set")
    try:
        other = load_atom_set(conn, name)
    except UserError as exc:
        raise UserError(f"--against {name}: {exc}") from None
    if (_model(other), other.vocab_size) != (_model(info), info.vocab_size):
        raise UserError(f"--against {name}: built from model '{_model(other)}' with {other.vocab_size} tokens, but "
                        f"'{info.name}' from '{_model(info)}' with {info.vocab_size}; the two cannot be scored on "
                        "the same positions")
    if scores_holdout and (_holdout(other) is None or _holdout(other) != _holdout(info)):
        raise UserError(f"--against {name}: it was built with another held-out text than '{info.name}' (another "
                        "corpus or --max-tokens), so its training text may contain the positions scored here; "
                        "score a --text file that neither set was built from")
    return Against(name, history_weight,
                   lambda context: spatial_distribution(conn, context, name, max_neighbors, history_weight))
