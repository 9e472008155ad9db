"""Shared fixtures: every store test runs against SQLite and a fresh Postgres database."""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Torch's threads, one share of the cores per test process. Two pytest-xdist processes on 2
# cores, each running trial children with torch's default of one thread per core, oversubscribe
# the CPU and OpenMP's spinning waits make each step several times slower: tests/test_seeds.py
# with test_readback.py took 400 s at -n 2 with the default, 181 s with one thread each (2.2x).
# Set before anything imports torch; trial children inherit it. A value set outside is kept.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["OMP_NUM_THREADS"] = str(max(1, _share))
# DeepSpeed JIT-builds its CPU all-reduce (deepspeed_shm_comm) into torch's extension folder,
# ~/.cache/torch_extensions by default: its build file names the venv, so every other checkout's
# venv that ran a ZeRO test rebuilt it (test_zero: 186 s wall, 82 CPU-s with the build; 29 s
# built). One folder per venv builds once per venv. A value set outside is kept.
if "TORCH_EXTENSIONS_DIR" not in os.environ:
    os.environ["TORCH_EXTENSIONS_DIR"] = str(
        Path.home() / ".cache" / "torch_extensions"
        / f"venv-{hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]}"
    )  # fmt: skip

import psycopg  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings

from sweeper.space import Space, load_space
from sweeper.trial.protocol import ChildRequest, PreparedData
from tests.helpers import TINY_SPACE, FaultTally, SessionForkServer

# Fixtures that run a trial child (so torch, transformers and datasets): a test using one is
# marked ``torch``, and the controller run on Python 3.13 (scripts/test.sh) leaves it out.
TORCH_FIXTURES = {
    "tiny_prepared", "recorded", "swept_url", "measured", "users_env", "run_forked",
}  # fmt: skip
# the trial side's own tests (and doctests) import torch themselves
TRIAL_SIDE = (Path(__file__).parent / "trial", Path(__file__).parent.parent / "sweeper" / "trial")

# Property tests draw the same examples on every run, so a red run is a change's doing, not the
# draw's. SWEEPER_HYPOTHESIS=explore draws new examples each run, to look for new cases.
settings.register_profile("fixed", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("SWEEPER_HYPOTHESIS", "fixed"))

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


def admin_execute(sql: str) -> None:
    """One statement on a connection of its own (a test may restart the server, which would
    break a connection kept for the session)."""
    with psycopg.connect(PG_ADMIN_DSN, autocommit=True, connect_timeout=10) as conn:
        conn.execute(sql)  # type: ignore[arg-type]


@pytest.fixture
def postgres_url(pg_admin: psycopg.Connection) -> Iterator[str]:
    """A new empty database, dropped after the test."""
    name = f"sweeper_t_{uuid.uuid4().hex[:10]}"
    admin_execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+psycopg://{_pg_base().split('://', 1)[1]}/{name}"
    admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'sweeper.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def storage_url(request: pytest.FixtureRequest) -> str:
    """The same test, once on SQLite and once on Postgres (marked ``postgres`` at collection)."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("postgres_url")


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sweeper cache (corpus, tokenizer, Arrow files) for the whole test session."""
    return tmp_path_factory.mktemp("sweeper-cache")


@pytest.fixture(scope="session")
def tiny_space() -> Space:
    return load_space(TINY_SPACE)


@pytest.fixture(scope="session")
def run_forked(
    cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionForkServer]:
    """``run_forked(request, timeout_s=...)``: ``run_child`` forked from this test process's
    fork server (``SessionForkServer``), started at first use and stopped at the session's
    end (and with this process, as any zygote dies with its sweeper)."""
    forks = SessionForkServer(cache_dir, tmp_path_factory.mktemp("zygote"))
    try:
        yield forks
    finally:
        forks.close()


@pytest.fixture(scope="session")
def tiny_prepared(
    tiny_space: Space, cache_dir: Path, run_forked: SessionForkServer
) -> PreparedData:
    """The tiny workload's corpus and tokenizer, made once by a real prepare child (forked, as
    a sweep's is)."""
    run = run_forked(
        ChildRequest(
            kind="prepare", workload=tiny_space.workload, device="cpu", cache_dir=str(cache_dir)
        ),
        timeout_s=300,
    )
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail)
    return PreparedData.model_validate(run.result.payload)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if TORCH_FIXTURES & fixtures or any(item.path.is_relative_to(d) for d in TRIAL_SIDE):
            item.add_marker(pytest.mark.torch)
        # marked at collection, so that -m "not postgres" leaves out the Postgres variants of
        # parametrized tests (a marker applied while a fixture sets up comes too late for -m)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if POSTGRES_FIXTURES & fixtures or "postgres" in params.values():
            item.add_marker(pytest.mark.postgres)


# a test that asks for one of these needs the Postgres server
POSTGRES_FIXTURES = {"pg_admin", "postgres_url"}

TALLY = "fault_tally"  # a user property of a fault test's report: its tally's line


@pytest.fixture
def fault_report(request: pytest.FixtureRequest) -> Callable[[FaultTally], FaultTally]:
    """Record a fault test's tally; the session's summary lists every one."""

    def report(tally: FaultTally) -> FaultTally:
        # on the test's report, which pytest-xdist carries back from its worker processes
        request.node.user_properties.append((TALLY, tally.line()))
        print(tally.line())
        return tally

    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = [
        value
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "call"
        for key, value in getattr(report, "user_properties", ())
        if key == TALLY
    ]
    if lines:
        terminalreporter.section("fault tests: what each fault left behind")
        for line in lines:
            terminalreporter.line(line)
