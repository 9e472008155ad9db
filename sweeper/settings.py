"""Service settings, read once from the environment (prefix ``SWEEPER_``).

Precedence for the storage URL everywhere: a ``--storage`` flag, then ``SWEEPER_STORAGE``, then
the space file's ``storage:``, then an embedded SQLite file in the working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from sweeper.errors import SettingsError

DEFAULT_STORAGE = "sqlite:///sweeper.db"


class Settings(BaseSettings):
    """Environment-driven settings; every field can be set as ``SWEEPER_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="SWEEPER_", frozen=True, extra="ignore")

    storage: str | None = None
    host: str = Field(default="127.0.0.1", description="bind address; loopback unless told")
    port: int = 8000
    cache_dir: Path = Path.home() / ".cache" / "sweeper"
    api_token: SecretStr | None = Field(
        default=None,
        description="bearer token for the write endpoints (enqueue, stop, delete); unset = "
        "the server is read-only",
    )
    heartbeat_s: float = Field(
        default=10.0, gt=0, description="how often a sweep worker says it is alive, seconds"
    )
    worker_grace_s: float = Field(
        default=60.0,
        gt=0,
        description="a worker silent this long is lost: its running trial is marked lost and "
        "its config tried once more",
    )
    database_retry_s: float = Field(
        default=120.0,
        gt=0,
        description="how long a sweep waits out a database that stopped answering (a restart, "
        "a failover) before it stops; its running trial is then run again on resume",
    )
    fleet_trials: int | None = Field(
        default=None,
        gt=0,
        description="set by `launch --workers N` / `worker --devices` for the workers it starts: "
        "the trials of the whole fleet, so the study plans them all, not one worker's share",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="origins allowed to call the API from a browser, comma-separated; none "
        "by default (the dashboard is same-origin)",
    )

    def __init__(self, **values: Any) -> None:
        # every command reads the environment through here: a wrong variable is said once, by
        # its name, not as pydantic's report (which echoes the value: a token is a secret)
        try:
            super().__init__(**values)
        except ValidationError as e:
            problems = "; ".join(
                f"SWEEPER_{'_'.join(str(part) for part in error['loc']).upper()}: "
                + error["msg"].removeprefix("Value error, ")
                for error in e.errors()
            )
            raise SettingsError(f"invalid SWEEPER_* environment: {problems}") from None

    @field_validator("api_token")
    @classmethod
    def _token_long_enough(cls, token: SecretStr | None) -> SecretStr | None:
        if token is not None and len(token.get_secret_value()) < 16:
            raise ValueError(
                "shorter than 16 characters; use e.g. "
                "`python -c 'import secrets; print(secrets.token_urlsafe(32))'`"
            )
        return token

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _explicit_origins(cls, value: object) -> object:
        origins = (
            [o.strip() for o in value.split(",") if o.strip()] if isinstance(value, str) else value
        )
        for origin in origins if isinstance(origins, list) else []:
            if origin == "*" or not origin.startswith(("http://", "https://")):
                raise ValueError(
                    f"{origin!r} is not an explicit origin; list each one "
                    "as scheme://host[:port], e.g. http://localhost:3000 ('*' is not allowed)"
                )
        return origins


def normalize_storage_url(url: str) -> str:
    """Make a user-written URL usable by SQLAlchemy with the drivers we ship.

    >>> normalize_storage_url("postgresql://u@h/db")
    'postgresql+psycopg://u@h/db'
    >>> normalize_storage_url("runs/sweeper.db"), normalize_storage_url("/tmp/s.db")
    ('sqlite:///runs/sweeper.db', 'sqlite:////tmp/s.db')
    """
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    if "://" not in url and url.strip():  # a path: the SQLite file there
        return "sqlite:///" + url
    return url


def resolve_storage(flag: str | None, space_storage: str | None = None) -> str:
    """Pick the storage URL by the documented precedence."""
    chosen = flag or Settings().storage or space_storage or DEFAULT_STORAGE
    return normalize_storage_url(chosen)


def absent_sqlite_file(url: str) -> Path | None:
    """The file of an SQLite URL when it does not exist (opening it would create it); None for
    an existing file, an in-memory database, another backend or a URL Store will refuse.

    >>> absent_sqlite_file("sqlite:////no/such/dir/s.db"), absent_sqlite_file("sqlite://")
    (PosixPath('/no/such/dir/s.db'), None)
    """
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except ArgumentError:
        return None
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return None
    return None if Path(path).is_file() else Path(path)
