"""Markers select what they say: ``-m "not postgres"`` runs no test that needs the Postgres
server, including the Postgres variants of tests parametrized over both backends."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import REPO

# files with each way of reaching Postgres: the storage_url fixture's variant, a fixture of the
# test file's own, a parametrized backend, the postgres_url fixture asked for by name
FILES = ["tests/test_store.py", "tests/test_api_fuzz.py", "tests/test_faults.py"]


def _collected(marker: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + ["-m", marker, *FILES],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_not_postgres_leaves_out_every_postgres_variant_and_postgres_selects_them() -> None:
    without, only = _collected("not postgres"), _collected("postgres")
    assert without and only, (without, only)
    assert not [test for test in without if "postgres" in test], without
    assert any("[sqlite" in test for test in without), without  # the SQLite variants stay
    variants = [test for test in only if "[" in test]
    assert variants and all("postgres" in test for test in variants), variants
    assert not set(without) & set(only)
