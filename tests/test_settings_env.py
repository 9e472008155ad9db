"""A wrong SWEEPER_* variable through the real CLI: said by its name with exit 2, as any other
input mistake, never as a traceback or pydantic's report (which echoed a token's value)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers import run_sweeper


def _env(tmp_path: Path, **variables: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_")}
    return env | {"COLUMNS": "300", "SWEEPER_CACHE_DIR": str(tmp_path / "cache")} | variables


def test_a_wrong_variable_is_named_with_exit_2_on_every_command(tmp_path: Path) -> None:
    ran = run_sweeper(
        "best", "--study", "mine", cwd=tmp_path, env=_env(tmp_path, SWEEPER_PORT="abc")
    )
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert (
        "error: invalid SWEEPER_* environment: SWEEPER_PORT: Input should be a valid integer"
        in (ran.stderr)
    ), ran.stderr
    assert "Traceback" not in ran.stderr and "pydantic" not in ran.stderr


def test_a_short_token_is_refused_without_printing_it(tmp_path: Path) -> None:
    token = "s3cr3t-but-short"[:15]
    ran = run_sweeper("serve", "--check", cwd=tmp_path, env=_env(tmp_path, SWEEPER_API_TOKEN=token))
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "SWEEPER_API_TOKEN: shorter than 16 characters; use e.g." in ran.stderr, ran.stderr
    assert token not in ran.stdout + ran.stderr
    origins = _env(tmp_path, SWEEPER_CORS_ORIGINS="*")
    ran = run_sweeper("serve", "--check", cwd=tmp_path, env=origins)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "SWEEPER_CORS_ORIGINS: '*' is not an explicit origin" in ran.stderr, ran.stderr
