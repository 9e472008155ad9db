"""``sweeper launch`` and ``doctor`` on a script space whose program is not there: said when
the file is read (its path, the directory it resolved against, the YAML line, the fix), exit 2,
before any preparation and with nothing written. A launch whose trials all fail exits 3
(``tests/trial/test_script.py`` runs one)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import yaml

from sweeper import yamllines
from sweeper.space_script import program_problem
from tests.helpers import TINY_SPACE, run_sweeper


def _script_space(tmp_path: Path, command: list[str], cwd: str | None = None) -> Path:
    """The tiny space as a script space, its command written one word a line (so each word
    has its own YAML line)."""
    space = yaml.safe_load(TINY_SPACE.read_text())
    space["workload"]["engine"] = "script"
    space["workload"]["script"] = {"command": command, **({"cwd": cwd} if cwd else {})}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space, default_flow_style=False, sort_keys=False))
    return path


def _line_of(path: Path, word: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if word in line)


def test_a_missing_script_is_refused_when_the_space_is_read(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"  # its own: nothing is prepared into it
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text("import sweeper\nsweeper.callback()\n")
    path = _script_space(tmp_path, [sys.executable, "trian.py", "--bf16", "True"], cwd="job")
    db = tmp_path / "never.db"
    started = time.monotonic()
    launch = run_sweeper(
        "launch", "--space", str(path), "--storage", f"sqlite:///{db}", cache_dir=cache_dir,
        cwd=tmp_path,
    )  # fmt: skip
    took = time.monotonic() - started
    assert launch.returncode == 2, launch.stdout + launch.stderr
    said = " ".join(launch.stderr.split())
    job = (tmp_path / "job").resolve()
    assert f"{path}:{_line_of(path, 'trian.py')}: workload.script.command[1]: trian.py " in said
    assert f"does not exist (resolved against {job}, workload.script.cwd (job)" in said, said
    assert "set workload.script.cwd to the directory it is relative to" in said
    assert "Traceback" not in launch.stderr
    assert not db.exists()  # nothing written, no preparation: the data was never read
    assert not cache_dir.exists() or not any(cache_dir.iterdir())
    # doctor reads the file the same way, before examining anything (its probes take minutes)
    doctor = run_sweeper("doctor", "--space", str(path), cache_dir=cache_dir, cwd=tmp_path)
    assert doctor.returncode == 2 and "trian.py does not exist" in doctor.stderr, doctor.stderr
    assert "Traceback" not in doctor.stderr
    # each was refused in the time a Python start takes, not after a preparation (~40 s)
    assert took < 30, took


def _problem(tmp_path: Path, command: list[str], cwd: str | None = None) -> str | None:
    path = _script_space(tmp_path, command, cwd)
    _, lines = yamllines.load(path.read_text(), str(path), ValueError)
    return program_problem(command, cwd, str(path), lines)


def test_each_launch_form_names_its_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """python, accelerate launch, torchrun and python -m lines, relative to the directory
    sweeper runs in when the space sets no cwd."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("")
    fine = [
        ["python", "-u", "src/train.py", "--x", "1"],
        ["accelerate", "launch", "--num_processes", "2", "--mixed_precision=bf16", "src/train.py"],
        ["torchrun", "--standalone", "--nproc-per-node", "2", "src/train.py", "--lr", "1"],
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "src/train.py"],
        ["python", "-m", "pkg.train"],
        ["torchrun", "-m", "pkg.train"],
        ["python", "-c", "print(1)"],  # no file to check
    ]
    for command in fine:
        assert _problem(tmp_path, command) is None, command
    for command, index in (
        (["accelerate", "launch", "--num_processes", "2", "src/tarin.py"], 4),
        (["torchrun", "--standalone", "--nproc-per-node", "2", "tarin.py"], 4),
        (["python", "-W", "ignore", "src"], 3),  # a directory is not a script
    ):
        problem = _problem(tmp_path, command)
        assert problem is not None and f"workload.script.command[{index}]: " in problem, problem
        assert f"resolved against {tmp_path.resolve()}, the directory sweeper was started in" in (
            problem
        )
    module = _problem(tmp_path, [sys.executable, "-m", "pkg_that_is_not.train"])
    assert module is not None and "module pkg_that_is_not.train is neither under" in module
    assert f"nor importable by {sys.executable}" in module
    absent = _problem(tmp_path, [str(tmp_path / "venv" / "bin" / "python"), "src/train.py"])
    assert absent is not None and "workload.script.command[0]: " in absent
    assert "venv/bin/python does not exist" in absent
