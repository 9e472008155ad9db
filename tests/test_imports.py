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


def _imports_of(path: object) -> set[str]:
    """Every sweeper module a file imports, at the top or inside a function."""
    import ast
    from pathlib import Path

    assert isinstance(path, Path)
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in names if name.startswith("sweeper")}


def test_the_layering_rules_hold() -> None:
    """shared/STYLE.md's rules: the sweep never imports the recommendation (its caller decides);
    the space never imports the search (so reading one stays light); doctor and studyfile use
    sweep.prepare and store.optuna, never the sweep loop."""
    from tests.helpers import REPO

    broken = []
    for path in sorted((REPO / "sweeper" / "sweep").glob("*.py")):
        for name in _imports_of(path):
            if name.startswith(("sweeper.recommend", "sweeper.compare", "sweeper.console")):
                broken.append(f"{path.name} imports {name}")
    for name in _imports_of(REPO / "sweeper" / "space.py") | _imports_of(REPO / "sweeper/job.py"):
        if name.startswith(("sweeper.search", "sweeper.sweep", "sweeper.store")):
            broken.append(f"space/job import {name}")
    allowed = ("sweeper.sweep.prepare",)
    for module in ("doctor.py", "studyfile.py"):
        for name in _imports_of(REPO / "sweeper" / module):
            if name.startswith("sweeper.sweep") and not name.startswith(allowed):
                broken.append(f"{module} imports {name}")
    assert not broken, broken
