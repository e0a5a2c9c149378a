"""The test suite's own environment: nothing a user has running or stored under the project's home,
and none of the HARTONOMOUS_* settings they exported, may change what the suite connects to.

Without this, `hartonomous cluster up` in the checkout (a Citus coordinator under
./.hartonomous/citus) or `hartonomous db up` redirects every command that takes the default
database, in the test process and in the CLI subprocesses it starts; an exported
HARTONOMOUS_DATABASE_URL, HARTONOMOUS_MODEL or HARTONOMOUS_DEVICE would do the same. conftest.py
applies `isolate` once, before any test module is imported; subprocesses inherit the result.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

PREFIX = "HARTONOMOUS_"
# Kept: the suite's own switches (which database backend, how long the load test runs) and where the
# PostgreSQL binaries are (a fact about the machine, not state a user keeps).
KEPT = frozenset({"HARTONOMOUS_TEST_DATABASE_URL", "HARTONOMOUS_TEST_BACKEND", "HARTONOMOUS_LOAD_SECONDS",
                  "HARTONOMOUS_PG_BIN"})


def hermetic_environment(environ: Mapping[str, str], home: Path) -> dict[str, str]:
    """`environ` without the user's HARTONOMOUS_* settings (KEPT excepted), with HARTONOMOUS_HOME = `home`."""
    clean = {name: value for name, value in environ.items() if not name.startswith(PREFIX) or name in KEPT}
    clean[PREFIX + "HOME"] = str(home)
    return clean


def isolate() -> Path:
    """Point this process (and every subprocess it starts) at a fresh, empty project home; returns it."""
    home = Path(tempfile.mkdtemp(prefix="hartonomous-test-home-"))
    home.chmod(0o755)     # as root, the server runs as another user, who must reach a cluster here
    clean = hermetic_environment(os.environ, home)
    for name in [n for n in os.environ if n not in clean]:
        del os.environ[name]
    os.environ.update(clean)
    from hartonomous.config import reload_settings

    reload_settings()
    return home


def release(home: Path) -> None:
    """Stop any server a test started under the suite's home (a CLI call may autostart the embedded
    cluster there), then delete the home."""
    from hartonomous.db.citus_cluster import CitusCluster
    from hartonomous.db.cluster import EmbeddedCluster

    citus = CitusCluster(home / "citus")
    if citus.layout_file.exists():
        citus.down(delete=True)
    embedded = EmbeddedCluster(home / "pg")
    if embedded.running_pid() is not None:
        embedded.down()
    if embedded.data_dir != embedded.requested_dir:
        shutil.rmtree(embedded.data_dir, ignore_errors=True)
    shutil.rmtree(home, ignore_errors=True)
