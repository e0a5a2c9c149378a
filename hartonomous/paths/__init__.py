"""The generation paths, each declared once in a module of its own (hartonomous/paths/<name>.py).

A declaration (hartonomous.paths.declaration.PathDeclaration) says what the path is, how it is
built, what it needs, whether the memory may keep its words, the options it reads (their defaults
in hartonomous.paths.options.PathOptions) and its extra per-token fields; GET /api/paths serves
them (hartonomous.paths.context.as_dicts). The Client, the CLI's
`--path`, the HTTP schema, the playground's panes (GET /api/paths), the memory's whitelist and
`db status` all read the registry here; a new path is one more module and one line below.
Light: nothing here loads model code until a path is built.
"""

from __future__ import annotations

from hartonomous.errors import InvalidArgument
from hartonomous.paths import augmented, exact, hybrid, spatial, speculative
from hartonomous.paths.declaration import PathDeclaration

DECLARATIONS: dict[str, PathDeclaration] = {
    module.PATH.name: module.PATH for module in (spatial, exact, speculative, hybrid, augmented)}
PATHS: tuple[str, ...] = tuple(DECLARATIONS)
DEFAULT_PATH = spatial.PATH.name     # without a path: Client, HTTP, next-token (generate: hartonomous.paths.default)


def declaration(name: str) -> PathDeclaration:
    """The declaration of path `name`; InvalidArgument naming `path` for another name."""
    if not isinstance(name, str) or name not in DECLARATIONS:
        raise InvalidArgument("path", f"path must be one of {', '.join(PATHS)}, got '{name}'")
    return DECLARATIONS[name]


def remembered_paths() -> tuple[str, ...]:
    """The paths whose words are the exact model's: the only ones the memory may keep."""
    return tuple(d.name for d in DECLARATIONS.values() if d.remembered)


def model_paths() -> frozenset[str]:
    """The paths that run the exact model."""
    return frozenset(d.name for d in DECLARATIONS.values() if d.uses_model)


def next_token_paths() -> tuple[str, ...]:
    """The paths with a next-token distribution of their own (next-token, /api/next_token)."""
    return tuple(d.name for d in DECLARATIONS.values() if d.next_token)


def speculative_targets() -> tuple[str, ...]:
    """The paths a speculative round can verify drafts against (speculative_target)."""
    return tuple(d.name for d in DECLARATIONS.values() if d.speculative_target)


def check_speculative_target(target: str) -> str:
    """What the speculative path verifies drafts against: a path whose declaration says it can be one."""
    targets = speculative_targets()
    if not isinstance(target, str) or target not in targets:
        raise InvalidArgument("speculative_target", f"speculative_target must be one of "
                                                    f"{', '.join(targets)}, got {target!r}")
    return target


def describe(names: tuple[str, ...] = PATHS) -> str:
    """'name (description), ...': the paths' one-line help."""
    return "; ".join(f"{name} ({DECLARATIONS[name].description})" for name in names)


__all__ = ["DECLARATIONS", "DEFAULT_PATH", "PATHS", "PathDeclaration", "check_speculative_target", "declaration",
           "describe",
           "model_paths", "next_token_paths", "remembered_paths", "speculative_targets"]
