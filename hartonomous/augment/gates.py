"""A set's gate in the database (augment_gates; sql/095_gates.sql), and fitting one for a set.

`fit_set_gate` walks the set's calibration split (never the test split) with the exact reference
model and the store, fits the gate and saves it with save_gate() (the owner's connection).
`load_gate` reads it for the augmented path, which refuses a set without one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
from psycopg.types.json import Jsonb

from hartonomous.atomset import AtomSet, load_atom_set
from hartonomous.augment.gate import MIN_POSITIONS, Gate
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
    return Gate(tuple(features), tuple(means), tuple(scales), tuple(coefficients), float(intercept),
                float(cal_loss), float(exact_loss), int(positions), split, int(version), dict(details or {}))


def save_gate(conn: psycopg.Connection, atom_set: str, gate: Gate) -> None:
    """save_gate() (the owner's connection): replaces the set's gate; SQL checks it (22023)."""
    conn.execute(SAVE_GATE_SQL, (atom_set, list(gate.features), list(gate.means), list(gate.scales),
                                 list(gate.coefficients), gate.intercept, gate.calibration_loss, gate.exact_loss,
                                 gate.positions, gate.split, gate.version, Jsonb(gate.extra)))


def calibration_windows(text: str, tokenizer, max_positions: int | None = None) -> list:
    """The calibration text's token ids in the walk's windows (each restarts the context)."""
    from hartonomous.augment.calibrate import WINDOW
    from hartonomous.corpus import teacher

    ids = [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    if max_positions is not None:
        ids = ids[:max_positions + 1]
    return teacher.windows(ids, WINDOW)


def positions_in(windows) -> int:
    return sum(max(len(w) - 1, 0) for w in windows)


def fit_set_gate(conn: psycopg.Connection, atom_set: str, *, model=None, tokenizer=None,
                 max_positions: int | None = None, max_neighbors: int = 100,
                 on_positions: Callable[[int], None] | None = None,
                 on_total: Callable[[int], None] | None = None) -> Gate:
    """Fit the set's gate on its calibration split and save it; returns it."""
    from hartonomous.augment.calibrate import WINDOW, walk_text
    from hartonomous.compare.atomset import holdout_text

    info = load_atom_set(conn, atom_set)
    check_corpus_labels(info)
    text = holdout_text(info, "calibration").text
    if model is None or tokenizer is None:
        from hartonomous.compare.runner import model_name_for
        from hartonomous.model import load_model, load_tokenizer

        name = model_name_for(info)
        model, tokenizer = load_model(name, "cpu"), load_tokenizer(name)
    if int(model.config.vocab_size) < info.vocab_size:
        raise UserError(f"the model has {model.config.vocab_size} tokens but atom set '{info.name}' has "
                        f"{info.vocab_size}; use the model the set was built from")
    windows = calibration_windows(text, tokenizer, max_positions)
    if positions_in(windows) < MIN_POSITIONS:
        raise UserError(f"atom set '{info.name}' has {positions_in(windows)} calibration positions; a gate needs at "
                        f"least {MIN_POSITIONS} (build from a larger corpus, or a larger --holdout-chars)")
    if on_total:
        on_total(positions_in(windows))
    start = time.perf_counter()
    walk = walk_text(conn, model, windows, info.name, max_neighbors=max_neighbors, on_positions=on_positions)
    gate = walk.fit()
    gate = Gate(gate.features, gate.means, gate.scales, gate.coefficients, gate.intercept, gate.calibration_loss,
                gate.exact_loss, gate.positions, gate.split, gate.version,
                {"max_neighbors": max_neighbors, "window": WINDOW, "seconds": round(time.perf_counter() - start, 1),
                 "model": info.model_key or info.model})
    save_gate(conn, info.name, gate)
    return gate
