"""Every database call has a bound (sweeper.store.bounds): a Postgres that stops answering
with its sockets open is an outage the retry window rides out, not a hang. Real Postgres,
behind a real TCP proxy that black-holes (tests/proxy.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from sweeper.errors import StorageError
from sweeper.store import Store
from sweeper.store.bounds import CONNECT_TIMEOUT_S
from sweeper.store.optuna import optuna_storage
from sweeper.store.retry import connection_lost
from tests.proxy import FaultProxy

BOUND_S = 2.0


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a thread: its result or exception, or a failure if it is still blocked
    after ``seconds`` (without the bounds it blocks for good, and so would the suite)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # handed to the test
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"the call still blocks after {seconds} s: a database call without a bound")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


@pytest.fixture
def bounded(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setenv("SWEEPER_DB_STATEMENT_BOUND_S", str(BOUND_S))
    return BOUND_S


def test_a_half_open_database_is_ridden_out_like_an_outage(
    postgres_url: str, bounded: float
) -> None:
    with FaultProxy() as proxy:
        store = Store(proxy.url_for(postgres_url), retry_s=60)
        store.migrate()
        assert store.list_studies() == []  # a pooled connection, open through the proxy
        proxy.mode = "blackhole"
        back = threading.Timer(4.0, lambda: setattr(proxy, "mode", "forward"))
        back.start()
        started = time.monotonic()
        try:
            # the pooled connection never answers again; the call fails on the bound, and
            # the retry connects anew once the proxy forwards
            assert _within(120, store.list_studies) == []
        finally:
            back.cancel()
            store.dispose()
        elapsed = time.monotonic() - started
    # 4 s of black hole, then a reconnect; unbounded, this call never returned. The upper
    # margin is wide for a loaded machine: a connect attempt made in the black hole waits
    # out libpq's connect_timeout (10 s).
    assert 4.0 <= elapsed < 40, elapsed


def test_without_a_retry_window_a_half_open_database_fails_within_the_bound(
    postgres_url: str, bounded: float
) -> None:
    with FaultProxy() as proxy:
        store = Store(proxy.url_for(postgres_url))
        store.migrate()
        store.list_studies()
        proxy.mode = "blackhole"
        started = time.monotonic()
        try:
            with pytest.raises(StorageError):
                _within(120, store.list_studies)
        finally:
            store.dispose()
        elapsed = time.monotonic() - started
    assert bounded <= elapsed < bounded * 10, elapsed


def test_optunas_storage_is_bounded_too(postgres_url: str, bounded: float) -> None:
    import optuna

    with FaultProxy() as proxy:
        storage = optuna_storage(proxy.url_for(postgres_url))
        optuna.create_study(study_name="bounded", storage=storage)
        proxy.mode = "blackhole"
        started = time.monotonic()
        try:
            with pytest.raises(Exception) as raised:
                _within(120, storage.get_all_studies)
        finally:
            storage.engine.dispose()
        elapsed = time.monotonic() - started
    # Optuna wraps it (StorageInternalError, "invalid data in the commit"); what it wraps is a
    # lost connection, so a sweep's retry window rides it out like a restart
    assert connection_lost(raised.value), repr(raised.value)
    # the pooled connection's ping waits the bound, the new connection libpq's connect_timeout
    assert bounded <= elapsed < bounded + CONNECT_TIMEOUT_S * 3, elapsed
