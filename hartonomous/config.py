"""Settings from `HARTONOMOUS_*` environment variables (pydantic-settings)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything configurable; each field is `HARTONOMOUS_<NAME>` in the environment."""

    model_config = SettingsConfigDict(env_prefix="HARTONOMOUS_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="Use this PostgreSQL server (owner role) instead of the embedded cluster.",
    )
    reader_database_url: str | None = Field(
        default=None,
        description="Least-privilege URL for inference; derived from database_url when unset.",
    )
    home: Path = Field(
        default=Path(".hartonomous"),
        description="Folder for the embedded cluster's state, caches and reports.",
    )
    data_dir: Path | None = Field(
        default=None, description="Embedded cluster data dir (default: <home>/pg)."
    )
    pg_bin: Path | None = Field(
        default=None, description="Folder with PostgreSQL 15's initdb/pg_ctl/postgres."
    )
    db_port: int | None = Field(
        default=None, ge=1, le=65535, description="Port for the embedded cluster (default: free port)."
    )
    model: str = Field(default="smollm2", description="'smollm2' or a local Hugging Face model dir.")
    device: str = Field(default="auto", description="auto | cpu | cuda for the exact path.")
    runtime: str = Field(default="auto", description="auto | torch | int4 | llama: what runs the exact model "
                                                     "(hartonomous.runtimes; auto: the fastest measured here).")

    @property
    def resolved_data_dir(self) -> Path:
        return (self.data_dir or self.home / "pg").expanduser().absolute()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def reload_settings() -> Settings:
    get_settings.cache_clear()
    return get_settings()
