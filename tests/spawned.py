"""Targets for processes a test starts with multiprocessing's ``spawn``: a spawned child
imports the module its target lives in, so this one imports nothing at its top. From
tests/test_faults.py (fastapi, the API, optuna, the CLI tests) a child took 2.1 s of CPU
before its target ran, from here 0.9 s (what the target itself imports)."""

from __future__ import annotations

from typing import Any


def start_worker(url: str, barrier: Any, results: Any) -> None:
    """What a worker does first on a database: our tables, then Optuna's."""
    from sweeper.store import Store
    from sweeper.store.optuna import optuna_storage

    barrier.wait()
    try:
        store = Store(url)
        store.migrate()
        optuna_storage(url).engine.dispose()
        store.dispose()
        results.put("ok")
    except Exception as e:  # reported to the test, which shows it
        results.put(f"{type(e).__name__}: {e}")
