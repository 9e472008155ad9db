"""Fixtures of the trial side's tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO


@pytest.fixture(scope="session")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in for a user's own job (``scripts/tiny_job.py``): a tiny Llama directory
    written by save_pretrained and chat records; made once per test process."""
    out = tmp_path_factory.mktemp("job") / "my-job"
    made = subprocess.run(
        [sys.executable, "scripts/tiny_job.py", "--out", str(out), "--records", "120"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return out
