"""Fixtures of the trial side's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import make_tiny_job


@pytest.fixture(scope="session")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stand-in for a user's own job (``scripts/tiny_job.py``): a tiny Llama directory
    written by save_pretrained and chat records; made once per test process."""
    out = tmp_path_factory.mktemp("job") / "my-job"
    make_tiny_job(out, 120)
    return out
