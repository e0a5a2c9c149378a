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


def output_paths(path: str, speculative_target: str | None = None) -> tuple[str, ...]:
    """The paths whose distribution a generation's output follows: `path`, and the target its
    drafts are verified against where it reads one (speculative)."""
    if speculative_target is not None and "speculative_target" in declaration(path).options:
        return (path, speculative_target)
    return (path,)


def reads_option(option: str, path: str, speculative_target: str | None = None) -> bool:
    """Whether a generation on `path` (verifying against `speculative_target`) reads `option`:
    the path's declaration, or its target's, lists it."""
    return any(option in declaration(name).options for name in output_paths(path, speculative_target))


def paths_reading(option: str) -> tuple[str, ...]:
    """The paths whose declarations list `option`."""
    return tuple(d.name for d in DECLARATIONS.values() if option in d.options)


def option_home(option: str, cli: bool = False) -> str:
    """Where `option` is read, for an error message: "path 'augmented' (or 'speculative' with
    speculative_target 'augmented')", or with `cli` "--path augmented (or speculative with
    --speculative-target augmented)"."""
    name = (lambda n: n) if cli else repr
    readers = paths_reading(option)
    verifiers = [d.name for d in DECLARATIONS.values() if "speculative_target" in d.options and d.name not in readers]
    via = [n for n in readers if n in speculative_targets()]
    text = ("--path " if cli else "path ") + " or ".join(name(n) for n in readers)
    if verifiers and via:
        text += (f" (or {' or '.join(name(v) for v in verifiers)} with "
                 f"{'--speculative-target' if cli else 'speculative_target'} {' or '.join(name(n) for n in via)})")
    return text


def rememberable(path: str, speculative_target: str | None = None) -> bool:
    """Whether the memory may keep the output: every path it follows gives the exact model's words."""
    return all(declaration(name).remembered for name in output_paths(path, speculative_target))


def describe(names: tuple[str, ...] = PATHS) -> str:
    """'name (description), ...': the paths' one-line help."""
    return "; ".join(f"{name} ({DECLARATIONS[name].description})" for name in names)


__all__ = ["DECLARATIONS", "DEFAULT_PATH", "PATHS", "PathDeclaration", "check_speculative_target", "declaration",
           "describe",
           "model_paths", "option_home", "output_paths", "paths_reading", "reads_option", "rememberable", "next_token_paths", "remembered_paths", "speculative_targets"]
