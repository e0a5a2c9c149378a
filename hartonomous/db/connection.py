"""Where the database is, and how to connect to it with errors a user can act on."""

from __future__ import annotations

import re

import psycopg

from hartonomous.config import Settings, get_settings
from hartonomous.db.citus_cluster import CitusCluster
from hartonomous.db.cluster import EmbeddedCluster
from hartonomous.errors import DatabaseUnavailable

READER_ROLE = "hartonomous_reader"


def embedded_cluster(settings: Settings | None = None) -> EmbeddedCluster:
    settings = settings or get_settings()
    return EmbeddedCluster(settings.resolved_data_dir, settings.pg_bin, settings.db_port)


def local_citus(settings: Settings | None = None) -> CitusCluster:
    """The local Citus cluster of `hartonomous cluster up` (under <home>/citus)."""
    settings = settings or get_settings()
    return CitusCluster(settings.home.expanduser().absolute() / "citus", settings.pg_bin)


def owner_url(settings: Settings | None = None, autostart: bool = True) -> str:
    """URL of the owner role: HARTONOMOUS_DATABASE_URL, else the running local Citus cluster's
    coordinator, else the embedded cluster."""
    settings = settings or get_settings()
    if settings.database_url:
        return _plain(settings.database_url)
    return _embedded_url(settings, "owner", autostart)


def reader_url(settings: Settings | None = None, autostart: bool = True) -> str:
    """URL of the least-privilege role used for inference."""
    settings = settings or get_settings()
    if settings.reader_database_url:
        return _plain(settings.reader_database_url)
    if settings.database_url:
        return _plain(settings.database_url)
    return _embedded_url(settings, "reader", autostart)


def _embedded_url(settings: Settings, role: str, autostart: bool) -> str:
    """The embedded cluster's URL for `role`, starting the cluster first when asked to; while
    `hartonomous cluster up` has a Citus coordinator running, that coordinator's URL instead."""
    citus = local_citus(settings)
    if citus.is_running():
        return citus.url(role)
    cluster = embedded_cluster(settings)
    if autostart and cluster.running_pid() is None:
        cluster.up()
    return cluster.url(role)


def _plain(url: str) -> str:
    """libpq accepts postgresql://; strip SQLAlchemy driver suffixes."""
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql://", url)


def sqlalchemy_url(url: str) -> str:
    return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql+psycopg://", url)


def redact(url: str) -> str:
    """The URL or key=value conninfo without its password."""
    url = re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)
    return re.sub(r"\b(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s&]+)", r"\1***", url)


def connect(url: str, **kwargs) -> psycopg.Connection:
    """psycopg connection with a one-line, actionable error when the server is unreachable."""
    kwargs.setdefault("connect_timeout", 10)
    try:
        return psycopg.connect(url, **kwargs)
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DatabaseUnavailable(
            f"cannot connect to {redact(url)} ({first}); check HARTONOMOUS_DATABASE_URL, "
            "or unset it and run `hartonomous db up`"
        ) from exc
