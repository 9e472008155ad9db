"""Shared fixtures: every store test runs against SQLite and a fresh Postgres database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

PG_ADMIN_DSN = os.environ.get("SWEEPER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_base() -> str:
    return PG_ADMIN_DSN.rsplit("/", 1)[0]


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[psycopg.Connection]:
    """An autocommit connection to Postgres; the test fails (not skips) if none is running."""
    try:
        conn = psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        pytest.fail(
            f"Postgres is not reachable at {PG_ADMIN_DSN}: {e}. Start it with "
            "`pg_ctlcluster --skip-systemctl-redirect 15 main start` (scripts/test.sh does)."
        )
    yield conn
    conn.close()


@pytest.fixture
def postgres_url(pg_admin: psycopg.Connection) -> Iterator[str]:
    """A new empty database, dropped after the test."""
    name = f"sweeper_t_{uuid.uuid4().hex[:10]}"
    pg_admin.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+psycopg://{_pg_base().split('://', 1)[1]}/{name}"
    pg_admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'sweeper.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def storage_url(request: pytest.FixtureRequest) -> str:
    """The same test, once on SQLite and once on Postgres."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    request.applymarker(pytest.mark.postgres)
    return request.getfixturevalue("postgres_url")
