"""A database out of reach or not created: said with what to do (a user walk met both, told
in the driver's words alone, with a sqlalche.me link), at the migration and on any read."""

from __future__ import annotations

import socket

import pytest
from sqlalchemy import make_url

from sweeper.errors import StorageError
from sweeper.store import Store


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.postgres
def test_a_database_not_created_is_named_with_the_command_that_creates_it(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Said at once, not ridden out as a lost connection (a walk read "the database
    connection was lost; retrying" and waited 10 s for a database that was never there)."""
    missing = postgres_url.rsplit("/", 1)[0] + "/sweeper_never_created"
    url = make_url(missing)
    user = f" -U {url.username}" if url.username else ""
    create = f"createdb -h {url.host} -p {url.port or 5432}{user} sweeper_never_created"
    store = Store(missing, retry_s=3)  # a retry would log "retrying" and wait 3 s
    try:
        with pytest.raises(StorageError) as migrating:
            store.migrate()
        said = str(migrating.value)
        assert 'database "sweeper_never_created" does not exist' in said
        assert f"Create it ({create})" in said
        with pytest.raises(StorageError) as reading:
            store.list_studies()
        said = str(reading.value)
        assert said.startswith("database error on ") and "Create it (createdb" in said
        assert "sqlalche.me" not in said
        assert "retrying" not in caplog.text, caplog.text
    finally:
        store.dispose()


def test_a_port_nothing_listens_on_is_said_so() -> None:
    port = _free_port()
    store = Store(f"postgresql+psycopg://postgres@127.0.0.1:{port}/sweeper", retry_s=0)
    try:
        with pytest.raises(StorageError) as migrating:
            store.migrate()
        said = str(migrating.value)
        assert f"Nothing answers at 127.0.0.1:{port}" in said
        assert f"pg_isready -h 127.0.0.1 -p {port}" in said
    finally:
        store.dispose()
