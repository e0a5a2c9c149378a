"""Database access: the embedded cluster, connections, schema models and migrations."""

from hartonomous.db.connection import connect, owner_url, reader_url

__all__ = ["connect", "owner_url", "reader_url"]
