"""Service settings, read once from the environment (prefix ``SWEEPER_``).

Precedence for the storage URL everywhere: a ``--storage`` flag, then ``SWEEPER_STORAGE``, then
the space file's ``storage:``, then an embedded SQLite file in the working directory.
"""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_STORAGE = "sqlite:///sweeper.db"


class Settings(BaseSettings):
    """Environment-driven settings; every field can be set as ``SWEEPER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="SWEEPER_", frozen=True, extra="ignore")

    storage: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    cache_dir: Path = Path.home() / ".cache" / "sweeper"


def normalize_storage_url(url: str) -> str:
    """Make a user-written URL usable by SQLAlchemy with the drivers we ship.

    >>> normalize_storage_url("postgresql://u@h/db")
    'postgresql+psycopg://u@h/db'
    """
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def resolve_storage(flag: str | None, space_storage: str | None = None) -> str:
    """Pick the storage URL by the documented precedence."""
    chosen = flag or Settings().storage or space_storage or DEFAULT_STORAGE
    return normalize_storage_url(chosen)
