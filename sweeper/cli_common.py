"""What the commands share: the ``--storage`` option, failing with a message and an exit code
(never a traceback), and opening a storage to read without creating it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from sweeper.console import err_console
from sweeper.errors import SweeperError

if TYPE_CHECKING:
    from sweeper.store import Store

StorageOption = Annotated[
    str | None,
    typer.Option(
        "--storage",
        help="SQLAlchemy URL: sqlite:///file.db or postgresql+psycopg://user@host/db, or a path "
        "to an SQLite file (default: $SWEEPER_STORAGE, then the space's storage, then "
        "sqlite:///sweeper.db in the current directory)",
    ),
]


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def reading_store(storage: str | None) -> Store:
    """The storage a reading command (best, export, study export) reads: an SQLite file that
    does not exist is an error that says where it looked, never a new empty database."""
    from sweeper.settings import absent_sqlite_file, resolve_storage
    from sweeper.store import Store

    url = resolve_storage(storage)
    absent = absent_sqlite_file(url)
    if absent is not None:
        where = "--storage" if storage else "the default storage"
        raise fail(
            f"no database at {absent.resolve()} ({where}, {url}): `sweeper launch` "
            "writes its database where it runs (sqlite:///sweeper.db in that directory); "
            "run this there, or pass --storage with that file's path",
            code=2,
        )
    try:
        return Store(url)
    except SweeperError as e:
        raise fail(str(e), code=2) from None


def with_storage(error: SweeperError, store: Store) -> str:
    """The error, naming the storage when a study was not found in it."""
    from sweeper.errors import StudyNotFoundError

    if isinstance(error, StudyNotFoundError):
        return str(error).replace("in this storage", f"in {store.redacted_url}", 1)
    return str(error)
