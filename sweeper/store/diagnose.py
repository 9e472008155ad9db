"""What a database error means to the person who reads it: a disk that is full (where, and how
much is free), a database sweeper never wrote to. ``Store.session`` and the sweep raise these
messages instead of SQLAlchemy's (``sweeper.store.retry.disk_full`` tells the kind)."""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy import make_url


def no_tables(error: BaseException) -> bool:
    """Whether ``error`` says one of our tables does not exist (a database sweeper never
    wrote to): SQLite's "no such table", Postgres' SQLSTATE 42P01."""
    orig = getattr(error, "orig", None)
    text = str(orig)
    if "sweeper_" not in text:
        return False
    return "no such table" in text or getattr(orig, "sqlstate", None) == "42P01"


_MIN_FREE_MB = 10.0


def disk_full_message(url: str, error: BaseException) -> str:
    """Where the disk is full and how much is free (SQLite: the file's own disk)."""
    from sweeper.store.store import redact  # store.py imports this module

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        path = Path(parsed.database).resolve()  # type: ignore[arg-type]
        try:
            free = f"{shutil.disk_usage(path.parent).free / 1e6:,.1f} MB free"
        except OSError:
            free = "free space unknown"
        try:
            size_mb = path.stat().st_size / 1e6
        except OSError:
            size_mb = 0.0
        # a write needs room for its rollback journal (at most the database's own pages) and
        # the rows it adds (a trial's record is a few kB)
        needed_mb = max(_MIN_FREE_MB, 2 * size_mb)
        return (
            f"the disk under {path} is full ({free}): SQLite could not write. It needs room "
            f"for its journal, up to the database's own size ({size_mb:,.1f} MB): free at "
            f"least {needed_mb:,.0f} MB there, or move the study to another disk (`sweeper "
            "study export`, then `--storage` elsewhere); the failed write left the database "
            "as it was"
        )
    return (
        f"the database server at {redact(url)} is out of disk space ({error.__class__.__name__}"
        "): free space on its data volume; the failed write left the database as it was"
    )


def database_fix(url: str, said: str) -> str:
    """What to do about a Postgres database that is out of reach or does not exist, from the
    driver's words ``said`` ("": nothing to add). A user walk met both, said in the driver's
    words alone."""
    import re

    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return ""
    host, port = parsed.host or "localhost", parsed.port or 5432
    if re.search(r'database "[^"]*" does not exist', said):
        user = f" -U {parsed.username}" if parsed.username else ""
        return (
            f"Create it (createdb -h {host} -p {port}{user} {parsed.database}), or point "
            "--storage (or SWEEPER_STORAGE) at a database that exists."
        )
    if "Connection refused" in said or "could not translate host name" in said:
        return (
            f"Nothing answers at {host}:{port}: check the URL's host and port, and that Postgres "
            f"runs there (pg_isready -h {host} -p {port} says)."
        )
    return ""


def database_error_message(url: str, error: BaseException) -> str:
    """A database error in words: SQLAlchemy's text without its web link, and what to do
    where the server is out of reach or the database does not exist (``database_fix``)."""
    import re

    from sweeper.store.store import redact  # store.py imports this module

    said = re.sub(r"\s*\(Background on this error at: [^)]*\)", "", str(error)).strip()
    fix = database_fix(url, said)
    return f"database error on {redact(url)}: {said}" + (f". {fix}" if fix else "")
