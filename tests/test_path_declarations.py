"""Each generation path is declared once (hartonomous/paths/<name>.py), and everything that lists
paths reads the declarations: the Client, the CLI's --path, the HTTP schema, the playground's panes,
the memory's whitelist, the server's model executor, `db status` and GET /api/paths. A new path is
its own module, one line in the registry and its tests; the source scan below fails where a list
of path names is spelled anywhere else."""

from __future__ import annotations

import pkgutil
import re
from pathlib import Path
from typing import get_args

import pytest

import hartonomous.paths as paths_package
from hartonomous.errors import InvalidArgument
from hartonomous.paths import (DECLARATIONS, PATHS, check_speculative_target, declaration, model_paths,
                               next_token_paths, remembered_paths, speculative_targets)
from hartonomous.paths.context import as_dicts
from hartonomous.paths.declaration import NEEDS, PathDeclaration
from hartonomous.paths.options import PathOptions

ROOT = Path(__file__).resolve().parent.parent
SUPPORT_MODULES = {"declaration", "options", "context", "default"}     # hartonomous/paths/ modules that declare no path
NAMES = sorted(DECLARATIONS)
# Two quoted path names side by side in a list, tuple, set or Literal: a set of choices.
CHOICES = re.compile(r"""(['"])(?P<a>%s)\1\s*,\s*(['"])(?P<b>%s)\3""" % ("|".join(NAMES), "|".join(NAMES)))
SCANNED = ("hartonomous", "benchmarks", "scripts")
# Where a list of path names is allowed, and why (SQL, docs and tests are not scanned).
ALLOWED = {
    "hartonomous/paths/": "the declarations themselves",
    "hartonomous/compare/": "a comparison's own methods (with baselines such as counting that are no path), "
                            "chosen by name for a report",
    "hartonomous/db/models.py": "the memory table's CHECK constraint, the SQL whitelist mirrored for the "
                                "ORM; it stays a separate rule on purpose (sql/070_memory.sql)",
    "benchmarks/": "each benchmark measures the paths it names, by choice",
    "scripts/results_table.py": "reads the systems the benchmarks' JSON names, as the benchmarks wrote them",
}


def test_every_path_module_is_declared_once_under_its_own_name() -> None:
    modules = {m.name for m in pkgutil.iter_modules(paths_package.__path__)} - SUPPORT_MODULES
    assert modules == set(PATHS)
    for name, declared in DECLARATIONS.items():
        assert isinstance(declared, PathDeclaration) and declared.name == name
        assert declared.description and "\n" not in declared.description and declared.label
        assert declared.needs <= set(NEEDS) and set(declared.options) <= set(PathOptions.names())
        assert callable(declared.build)


def test_the_registry_keeps_the_historical_order_and_what_each_path_needs() -> None:
    assert PATHS == ("spatial", "exact", "speculative", "hybrid", "augmented")
    assert remembered_paths() == ("exact", "speculative")
    assert model_paths() == {"exact", "speculative", "hybrid", "augmented"}
    assert next_token_paths() == ("spatial", "exact", "augmented")
    assert speculative_targets() == ("exact", "augmented")
    assert {"corpus labels", "gate"} <= declaration("augmented").needs
    assert "risk predictor" in declaration("hybrid").needs


def test_an_unknown_path_is_refused_naming_the_argument() -> None:
    with pytest.raises(InvalidArgument, match="path must be one of spatial, exact") as err:
        declaration("quantum")
    assert err.value.name == "path"


def test_the_options_keep_their_defaults_in_one_object_and_check_them() -> None:
    defaults = PathOptions()
    assert (defaults.draft_tokens, defaults.max_draft_tokens, defaults.risk_threshold) == (4, 8, 0.5)
    assert defaults.speculative_target == "exact" and defaults.augment_weight is None
    for bad, name in (({"risk_threshold": -1}, "risk_threshold"), ({"augment_weight": 1.5}, "augment_weight")):
        with pytest.raises(InvalidArgument) as err:
            PathOptions(**bad)
        assert err.value.name == name
    for target in ("hybrid", None):     # which paths a round verifies against: the registry says, where paths are built
        with pytest.raises(InvalidArgument, match="must be one of exact, augmented, got") as err:
            check_speculative_target(target)
        assert err.value.name == "speculative_target"


def test_everything_that_lists_paths_reads_the_declarations() -> None:
    from hartonomous.cli_generate import GENERATE_PATHS, NEXT_TOKEN_PATHS, SPECULATIVE_TARGETS
    from hartonomous.client import PATHS as CLIENT_PATHS
    from hartonomous.server.playground import page
    from hartonomous.server.runtime import MODEL_PATHS
    from hartonomous.server.schemas import GenerateRequest, GenerationPath, PathName, SpeculativeTarget
    from hartonomous.memory import REMEMBERED_PATHS

    assert CLIENT_PATHS == GENERATE_PATHS == PATHS and get_args(GenerationPath) == PATHS
    assert NEXT_TOKEN_PATHS == get_args(PathName) == next_token_paths()
    assert SPECULATIVE_TARGETS == get_args(SpeculativeTarget) == speculative_targets()
    assert REMEMBERED_PATHS == remembered_paths() and MODEL_PATHS == model_paths()
    fields = GenerateRequest.model_fields
    assert fields["draft_tokens"].default == PathOptions.draft_tokens
    assert fields["risk_threshold"].default == PathOptions.risk_threshold
    html = page()
    for name, declared in DECLARATIONS.items():
        assert f'id="use-{name}"' in html and f'id="pane-{name}"' in html and declared.label in html
    assert [d["name"] for d in as_dicts()] == list(PATHS)


def _choice_lists(text: str) -> list[tuple[int, str]]:
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in CHOICES.finditer(text)]


def test_the_scan_finds_a_list_of_path_names_even_across_lines() -> None:
    assert _choice_lists('PATHS = ("exact",\n          "speculative")') == [(1, '"exact",\n          "speculative"')]
    assert _choice_lists("const P = ['spatial', 'hybrid'];")
    assert not _choice_lists('if path == "exact": route = "spatial"')


def test_no_list_of_path_names_is_spelled_outside_the_declarations() -> None:
    found = []
    for top in SCANNED:
        for file in sorted((ROOT / top).rglob("*")):
            relative = file.relative_to(ROOT).as_posix()
            if file.suffix not in (".py", ".js", ".html") or any(relative.startswith(a) for a in ALLOWED):
                continue
            found += [f"{relative}:{line}: {hit!r}" for line, hit in _choice_lists(file.read_text(encoding="utf-8"))]
    assert not found, ("lists of path names outside hartonomous/paths/ (read them from the declarations, or add "
                       "the file to ALLOWED with a reason):\n" + "\n".join(found))


def test_the_server_lists_the_paths_it_declares(tmp_path) -> None:
    from fastapi.testclient import TestClient

    from hartonomous.server.app import create_app
    from hartonomous.server.runtime import Runtime, ServerConfig

    app = create_app(Runtime(ServerConfig(database_url="postgresql://127.0.0.1:1/none", pool_timeout_s=0.1)))
    with TestClient(app) as http:
        body = http.get("/api/paths").json()
        page = http.get("/")
    assert [p["name"] for p in body["paths"]] == list(PATHS) and body["default"] == "spatial"
    speculative = next(p for p in body["paths"] if p["name"] == "speculative")
    assert speculative["defaults"]["draft_tokens"] == 4 and "origin" in speculative["token_fields"]
    assert all(f'id="pane-{name}"' in page.text for name in PATHS)
