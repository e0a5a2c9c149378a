"""HTTP API (FastAPI + SSE) and the playground page; `hartonomous serve` runs it.

Names are imported on first use, so the CLI starts without loading FastAPI and torch.
"""

from __future__ import annotations

from hartonomous.lazy import lazy_exports

_EXPORTS = {
    "create_app": "hartonomous.server.app",
    "Runtime": "hartonomous.server.runtime",
    "ServerConfig": "hartonomous.server.runtime",
}
__all__ = list(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
