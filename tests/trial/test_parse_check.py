"""``sweeper doctor``'s parse check (``sweeper.preflight_script.script_parses``): the user's
program, run in its python with the words a trial gives it, as far as its argument parsing and
no further. A parser that refuses them (a required argument the command lacks, a misspelt flag,
a knob flag an argparse parser does not define) is a problem with the parser's own message;
a program that parses, or reaches sweeper's line first, stops there and trains nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from sweeper.preflight_script import script_parses
from sweeper.space import Space, parse_space
from tests.helpers import REPO

pytestmark = pytest.mark.torch


def _space(command: list[str], cwd: Path, form: str = "flags") -> Space:
    space = yaml.safe_load((REPO / "examples/trainer/space.yaml").read_text())
    space["workload"]["script"] = {"command": command, "cwd": str(cwd), "knobs": form}
    return parse_space(yaml.safe_dump(space))


def _trainer(job: Path, *drop: str, add: tuple[str, ...] = ()) -> list[str]:
    words = [
        sys.executable, str(REPO / "examples/trainer/train.py"),
        "--model_name_or_path", str(job / "model"), "--data_file", str(job / "chats.jsonl"),
        "--output_dir", str(job / "parse-out"), "--report_to", "none", "--use_cpu", "True",
        *add,
    ]  # fmt: skip
    for word in drop:  # a flag and its value
        at = words.index(word)
        del words[at : at + 2]
    return words


def test_the_trainer_example_parses_and_stops_there(
    job: Path, tmp_path: Path, cache_dir: Path
) -> None:
    assert script_parses(_space(_trainer(job), tmp_path), cache_dir) == ([], [])
    assert not (job / "parse-out").exists()  # TrainingArguments built; no model, no Trainer


def test_the_sft_example_parses_through_trl(job: Path, tmp_path: Path, cache_dir: Path) -> None:
    command = [
        sys.executable, str(REPO / "examples/sft_lora/train.py"),
        "--model_name_or_path", str(job / "model"), "--data_file", str(job / "chats.jsonl"),
        "--output_dir", str(job / "parse-sft"), "--report_to", "none", "--use_cpu", "True",
    ]  # fmt: skip
    assert script_parses(_space(command, tmp_path, "sft_flags"), cache_dir) == ([], [])
    assert not (job / "parse-sft").exists()


@pytest.mark.parametrize(
    ("drop", "add", "said", "fix"),
    [
        (
            ("--data_file",),
            (),
            "error: the following arguments are required: --data_file",
            "add them to workload.script.command",
        ),
        (
            (),
            ("--lora_alpah", "32"),
            "Some specified arguments are not used by the HfArgumentParser: ['--lora_alpah', '32']",
            "--lora_alpah is a word of workload.script.command, not an argument your script's",
        ),
    ],
)
def test_a_command_the_parser_refuses_is_a_problem_in_its_own_words(
    job: Path,
    tmp_path: Path,
    cache_dir: Path,
    drop: tuple[str, ...],
    add: tuple[str, ...],
    said: str,
    fix: str,
) -> None:
    problems, notes = script_parses(_space(_trainer(job, *drop, add=add), tmp_path), cache_dir)
    assert notes == [] and len(problems) == 1, problems
    (problem,) = problems
    assert problem.startswith("workload.script.command: your script stops before it trains")
    assert said in problem and fix in problem
    assert "--per_device_train_batch_size 2" in problem  # the words a trial gives it
    if add:  # where the program raised: its own call, not the check's wrapper
        assert "raised at " in problem and "train.py:40 (" in problem, problem
        assert "parse_check" not in problem


_ARGPARSE = """
import argparse
from pathlib import Path

import sweeper

parser = argparse.ArgumentParser()
parser.add_argument("--data", required=True)
parser.add_argument("--per_device_train_batch_size", type=int)
args = parser.parse_args()
Path("after-parse").write_text(str(args))
sweeper.step({})
"""


def test_an_argparse_parser_without_a_knobs_flag_is_told_how_to_take_it(
    tmp_path: Path, cache_dir: Path
) -> None:
    (tmp_path / "train.py").write_text(_ARGPARSE)
    space = _space([sys.executable, "train.py", "--data", "x.jsonl"], tmp_path)
    (problem,) = script_parses(space, cache_dir)[0]
    assert "train.py: error: unrecognized arguments: --gradient_accumulation_steps 1" in problem
    assert "add them to it" in problem and "knobs: env" in problem
    assert not (tmp_path / "after-parse").exists()
    # under knobs: env the command alone is parsed, and it is taken: the program stops there
    assert script_parses(_space(space.workload.script.command, tmp_path, "env"), cache_dir) == (
        [],
        [],
    )
    assert not (tmp_path / "after-parse").exists()


def test_a_program_that_reaches_sweepers_line_before_parsing_stops_there(
    tmp_path: Path, cache_dir: Path
) -> None:
    (tmp_path / "train.py").write_text(
        "import argparse\nfrom pathlib import Path\n\nimport sweeper\n\n"
        "callbacks = [sweeper.callback()]\n"
        "Path('after-line').write_text('trained')\n"
        "argparse.ArgumentParser().parse_args()\n"
    )
    space = _space([sys.executable, "train.py"], tmp_path, "env")
    assert script_parses(space, cache_dir) == ([], [])
    assert not (tmp_path / "after-line").exists()


def test_a_program_that_catches_everything_still_stops_at_its_parse(
    tmp_path: Path, cache_dir: Path
) -> None:
    """The stop is os._exit, not an exception the program's own ``except BaseException``
    could swallow and train on."""
    (tmp_path / "train.py").write_text(
        "import argparse\nfrom pathlib import Path\n\nimport sweeper\n\n"
        "try:\n    argparse.ArgumentParser().parse_args()\n"
        "except BaseException:\n    pass\n"
        "Path('after-parse').write_text('trained')\nsweeper.step({})\n"
    )
    space = _space([sys.executable, "train.py"], tmp_path, "env")
    assert script_parses(space, cache_dir) == ([], [])
    assert not (tmp_path / "after-parse").exists()
