"""The controller stays light: the CLI and API never import torch or transformers."""

from __future__ import annotations

import subprocess
import sys


def test_cli_and_api_do_not_import_torch() -> None:
    code = (
        "import sys, sweeper.cli, sweeper.sweep.run, sweeper.control, sweeper.launcher, api.app\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'datasets', 'tokenizers') "
        "if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_reading_a_space_loads_no_optuna_numpy_or_scipy() -> None:
    """``import sweeper.space`` (and the job it describes) is what every command that reads a
    space file pays: the names of the samplers live in sweeper.samplers, not sweeper.search."""
    code = (
        "import sys, sweeper.space, sweeper.job\n"
        "heavy = sorted(m for m in ('optuna', 'numpy', 'scipy', 'sqlalchemy', 'torch') "
        "if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_help_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "--help"], capture_output=True, text=True, check=True
    )
    for command in ("launch", "serve", "best"):
        assert command in out.stdout


def test_no_module_is_a_hub() -> None:
    """Issue 30: no module of sweeper, api or dashboards over 800 lines (the migrations aside).
    A file that grows past it holds more than one idea: split it by noun."""
    from tests.helpers import REPO

    too_long = {
        str(path.relative_to(REPO)): n
        for package in ("sweeper", "api", "dashboards")
        for path in (REPO / package).rglob("*.py")
        if "migrations" not in path.parts
        and (n := len(path.read_text(encoding="utf-8").splitlines())) > 800
    }
    assert not too_long, too_long
