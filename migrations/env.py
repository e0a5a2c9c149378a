"""Alembic environment: runs against the owner URL (HARTONOMOUS_DATABASE_URL or embedded)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from hartonomous.db.connection import owner_url, sqlalchemy_url
from hartonomous.db.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    return sqlalchemy_url(config.attributes.get("url") or owner_url())


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        context.configure(connection=connectable, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata,
                          transaction_per_migration=False)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
