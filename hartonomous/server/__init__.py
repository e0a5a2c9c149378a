"""HTTP API (FastAPI + SSE) and the playground page; `hartonomous serve` runs it.

Names are imported on first use, so the CLI starts without loading FastAPI and torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "create_app": "hartonomous.server.app",
    "Runtime": "hartonomous.server.runtime",
    "ServerConfig": "hartonomous.server.runtime",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hartonomous.server' has no attribute {name!r}")
