"""Which path `hartonomous generate` takes when no `--path` is given.

Augmented where the atom set (the named one, else the default) meets the augmented path's needs
(corpus labels and a gate, from the model the set was built from): it is the path measured to beat
the exact model on held-out text. Exact otherwise, including when there is no atom set or no
database to read one from. Spatial stays an explicit choice (and the SQL `next_token`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hartonomous.paths import DECLARATIONS
from hartonomous.paths.declaration import ATOM_SET, CORPUS_LABELS, EXACT_MODEL, GATE, RISK_PREDICTOR

PREFERRED = "augmented"     # when its needs are met
FALLBACK = "exact"          # needs nothing but the model
GATED_SETS_SQL = "SELECT s.name FROM augment_gates g JOIN atom_sets s ON s.id = g.atom_set_id"
WORDS = {CORPUS_LABELS: "corpus labels", GATE: "gate", RISK_PREDICTOR: "risk predictor"}


@dataclass(frozen=True)
class DefaultPath:
    path: str
    reason: str              # one clause for the user: why this path

    def line(self) -> str:
        return f"[path] {self.path}: {self.reason} (--path picks another)"


def gated_sets(conn) -> set[str]:
    """The names of the atom sets with a fitted gate."""
    return {row[0] for row in conn.execute(GATED_SETS_SQL).fetchall()}


def unmet(name: str, atom_set, gated: set[str]) -> list[str]:
    """What path `name` needs that `atom_set` lacks (the exact model is taken as there: it loads on use)."""
    from hartonomous.augment.gates import CORPUS_LABELS as CORPUS_TARGET

    distill = atom_set.stats.distill
    met = {EXACT_MODEL: True, ATOM_SET: True,
           CORPUS_LABELS: distill is not None and distill.target == CORPUS_TARGET,
           GATE: atom_set.name in gated, RISK_PREDICTOR: atom_set.risk_model is not None}
    return [WORDS.get(need, need) for need in sorted(DECLARATIONS[name].needs) if not met.get(need, False)]


def served_paths(atom_set, gated: set[str]) -> list[str]:
    """The declared paths whose needs `atom_set` meets (the playground ticks its panes by them)."""
    return [name for name in DECLARATIONS if not unmet(name, atom_set, gated)]


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
        missing = unmet(PREFERRED, info, gated_sets(conn))
    if missing:
        return DefaultPath(FALLBACK, f"atom set '{info.name}' has no {' or '.join(missing)} for the augmented path")
    try:
        check_same_model(info, model)
    except UserError:
        return DefaultPath(FALLBACK, f"atom set '{info.name}' was built from another model than '{model}'")
    return DefaultPath(PREFERRED, f"atom set '{info.name}' has corpus labels and a gate")
