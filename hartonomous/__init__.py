"""Hartonomous: geometric next-token inference in PostgreSQL/PostGIS, measured against exact inference.

`from hartonomous import Client` is lazy, so `import hartonomous` stays light (no torch).
"""

__all__ = ["Client", "Engine", "GenerationConfig"]


def __getattr__(name: str):
    if name == "Client":
        from hartonomous.client import Client

        return Client
    if name == "Engine":
        from hartonomous.engine import Engine

        return Engine
    if name == "GenerationConfig":
        from hartonomous.generation_config import GenerationConfig

        return GenerationConfig
    raise AttributeError(f"module 'hartonomous' has no attribute {name!r}")
