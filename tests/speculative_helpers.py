"""The tiny model's speculative set-up, written once: the two atom sets a drafter is tested on, the
spatial backends over them and the exact backend that verifies.

A test module imports the fixtures it uses (`from speculative_helpers import spatial, ...`); each
module still gets its own module-scoped sets.
"""

from __future__ import annotations

import psycopg
import pytest

from generation_helpers import distilled_tiny_set, drop_atom_set, write_tiny_atom_set
from hartonomous.backends.exact import ExactBackend
from hartonomous.backends.spatial import SpatialBackend
from hartonomous.runtimes.reference import ExactModel
from tiny_model import tiny_model


def connect_spatial(url: str, name: str) -> SpatialBackend:
    """A spatial backend over set `name` with the tiny model's tokenizer, owning its connection."""
    _, tokenizer = tiny_model(0)
    return SpatialBackend(psycopg.connect(url, autocommit=True), name, tokenizer=tokenizer, owns_connection=True)


def tiny_exact_backend() -> ExactBackend:
    """The tiny random-weight model as the exact path's backend."""
    model, tokenizer = tiny_model(0)
    return ExactBackend(ExactModel(model, tokenizer))


@pytest.fixture(scope="module")
def atom_set(server_url, tmp_path_factory):
    """A context atom set distilled from the tiny model itself: a drafter that is often right."""
    with distilled_tiny_set(server_url, tmp_path_factory.mktemp("corpus")) as name:
        yield name


@pytest.fixture(scope="module")
def random_atom_set(server_url):
    """Random atoms over the tiny vocabulary: a drafter whose q is far from the model's p."""
    name = write_tiny_atom_set(server_url, model="tiny", window=3, decay=0.5)
    yield name
    drop_atom_set(server_url, name)


@pytest.fixture
def spatial(server_url, atom_set):
    backend = connect_spatial(server_url, atom_set)
    yield backend
    backend.close()


@pytest.fixture
def random_spatial(server_url, random_atom_set):
    backend = connect_spatial(server_url, random_atom_set)
    yield backend
    backend.close()
