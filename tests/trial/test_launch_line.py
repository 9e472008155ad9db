"""Which launcher a command starts with is read in one place (``sweeper.trial.launch_line``):
the trial that starts it, the space's checks of it and the export of the winner's line answer
alike, and reading a script space stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sweeper.launch_export import on_devices
from sweeper.script_defaults import said
from sweeper.space_script import script_of
from sweeper.trial.launch_line import launcher
from tests.helpers import REPO

LINES = [
    (["torchrun", "--nproc-per-node", "4", "train.py", "--bf16"], "torchrun"),
    (["/opt/venv/bin/torchrun", "--nproc_per_node=4", "-m", "pkg.train"], "torchrun"),
    (["python3", "-m", "torch.distributed.run", "--nproc-per-node", "4", "train.py"], "torchrun"),
    (["accelerate", "launch", "--num_processes", "4", "train.py"], "accelerate"),
    (["python", "train.py", "--nproc-per-node", "4"], None),
    (["accelerate", "config"], None),
]


@pytest.mark.parametrize(("command", "expected"), LINES)
def test_every_reader_of_a_launch_line_answers_as_the_one_launcher(
    command: list[str], expected: str | None
) -> None:
    assert launcher(command) == expected
    # the space's checks: the program after the launcher's own options
    found = script_of(command)
    if expected is not None:
        assert found is not None and found[1] in ("train.py", "pkg.train"), found
    # the command's own process count is the launcher's, and only a launcher's
    devices = said(command, "flags").get("devices")
    assert (devices is not None and devices[0] == 4) == (expected is not None), devices
    # the export runs a torchrun line on the winner's devices, rewriting its own count
    moved = on_devices(command, 2)
    if expected == "torchrun":
        assert "4" not in " ".join(moved) and ("2" in moved or "--nproc_per_node=2" in moved)
    elif expected == "accelerate":
        assert moved == command  # accelerate's count is its config's: the export writes that


def test_the_launcher_is_asked_in_one_place() -> None:
    """The words that make a torchrun line were written in three modules besides the trial's."""
    hits = [
        path.relative_to(REPO).as_posix()
        for path in sorted((REPO / "sweeper").rglob("*.py"))
        if '.name == "torchrun"' in path.read_text() or 'name == "torchrun" or' in path.read_text()
    ]
    assert hits == ["sweeper/trial/launch_line.py"], hits


def test_reading_a_script_space_imports_neither_torch_nor_a_process_launcher(tmp_path) -> None:
    train = tmp_path / "train.py"
    train.write_text("import sweeper\n")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from sweeper.space import parse_space\n"
        "text = Path('tests/spaces/tiny.yaml').read_text().replace('\\nworkload:\\n', "
        "'\\nworkload:\\n  engine: script\\n  script:\\n    command: [torchrun, "
        f'--nproc-per-node, "1", {train}]\\n\', 1)\n'
        "parse_space(text)\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', "
        "'subprocess')]\n"
        "print(heavy)\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]", ran.stdout
