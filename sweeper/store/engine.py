"""Connecting to a store's database: the engine (SQLite's pragmas and busy wait, Postgres's
bounds) and the lock that schema changes take."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from sweeper.store.bounds import SQLITE_BUSY_S, bound_engine

MIGRATION_LOCK_ID = 0x5EE9E4


@contextmanager
def schema_lock(url: str) -> Iterator[None]:
    """Hold the lock our migrations take while creating someone else's tables (Optuna's):
    workers starting together on an empty database would race (CREATE TYPE on Postgres,
    alembic_version on SQLite). On an SQLite file the lock is an flock beside it."""
    if not url.startswith("postgresql"):
        database = make_url(url).database
        if not database or database == ":memory:":
            yield
            return
        lock = Path(f"{database}.lock")
        lock.parent.mkdir(parents=True, exist_ok=True)
        with lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:id)"), {"id": MIGRATION_LOCK_ID})
            try:
                yield
            finally:
                connection.execute(
                    text("SELECT pg_advisory_unlock(:id)"), {"id": MIGRATION_LOCK_ID}
                )
                connection.commit()
    finally:
        engine.dispose()


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_S})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            # WAL lets the dashboard read while a sweep writes; FKs make deletes cascade.
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    engine = create_engine(url, pool_pre_ping=True)
    bound_engine(engine)  # connect, keepalive and per-call bounds (sweeper.store.bounds)
    return engine
