"""Alembic environment: runs against the owner URL (HARTONOMOUS_DATABASE_URL or embedded)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from hartonomous.db.connection import owner_url, sqlalchemy_url
from hartonomous.db.migrate import drop_functions_without_their_schema
from hartonomous.db.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return sqlalchemy_url(config.attributes.get("url") or owner_url())


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _migrate(connection) -> None:
    """The migrations, then (in their transaction) the functions of sql/ whose tables or columns the
    revision reached lacks dropped: a downgrade leaves no function that would fail on them."""
    with context.begin_transaction():
        context.run_migrations()
        drop_functions_without_their_schema(connection.connection.driver_connection.execute)


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        context.configure(connection=connectable, target_metadata=target_metadata)
        _migrate(connectable)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          transaction_per_migration=False)
        _migrate(connection)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
