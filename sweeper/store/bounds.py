"""Every database call has a bound, so a database that stops answering is an outage, not a hang.

A Postgres that dies, restarts or fails over closes its sockets: the call fails at once and
``sweeper.store.retry`` rides it out. One that stops answering but keeps its sockets open (a
frozen VM, a network partition behind a proxy or load balancer, a half-open TCP connection) used
to leave a sweep and its heartbeat blocked in ``poll()`` for good. Here:

- connecting waits at most ``CONNECT_TIMEOUT_S`` (libpq's ``connect_timeout``);
- TCP keepalives and ``tcp_user_timeout`` let the kernel notice a peer that vanished;
- every wait on an open connection (a statement, a fetch, a commit) is bounded by
  ``STATEMENT_BOUND_S``: past it the connection is closed and the call fails as a lost
  connection, which the retry window then treats like any other outage. A proxy that keeps
  accepting bytes and answers nothing is only caught by this bound, since TCP itself is fine.

SQLite waits at most ``SQLITE_BUSY_S`` for a lock (its busy timeout).

``SWEEPER_DB_STATEMENT_BOUND_S`` changes the statement bound (the tests use seconds).
"""

from __future__ import annotations

import functools
import os
from typing import Any

CONNECT_TIMEOUT_S = 10
STATEMENT_BOUND_S = 60.0  # 18x the longest wait seen at 10,000 trials (bench/db_bound.py)
SQLITE_BUSY_S = 30.0


def statement_bound_s() -> float:
    raw = os.environ.get("SWEEPER_DB_STATEMENT_BOUND_S")
    try:
        return float(raw) if raw else STATEMENT_BOUND_S
    except ValueError:
        return STATEMENT_BOUND_S


def postgres_connect_args() -> dict[str, Any]:
    """libpq's own bounds, for psycopg's ``connect``."""
    return {
        "connect_timeout": CONNECT_TIMEOUT_S,
        "keepalives": 1,
        "keepalives_idle": 15,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 30_000,  # ms: data sent and not acknowledged for 30 s
    }


@functools.cache
def bounded_connection_class() -> Any:
    """psycopg's Connection whose every wait ends after ``statement_bound_s()``: the
    connection is then closed (its state is unknown) and an ``OperationalError`` raised."""
    import psycopg

    wait_timeout: type[BaseException] = getattr(psycopg.errors, "_WaitTimeout", TimeoutError)

    class BoundedConnection(psycopg.Connection):  # type: ignore[type-arg]
        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            bound = statement_bound_s() if timeout is None else timeout
            try:
                return super().wait(gen, interval=interval, timeout=bound)
            except wait_timeout:
                self.pgconn.finish()
                raise psycopg.OperationalError(
                    f"the database did not answer within {bound:g} s on an open connection "
                    "(half-open, or the server stopped answering); the connection is closed"
                ) from None

    return BoundedConnection


def bound_engine(engine: Any) -> None:
    """Make every new connection of a SQLAlchemy ``engine`` on psycopg a bounded one (call
    before it connects, or dispose it after: pooled connections keep their class)."""
    from sqlalchemy import event

    if engine.dialect.driver != "psycopg":
        return
    connection_class = bounded_connection_class()

    @event.listens_for(engine, "do_connect")
    def _connect(_dialect: Any, _record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        return connection_class.connect(*cargs, **{**postgres_connect_args(), **cparams})
