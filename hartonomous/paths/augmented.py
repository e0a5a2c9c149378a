"""The augmented path: (1 - λ) the exact model + λ the atom set's store, λ from the set's gate."""

from __future__ import annotations

from pathlib import Path

from hartonomous.errors import UserError
from hartonomous.paths.declaration import (ATOM_SET, CORPUS_LABELS, EXACT_MODEL, GATE, PathContext,
                                           PathDeclaration)


def build(ctx: PathContext, in_database: bool = False):
    """The exact model mixed with the atom set's store by the set's gate (hartonomous.augment).
    The set is checked before the model loads: corpus labels, a gate, the model it was built
    from; then the vocabulary."""
    from hartonomous.atomset import load_atom_set
    from hartonomous.augment.backend import AugmentedBackend, check_compatible
    from hartonomous.augment.gates import check_corpus_labels, load_gate

    conn = ctx.connection()
    info = load_atom_set(conn, ctx.atom_set)
    check_corpus_labels(info)
    gate = load_gate(conn, info.name)
    check_same_model(info, ctx.exact_model_key())
    exact = ctx.exact_backend()
    check_compatible(info, exact.model)
    options = ctx.options
    return AugmentedBackend(exact, conn, info, gate, max_neighbors=options.max_neighbors,
                            history_weight=options.history_weight, history_window=options.history_window,
                            memory=ctx.memory, weight=options.augment_weight)


def _model_identity(key: str) -> str:
    """A model key as one spelling: a folder by its resolved path, 'smollm2' (or anything else) as is."""
    from hartonomous.model import SMOLLM2

    path = Path(key).expanduser()
    return str(path.resolve()) if key != SMOLLM2 and path.is_dir() else key


def check_same_model(atom_set, model_key: str | None) -> None:
    """The set's store predicts the tokens of the model it was built from: refuse another exact
    model, even one with the same vocabulary (a set without a recorded model key, or an unnamed
    loaded model, is left to the vocabulary check)."""
    built = atom_set.model_key
    if not built or not model_key or _model_identity(built) == _model_identity(model_key):
        return
    raise UserError(f"atom set '{atom_set.name}' was built from model '{built}' but the exact model is "
                    f"'{model_key}'; the augmented path mixes the two, so use --model {built} "
                    f"(Client(model=...)) or an atom set built from '{model_key}' (build --model {model_key})")


def settle(result) -> None:
    """The augmented result's statistics count the last pick too (the engine never feeds it back)."""
    if result.stats is not None:
        result.stats.settle(result.token_ids)


PATH = PathDeclaration(
    name="augmented", description="each step (1 - λ) exact + λ the atom set's store, λ from the set's gate",
    label="exact mixed with the store by the gate", shown=True, build=build,
    needs=frozenset({EXACT_MODEL, ATOM_SET, CORPUS_LABELS, GATE}), next_token=True,
    speculative_target=True, options=("max_neighbors", "history_weight", "history_window", "augment_weight"),
    token_fields=("weight", "store_top"), settle=settle)
