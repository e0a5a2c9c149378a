"""The suite is hermetic: a cluster the user runs under the project's home, or settings they exported,
do not change what the tests connect to (tests/hermetic.py, applied by conftest.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hartonomous.config import Settings, get_settings, reload_settings
from hartonomous.db.connection import owner_url, reader_url
from hartonomous.errors import UserError
from hermetic import hermetic_environment

USER_PASSWORD = "the-users-own-cluster"
USER_PORT = 1          # never connected to: the URL alone shows where a command would go


@pytest.fixture
def user_project() -> Iterator[Path]:
    """A checkout whose ./.hartonomous holds what `hartonomous cluster up` leaves while its coordinator
    runs: the layout, the coordinator's state (port, passwords) and a postmaster.pid naming a live
    process called postgres (a copy of `sleep`, so no real server is needed)."""
    project = Path(tempfile.mkdtemp(prefix="hartonomous-user-project-"))
    project.chmod(0o755)
    citus = project / ".hartonomous" / "citus"
    coordinator = citus / "coordinator"
    coordinator.mkdir(parents=True)
    fake_postgres = project / "postgres"
    shutil.copy(shutil.which("sleep"), fake_postgres)
    process = subprocess.Popen([str(fake_postgres), "300"])
    try:
        (citus / "layout.json").write_text(json.dumps({"workers": 2, "node_ids": {}}))
        (citus / "coordinator.state.json").write_text(json.dumps(
            {"port": USER_PORT, "password": USER_PASSWORD, "reader_password": USER_PASSWORD}))
        (coordinator / "postmaster.pid").write_text(f"{process.pid}\n{coordinator}\n0\n{USER_PORT}\n")
        yield project
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(project, ignore_errors=True)


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hartonomous.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=120)


def _url_or_none(url_of) -> str | None:
    try:
        return url_of(autostart=False)
    except UserError:       # nothing runs under the suite's own home
        return None


def test_the_fake_user_cluster_would_redirect_a_command_that_reads_its_home(user_project: Path) -> None:
    """The control: the fake is convincing, so the next test means something."""
    home = user_project / ".hartonomous"
    assert f"{USER_PASSWORD}@127.0.0.1:{USER_PORT}/" in owner_url(Settings(home=home), autostart=False)
    shown = _cli("cluster", "url", cwd=user_project, env={**os.environ, "HARTONOMOUS_HOME": str(home)})
    assert shown.returncode == 0 and f":{USER_PASSWORD}@127.0.0.1:{USER_PORT}/" in shown.stdout


def test_a_cluster_under_the_checkouts_home_does_not_redirect_the_suite(user_project: Path, monkeypatch) -> None:
    monkeypatch.chdir(user_project)          # where `make test` runs: the user's checkout
    reload_settings()
    try:
        for url_of in (owner_url, reader_url):
            url = _url_or_none(url_of)
            assert url is None or USER_PASSWORD not in url, url
        assert get_settings().home.expanduser().absolute() != (user_project / ".hartonomous").absolute()
    finally:
        monkeypatch.undo()
        reload_settings()
    shown = _cli("cluster", "url", cwd=user_project)          # a CLI subprocess inherits the isolation
    assert USER_PASSWORD not in shown.stdout + shown.stderr
    assert shown.returncode == 1 and "no local Citus cluster" in shown.stderr


def test_the_users_settings_are_dropped_and_the_suites_switches_kept() -> None:
    user = {"HARTONOMOUS_DATABASE_URL": "postgresql://me@prod/db", "HARTONOMOUS_READER_DATABASE_URL": "x",
            "HARTONOMOUS_HOME": "/home/me/.hartonomous", "HARTONOMOUS_DATA_DIR": "/srv/pg", "HARTONOMOUS_DB_PORT": "5432",
            "HARTONOMOUS_MODEL": "/models/big", "HARTONOMOUS_DEVICE": "cuda",
            "HARTONOMOUS_TEST_DATABASE_URL": "postgresql://ci/test", "HARTONOMOUS_TEST_BACKEND": "docker",
            "HARTONOMOUS_LOAD_SECONDS": "5", "HARTONOMOUS_PG_BIN": "/opt/pg15/bin", "PATH": "/usr/bin", "CI": "1"}
    clean = hermetic_environment(user, Path("/tmp/suite-home"))
    assert clean == {"HARTONOMOUS_HOME": "/tmp/suite-home", "HARTONOMOUS_TEST_DATABASE_URL": "postgresql://ci/test",
                     "HARTONOMOUS_TEST_BACKEND": "docker", "HARTONOMOUS_LOAD_SECONDS": "5",
                     "HARTONOMOUS_PG_BIN": "/opt/pg15/bin", "PATH": "/usr/bin", "CI": "1"}
