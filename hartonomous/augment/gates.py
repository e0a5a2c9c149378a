"""A set's gate in the database (augment_gates; sql/095_gates.sql).

`load_gate` reads it for the augmented path, which refuses a set without one; `save_gate` writes
it (the owner's connection). Fitting one is hartonomous.augment.calibrate.fit_set_gate.
"""

from __future__ import annotations

import psycopg
from psycopg.types.json import Jsonb

from hartonomous.atomset import AtomSet
from hartonomous.augment.gate import FEATURES, GATE_VERSION, Gate
from hartonomous.errors import UserError

LOAD_GATE_SQL = ("SELECT g.features, g.means, g.scales, g.coefficients, g.intercept, g.calibration_loss, "
                 "g.exact_loss, g.positions, g.split, g.version, g.details FROM augment_gates g "
                 "JOIN atom_sets s ON s.id = g.atom_set_id WHERE s.name = %s")
SAVE_GATE_SQL = ("SELECT save_gate(%s::text, %s::text[], %s::float8[], %s::float8[], %s::float8[], %s::float8, "
                 "%s::float8, %s::float8, %s::integer, %s::text, %s::integer, %s::jsonb)")
CORPUS_LABELS = "corpus"


def fit_hint(atom_set: str) -> str:
    return f"fit one with: hartonomous gate fit {atom_set}"


def check_corpus_labels(info: AtomSet) -> None:
    """The augmented path is for sets labelled with the corpus's own next tokens: a set labelled by
    the model only echoes the model, so mixing it in cannot add what the model lacks."""
    distill = info.stats.distill
    target = distill.target if distill is not None else None
    if target != CORPUS_LABELS:
        raise UserError(f"atom set '{info.name}' is labelled by {target or 'the model'} labels, not by its corpus's "
                        "next tokens; the augmented path needs a set built with corpus labels "
                        "(hartonomous build --target corpus)")


def load_gate(conn: psycopg.Connection, atom_set: str) -> Gate:
    """The set's gate; a set without one is refused with how to fit it."""
    row = conn.execute(LOAD_GATE_SQL, (atom_set,)).fetchone()
    if row is None:
        raise UserError(f"atom set '{atom_set}' has no gate for the augmented path; {fit_hint(atom_set)}")
    features, means, scales, coefficients, intercept, cal_loss, exact_loss, positions, split, version, details = row
    if version != GATE_VERSION or tuple(features) != FEATURES:
        raise UserError(f"atom set '{atom_set}' has a gate of version {version} ({len(features)} features), this "
                        f"code reads version {GATE_VERSION} ({len(FEATURES)} features); refit it: hartonomous gate "
                        f"fit {atom_set}")
    return Gate(tuple(features), tuple(means), tuple(scales), tuple(coefficients), float(intercept),
                float(cal_loss), float(exact_loss), int(positions), split, int(version), dict(details or {}))


def save_gate(conn: psycopg.Connection, atom_set: str, gate: Gate) -> None:
    """save_gate() (the owner's connection): replaces the set's gate; SQL checks it (22023)."""
    conn.execute(SAVE_GATE_SQL, (atom_set, list(gate.features), list(gate.means), list(gate.scales),
                                 list(gate.coefficients), gate.intercept, gate.calibration_loss, gate.exact_loss,
                                 gate.positions, gate.split, gate.version, Jsonb(gate.extra)))
