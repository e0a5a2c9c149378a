"""The /v1 model ids: one per servable pair of path and atom set (docs/openai.md).

Grammar: `<model>` is the exact path on the exact model (`smollm2`); `<model>:<path>:<set>` is
another path over an atom set (`smollm2:augmented:code`). `<model>` is the exact model's load name
(a folder's last component; `exact` where the server was handed an unnamed model). A pair is
servable where the path's declaration's needs are met: an atom set, corpus labels, a gate, a risk
predictor (hartonomous.paths.declaration.NEEDS). Anything else is OpenAI's 404 `model_not_found`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hartonomous.paths import DECLARATIONS, PathDeclaration
from hartonomous.paths.declaration import ATOM_SET, CORPUS_LABELS, EXACT_MODEL, GATE, RISK_PREDICTOR
from hartonomous.server.openai_schemas import OpenAIError

GATED_SETS_SQL = "SELECT s.name FROM augment_gates g JOIN atom_sets s ON s.id = g.atom_set_id"


@dataclass(frozen=True)
class ModelId:
    id: str
    path: str
    atom_set: str | None


def model_name(runtime) -> str:
    """The exact model's name in ids: its load name, a folder's last component, or `exact`."""
    key = runtime.exact_model_key()
    if not key:
        return "exact"
    return Path(key).name if "/" in key else key


def _met(need: str, atom_set, gated: set[str]) -> bool:
    if need == EXACT_MODEL:
        return True                       # the server loads it on first use (503 if it cannot)
    if need == ATOM_SET:
        return atom_set is not None
    if atom_set is None:
        return False
    if need == CORPUS_LABELS:
        distill = atom_set.stats.distill
        return distill is not None and distill.target == "corpus"
    if need == GATE:
        return atom_set.name in gated
    if need == RISK_PREDICTOR:
        return atom_set.risk_model is not None
    return False                          # a need this listing does not know: not offered


def servable(declared: PathDeclaration, atom_set, gated: set[str]) -> bool:
    return all(_met(need, atom_set, gated) for need in declared.needs)


def list_models(runtime) -> list[ModelId]:
    """Every servable id: the exact model first, then each path over each atom set (the default set first)."""
    return _catalog(runtime)[0]


def _catalog(runtime) -> tuple[list[ModelId], str | None]:
    """The servable ids, and the atom set a request naming none reads (the server's, else the database's)."""
    from hartonomous.atomset import list_atom_sets

    name = model_name(runtime)
    with runtime.connection() as conn:
        sets = list_atom_sets(conn)
        gated = {row[0] for row in conn.execute(GATED_SETS_SQL).fetchall()}
    models = [ModelId(name, "exact", None)] if servable(DECLARATIONS["exact"], None, gated) else []
    for atom_set in sets:
        for declared in DECLARATIONS.values():
            if declared.needs_atom_set and servable(declared, atom_set, gated):
                models.append(ModelId(f"{name}:{declared.name}:{atom_set.name}", declared.name, atom_set.name))
    default = runtime.config.atom_set or next((s.name for s in sets if s.is_default), None)
    return models, default


def not_found(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model `{model}` does not exist or you do not have access to it; GET /v1/models "
                            f"lists the servable ids (docs/openai.md)", "model", "model_not_found")


def resolve(runtime, model: str, path: str | None = None, atom_set: str | None = None) -> ModelId:
    """The servable id `model` names; the extension fields `path` and `atom_set`, when given, pick
    another pair, which must be servable too."""
    models, default = _catalog(runtime)
    found = next((m for m in models if m.id == model), None)
    if found is None:
        raise not_found(model)
    if path is None and atom_set is None:
        return found
    path = path or found.path
    atom_set = atom_set or found.atom_set or default
    if not DECLARATIONS[path].needs_atom_set:
        return next(m for m in models if m.path == path) if any(m.path == path for m in models) else found
    pick = next((m for m in models if m.path == path and m.atom_set == atom_set), None)
    if pick is None:
        raise OpenAIError(404, f"path '{path}' over atom set '{atom_set}' is not servable here (an unknown set, or "
                               f"one without what the path needs: {', '.join(sorted(DECLARATIONS[path].needs))}); "
                               "GET /v1/models lists the servable ids", "atom_set" if atom_set else "path",
                          "model_not_found")
    return pick
