"""One local Citus cluster for a test module: the rule for a missing Citus and the set-up, written once.

Each module that needs a cluster starts its own (a coordinator + WORKERS workers under a temporary
folder, migrated) so modules cannot see each other's sets; under CI a missing Citus fails instead of
skipping (docs/reliability.md).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from hartonomous.db import migrate
from hartonomous.db.citus_cluster import CitusCluster, citus_installed

WORKERS = 2


def require_citus() -> None:
    """Skip (or fail under CI) with how to install Citus when it is missing."""
    if citus_installed():
        return
    reason = ("Citus is not installed for PostgreSQL 15; build it with scripts/install-citus.sh "
              "(HARTONOMOUS_CITUS_TARBALL=<citus-12.1.12.tar.gz>) or install Citus's packages")
    if os.environ.get("CI"):
        pytest.fail(f"CI needs Citus: {reason}")
    pytest.skip(reason)


@contextmanager
def migrated_cluster(prefix: str, workers: int = WORKERS) -> Iterator[CitusCluster]:
    """A fresh coordinator + `workers` workers, migrated to head; stopped and deleted afterwards."""
    require_citus()
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    cluster = CitusCluster(root / "citus")
    try:
        cluster.up(workers)
        migrate.upgrade(cluster.url())
        yield cluster
    finally:
        cluster.down(delete=True)
        shutil.rmtree(root, ignore_errors=True)
