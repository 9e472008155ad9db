"""Riding out a database restart: a call that failed because the connection was lost is
tried again, with backoff, for a bounded time.

A sweep's trial can take many minutes; Postgres restarting under it (a failover, an upgrade,
``pg_ctl restart``) must not lose the measurement. Connections are checked before use
(``pool_pre_ping``), and a call that still fails on a lost connection is retried until
``retry_s`` has passed; any other database error is raised at once.

A retried write that had committed before the connection dropped runs twice: the writes
retried here are idempotent upserts and updates by trial number, except Optuna's
``create_new_trial``, where the worst case is one extra WAITING-free trial number.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

logger = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

FIRST_WAIT_S = 0.25
LONGEST_WAIT_S = 4.0


def _chain(error: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not e for e in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the database's disk is full: SQLite's
    SQLITE_FULL, Postgres' SQLSTATE 53100 (disk_full). Waiting does not free a disk."""
    for current in _chain(error):
        orig = getattr(current, "orig", current)
        if getattr(orig, "sqlite_errorname", None) == "SQLITE_FULL":
            return True
        if getattr(orig, "sqlstate", None) == "53100":
            return True
        if "database or disk is full" in str(orig) or "No space left on device" in str(orig):
            return True
    return False


# Postgres refusing this connection for good: the database, the role or the password is
# not there (SQLSTATE 3D000, 28000, 28P01; at connect time psycopg gives only the server's
# words). Waiting does not create them: a walk's missing database was "lost; retrying" 10 s
_REFUSED_FOR_GOOD = ("3D000", "28000", "28P01")
_REFUSED_WORDS = ("does not exist", "password authentication failed", "no pg_hba.conf entry")


def refused_for_good(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) is the server refusing this connection for a
    reason waiting cannot change (a database or role that does not exist, a bad password)."""
    for current in _chain(error):
        orig = getattr(current, "orig", current)
        if getattr(orig, "sqlstate", None) in _REFUSED_FOR_GOOD:
            return True
        if "FATAL:" in str(orig) and any(words in str(orig) for words in _REFUSED_WORDS):
            return True
    return False


def connection_lost(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it) says the database connection went away; a full
    disk is not (it is said at once, see ``disk_full``), nor a connection the server refuses
    for good (``refused_for_good``)."""
    if disk_full(error) or refused_for_good(error):
        return False
    for current in _chain(error):
        if isinstance(current, OperationalError | InterfaceError):
            return True
        if isinstance(current, DBAPIError) and current.connection_invalidated:
            return True
    return False


def retried(function: F, retry_s: Callable[[], float], what: str) -> F:
    """``function``, called again while it fails on a lost connection and ``retry_s()``
    seconds have not passed since the first try."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        wait = FIRST_WAIT_S
        while True:
            try:
                return function(*args, **kwargs)
            except Exception as e:
                left = retry_s() - (time.monotonic() - started)
                if left <= 0 or not connection_lost(e):
                    raise
                logger.warning("%s: the database connection was lost; retrying", what)
                time.sleep(min(wait, left))
                wait = min(wait * 2, LONGEST_WAIT_S)

    return call  # type: ignore[return-value]
