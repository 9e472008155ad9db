"""What the commands share: the ``--storage`` option, the constraint options of `best` and
`export` (a price or a limit above 0), failing with a message and an exit code (never a
traceback), and opening a storage to read without creating it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from sweeper.console import err_console
from sweeper.errors import SweeperError

if TYPE_CHECKING:
    from sweeper.store import Store

# -h as well as --help, on every command and sub-command (sweeper/cli.py, cli_study.py,
# cluster.py)
HELP_CONTEXT = {"help_option_names": ["-h", "--help"]}

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


_EXAMPLES = {"--usd-per-hour": "2.50", "--max-hours": "24", "--max-cost": "60"}


def _above_zero(param: typer.CallbackParam, value: float | None) -> float | None:
    """A price or a limit: a finite number above 0 (0 would re-price nothing, or rule out
    every config; REST answers 422 to the same)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        name = max(param.opts, key=len) if param.opts else ""
        example = _EXAMPLES.get(name, "2.50")
        raise typer.BadParameter(f"{value:g} is not a number above 0; give e.g. {example}")
    return value


UsdPerHourOption = Annotated[
    float | None,
    typer.Option("--usd-per-hour", callback=_above_zero, help="re-price at this $/h"),
]
MaxHoursOption = Annotated[
    float | None,
    typer.Option(
        "--max-hours", callback=_above_zero, help="the run must finish within this many hours"
    ),
]
MaxCostOption = Annotated[
    float | None,
    typer.Option("--max-cost", callback=_above_zero, help="the run must cost at most ($)"),
]
MinHeadroomOption = Annotated[
    float | None,
    typer.Option(
        "--min-headroom",
        min=0.0,
        max=0.99,
        help="share of device memory that must stay free at peak, e.g. 0.1",
    ),
]
AllowTruncationOption = Annotated[
    bool,
    typer.Option(
        "--allow-truncation", help="consider configs whose max_seq_length truncates the data"
    ),
]
