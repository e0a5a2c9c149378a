"""Which path `hartonomous generate` takes when no `--path` is given.

Augmented where the atom set (the named one, else the default) meets the augmented path's needs
(corpus labels and a gate, from the model the set was built from): it is the path measured to beat
the exact model on held-out text. Exact otherwise, including when there is no atom set or no
database to read one from. Spatial stays an explicit choice (and the SQL `next_token`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hartonomous.paths import DECLARATIONS
from hartonomous.paths.declaration import ATOM_SET, CORPUS_LABELS, EXACT_MODEL, GATE

PREFERRED = "augmented"     # when its needs are met
FALLBACK = "exact"          # needs nothing but the model
HAS_GATE_SQL = ("SELECT EXISTS (SELECT 1 FROM augment_gates g JOIN atom_sets s ON s.id = g.atom_set_id "
                "WHERE s.name = %s)")
KNOWN_NEEDS = frozenset({EXACT_MODEL, ATOM_SET, CORPUS_LABELS, GATE})


@dataclass(frozen=True)
class DefaultPath:
    path: str
    reason: str              # one clause for the user: why this path

    def line(self) -> str:
        return f"[path] {self.path}: {self.reason} (--path picks another)"


def _unmet(conn, atom_set) -> str | None:
    """What the preferred path lacks on `atom_set` (None: nothing)."""
    from hartonomous.augment.gates import CORPUS_LABELS as CORPUS_TARGET

    needs = DECLARATIONS[PREFERRED].needs
    if needs - KNOWN_NEEDS:                              # a need this rule cannot check: do not guess
        return " or ".join(sorted(needs - KNOWN_NEEDS))
    distill = atom_set.stats.distill
    if CORPUS_LABELS in needs and (distill is None or distill.target != CORPUS_TARGET):
        return "corpus labels"
    if GATE in needs and not conn.execute(HAS_GATE_SQL, (atom_set.name,)).fetchone()[0]:
        return "gate"
    return None


def choose(atom_set: str | None, model: str | None, database_url: str | None = None) -> DefaultPath:
    """The path for a generation without one. A named set that does not exist is the user's error
    (UserError); a missing database or no set at all means exact."""
    import psycopg

    from hartonomous.atomset import load_atom_set
    from hartonomous.db.connection import reader_url
    from hartonomous.errors import UserError
    from hartonomous.paths.augmented import check_same_model

    try:
        url = database_url or reader_url()
        conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
    except (UserError, psycopg.Error):
        if atom_set is not None:
            raise
        return DefaultPath(FALLBACK, "no database to read an atom set from")
    with conn:
        try:
            info = load_atom_set(conn, atom_set)
        except UserError:
            if atom_set is not None:
                raise                                    # a set the user named and mistyped
            return DefaultPath(FALLBACK, "there is no default atom set")
        missing = _unmet(conn, info)
    if missing is not None:
        return DefaultPath(FALLBACK, f"atom set '{info.name}' has no {missing} for the augmented path")
    try:
        check_same_model(info, model)
    except UserError:
        return DefaultPath(FALLBACK, f"atom set '{info.name}' was built from another model than '{model}'")
    return DefaultPath(PREFERRED, f"atom set '{info.name}' has corpus labels and a gate")
