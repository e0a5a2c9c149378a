"""Builds and gates on a real local Citus cluster (a coordinator and 2 workers, `hartonomous cluster
up`), as a new user runs them: the default build of code (lattice positions) and of prose, each with
its gate (`build --target corpus` fits one by default), and `hartonomous gate fit` replacing a gate.
A Citus coordinator refuses a non-IMMUTABLE function in the DO UPDATE SET of an INSERT into a
distributed (or Citus local) table; no write of a build or a gate may have that shape.

Needs Citus 12.1 for PostgreSQL 15 (scripts/install-citus.sh). Under CI=true a missing Citus is a
failure; elsewhere these tests skip and say why.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from generation_helpers import save_tiny_model
from hartonomous.augment.gate import FEATURES, MIN_POSITIONS
from hartonomous.augment.gates import load_gate
from citus_helpers import WORKERS, migrated_cluster
from hartonomous.db.citus_cluster import CitusCluster

REPO = Path(__file__).resolve().parents[1]
CODE = [
    "def add(a, b):\n    return a + b\n",
    "def total(items):\n    result = 0\n    for item in items:\n        result = add(result, item)\n    return result\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n",
]
PROSE = ["The capital of France is Paris.", "The capital of Italy is Rome.", "Return the sum of the numbers.",
         "Raise ValueError if the list is empty.", "The value of the flag is True."]


@pytest.fixture(scope="module")
def citus() -> Iterator[CitusCluster]:
    """A fresh coordinator + 2 workers under a temporary folder, migrated; deleted afterwards."""
    with migrated_cluster("hartonomous-citus-build-", WORKERS) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """The tiny model as a local model folder, so that `gate fit` loads the model the set names."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory) -> Path:
    """A small repository of Python files (a code corpus: lattice positions by default)."""
    root = tmp_path_factory.mktemp("code")
    for i in range(120):
        (root / f"module_{i}.py").write_text(f"# module {i}\n" + CODE[i % len(CODE)] + "\n" + CODE[(i + 1) % len(CODE)])
    return root


@pytest.fixture(scope="module")
def prose_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prose") / "prose.txt"
    path.write_text("\n\n".join(" ".join(PROSE[(i + j) % len(PROSE)] for j in range(4)) for i in range(80)))
    return path


def hartonomous(cluster: CitusCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI, as a user runs it against the cluster's coordinator (its home beside the cluster)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARTONOMOUS_")}
    env["HARTONOMOUS_DATABASE_URL"] = cluster.url()
    env["HARTONOMOUS_HOME"] = str(cluster.root.parent)
    return subprocess.run([sys.executable, "-m", "hartonomous.cli", *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)


def default_build(cluster: CitusCluster, tiny_dir: Path, name: str, corpus: Path, *extra: str) -> None:
    """`hartonomous build --target corpus` with every other option at its default (gate included),
    at small sizes."""
    done = hartonomous(cluster, "build", "--name", name, "--model", str(tiny_dir), "--corpus", str(corpus), *extra,
                       "--target", "corpus", "--max-tokens", "3000", "--landmarks", "32", "--holdout-chars", "3000",
                       "--context-length", "64", "--batch-tokens", "512", "--no-teacher-cache")
    assert done.returncode == 0, done.stderr


def gate_row(url: str, name: str) -> tuple | None:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT g.positions, g.fitted_at FROM augment_gates g JOIN atom_sets s "
                            "ON s.id = g.atom_set_id WHERE s.name = %s", (name,)).fetchone()


@pytest.fixture(scope="module")
def code_set(citus, tiny_dir, code_dir) -> str:
    name = f"citus-code-{uuid.uuid4().hex[:8]}"
    default_build(citus, tiny_dir, name, code_dir, "--include", "*.py")
    return name


def test_the_default_code_build_routes_and_fits_its_gate_on_the_cluster(citus, code_set) -> None:
    with psycopg.connect(citus.url()) as conn:
        kernel, spread = conn.execute("SELECT kernel, route_spread FROM atom_sets WHERE name = %s",
                                      (code_set,)).fetchone()
        gate = load_gate(conn, code_set)
    assert (kernel, spread is not None) == ("backoff", True)      # a lattice set, routed on the cluster
    assert gate.features == FEATURES and gate.positions >= MIN_POSITIONS and gate.split == "calibration"


def test_the_default_prose_build_fits_its_gate_on_the_cluster(citus, tiny_dir, prose_file) -> None:
    name = f"citus-prose-{uuid.uuid4().hex[:8]}"
    default_build(citus, tiny_dir, name, prose_file)
    with psycopg.connect(citus.url()) as conn:
        kernel, spread = conn.execute("SELECT kernel, route_spread FROM atom_sets WHERE name = %s", (name,)).fetchone()
        gate = load_gate(conn, name)
    assert (kernel, spread) == ("gaussian", None)                  # projected positions, spread by atom id
    assert gate.features == FEATURES and gate.positions >= MIN_POSITIONS


def test_gate_fit_replaces_the_gate_on_the_cluster(citus, code_set) -> None:
    before = gate_row(citus.url(), code_set)
    done = hartonomous(citus, "gate", "fit", code_set, "--max-positions", "40")
    assert done.returncode == 0, done.stderr
    positions, fitted_at = gate_row(citus.url(), code_set)
    assert positions <= 40 < before[0] and fitted_at > before[1]
