"""HTTP API (FastAPI + SSE) and the playground page; `hartonomous serve` runs it."""

from hartonomous.server.app import create_app
from hartonomous.server.runtime import Runtime, ServerConfig

__all__ = ["create_app", "Runtime", "ServerConfig"]
