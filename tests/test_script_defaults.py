"""A script's knobs the space does not list run at the values the user's command gives them
(``sweeper.script_defaults``), not at sweeper's defaults, which the trial would otherwise
append after the user's own words."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeper import knobs, script_defaults
from sweeper.space import Baseline, Space
from sweeper.sweep.observer import SweepObserver
from sweeper.sweep.prepare import resolve_lengths
from tests.helpers import script_space


def _space(command: list[str], search: str = "", form: str = "flags") -> Space:
    return script_space(command, search=search, form=form)


def test_the_commands_flags_are_the_values_of_the_knobs_the_space_does_not_list() -> None:
    space = _space(
        ["python", "train.py", "--bf16", "True", "--per_device_train_batch_size=8",
         "--gradient_checkpointing", "--optim", "adamw_torch_fused", "--torch_compile", "True",
         "--dataloader_pin_memory", "false", "--learning_rate", "2e-5"],
        search="  per_device_batch_size: [2, 4]\n",
    )  # fmt: skip
    search = space.search
    assert search.values("per_device_batch_size") == [2, 4]  # listed: searched, not taken
    assert search.values("precision") == ["bf16"]  # not fp8, which writes the same flags
    assert search.values("gradient_checkpointing") == [True]  # a bare bool flag is True
    assert search.values("optim") == ["adamw_torch_fused"]
    assert search.values("compile_mode") == ["default"]  # torch_compile without a mode
    assert search.values("pin_memory") == [False]
    # what the command does not say keeps sweeper's default
    assert search.values("tf32") == [knobs.KNOB["tf32"].default]
    # so the trial's appended flags say what the user's run says
    config = Baseline(
        per_device_batch_size=2, gradient_accumulation_steps=1, num_workers=0, max_seq_length=256
    ).as_config(search)
    flags = knobs.command_flags(config.model_dump(), "flags")
    assert flags[flags.index("--bf16") + 1] == "True"
    assert flags[flags.index("--optim") + 1] == "adamw_torch_fused"


def test_an_accelerate_lines_precision_and_compile_from_its_options_or_config_file(
    tmp_path: Path,
) -> None:
    line = [
        "accelerate", "launch", "--mixed_precision", "bf16", "--dynamo_backend", "inductor",
        "--dynamo_mode", "max-autotune", "train.py", "--per_device_train_batch_size", "4",
    ]  # fmt: skip
    search = _space(line).search
    assert search.values("precision") == ["bf16"]
    assert search.values("compile_mode") == ["max-autotune"]
    assert search.values("per_device_batch_size") == [4]  # the program's flags, after the line
    config = tmp_path / "accelerate.yaml"
    config.write_text("mixed_precision: fp16\ndynamo_config: {dynamo_backend: 'NO'}\n")
    from_file = _space(["accelerate", "launch", "--config_file", str(config), "train.py"])
    assert from_file.search.values("precision") == ["fp16"]
    assert from_file.search.values("compile_mode") == ["none"]
    # the line's own option wins over its file, as accelerate reads them
    both = ["accelerate", "launch", f"--config_file={config}", "--mixed_precision=no", "t.py"]
    assert _space(both).search.values("precision") == ["fp32"]
    # the data-parallel strategy: FSDP2 from the line or its file; FSDP1 is no knob value
    fsdp = ["accelerate", "launch", "--use_fsdp", "--fsdp_version", "2", "t.py"]
    assert _space(fsdp).search.values("data_parallel") == ["fsdp2"]
    config.write_text("distributed_type: FSDP\nfsdp_config: {fsdp_version: 2}\n")
    fsdp_file = _space(["accelerate", "launch", "--config_file", str(config), "t.py"])
    assert fsdp_file.search.values("data_parallel") == ["fsdp2"]
    fsdp1 = ["accelerate", "launch", "--use_fsdp", "t.py"]
    assert _space(fsdp1).search.values("data_parallel") == [knobs.KNOB["data_parallel"].default]
    # a file that is not there is the trial's to report (accelerate's own parser says it)
    missing = ["accelerate", "launch", "--config_file", str(tmp_path / "no.yaml"), "t.py"]
    assert _space(missing).search.values("precision") == [knobs.KNOB["precision"].default]


@pytest.mark.parametrize(
    ("words", "why"),
    [
        (["--per_device_train_batch_size", "eight"], "not an int"),
        (["--per_device_train_batch_size", "0"], "outside the knob's type"),
        (["--bf16", "True", "--fp16", "True"], "contradicts every precision"),
        (["--optim", "sgd"], "not a value the knob has"),
        (["--per_device_batch_size", "8"], "not the TrainingArguments name"),
    ],
)
def test_words_that_say_no_value_of_a_knob_are_left_to_its_default(
    words: list[str], why: str
) -> None:
    given = script_defaults.said(["python", "train.py", *words], "flags")
    assert set(given) & {"per_device_batch_size", "precision", "optim"} == set(), why
    _space(["python", "train.py", *words])  # still a valid space


def test_the_sweep_says_which_knobs_run_at_the_commands_values() -> None:
    notes: list[str] = []

    class Notes(SweepObserver):
        def note(self, message: str) -> None:
            notes.append(message)

    space = _space(["python", "train.py", "--bf16", "--per_device_train_batch_size", "8"])
    resolve_lengths(space, None, Notes())
    said = [n for n in notes if n.startswith("from your command")]
    assert len(said) == 1, notes
    assert "precision bf16 (--bf16 true)" in said[0]
    assert "per_device_batch_size 8 (--per_device_train_batch_size 8)" in said[0]


def test_the_sweep_says_when_the_command_trains_another_run_than_the_space_prices() -> None:
    """The space prices workload.epochs (1 here) of workload.samples; a command that says
    --num_train_epochs 3 or --max_steps trains another run, and the sweep says so with the
    fix. A command silent on both, or agreeing, is not told anything (its program's own
    default is not in the words)."""
    notes: list[str] = []

    class Notes(SweepObserver):
        def note(self, message: str) -> None:
            notes.append(message)

    for words in (
        ["--num_train_epochs", "3"],
        ["--max_steps=200"],
        [],
        ["--num_train_epochs", "1"],
    ):
        resolve_lengths(_space(["python", "train.py", *words]), None, Notes())
    said = [n for n in notes if n.startswith("your command trains")]
    assert len(said) == 2, notes
    assert "3 epochs" in said[0] and "set workload.epochs: 3 if your run trains 3" in said[0]
    assert "--max_steps 200 optimizer steps" in said[1], said


def test_an_accelerate_line_without_a_config_file_reads_accelerates_default_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `accelerate config` wrote bf16 + FSDP2 to the default file; the user's line names no file.
    # The trial's accelerate reads that file, so the knobs the space leaves out must too: at
    # sweeper's defaults the trial would set --mixed_precision no on the line, over the file.
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    default = script_defaults.default_config_file()
    assert default == tmp_path / "hf" / "accelerate" / "default_config.yaml"
    line = ["accelerate", "launch", "train.py", "--per_device_train_batch_size", "4"]
    assert _space(line).search.values("precision") == [knobs.KNOB["precision"].default]
    default.parent.mkdir(parents=True)
    default.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nmixed_precision: bf16\n"
        "fsdp_config: {fsdp_version: 2}\nnum_processes: 2\n"
    )
    search = _space(line).search
    assert search.values("precision") == ["bf16"]
    assert search.values("data_parallel") == ["fsdp2"]
    given = script_defaults.said(line, "flags")
    assert given["precision"] == (
        "bf16",
        f"mixed_precision bf16 in accelerate's config file {default}",
    )
    assert given["data_parallel"][1].startswith("distributed_type FSDP, fsdp_version 2 in ")
    # the line's own option still wins over the file
    fp16 = ["accelerate", "launch", "--mixed_precision", "fp16", "train.py"]
    assert script_defaults.said(fp16, "flags")["precision"] == (
        "fp16",
        "accelerate --mixed_precision fp16",
    )
    # --cpu: accelerate does not read the default file, nor does sweeper
    cpu = ["accelerate", "launch", "--cpu", "train.py"]
    assert _space(cpu).search.values("precision") == [knobs.KNOB["precision"].default]
    # a line naming its own file reads that one, not the default
    own = tmp_path / "own.yaml"
    own.write_text("mixed_precision: 'no'\n")
    named = ["accelerate", "launch", "--config_file", str(own), "train.py"]
    assert _space(named).search.values("precision") == ["fp32"]
    # without HF_HOME: $XDG_CACHE_HOME/huggingface, as accelerate has it
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert script_defaults.default_config_file() == (
        tmp_path / "xdg" / "huggingface" / "accelerate" / "default_config.yaml"
    )


@pytest.mark.torch
@pytest.mark.parametrize("env", [{"HF_HOME": "/data/hf"}, {"XDG_CACHE_HOME": "/data/xdg"}, {}])
def test_the_default_file_is_the_one_accelerate_itself_reads(env: dict[str, str]) -> None:
    # accelerate computes its path at import: ask a fresh interpreter with the environment
    base = {k: v for k, v in os.environ.items() if k not in ("HF_HOME", "XDG_CACHE_HOME")}
    code = "from accelerate.commands.config.config_args import default_config_file as f; print(f)"
    theirs = subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    assert str(script_defaults.default_config_file({**base, **env})) == theirs


def test_an_sftconfig_script_runs_sftconfigs_own_defaults_where_its_command_is_silent(
    tmp_path: Path,
) -> None:
    # TRL's SFTConfig defaults gradient_checkpointing=True and bf16=not fp16, and
    # TrainingArguments lets a True bf16/fp16 beat the launcher's ACCELERATE_MIXED_PRECISION
    config = tmp_path / "accelerate.yaml"
    config.write_text("mixed_precision: 'no'\n")
    line = ["accelerate", "launch", "--config_file", str(config), "train.py"]
    search = _space(line, form="sft_flags").search
    assert search.values("precision") == ["bf16"]
    assert search.values("gradient_checkpointing") == [True]
    given = script_defaults.said(line, "sft_flags")
    assert given["precision"][1] == (
        f"SFTConfig's default bf16=True, over mixed_precision no in accelerate's config file "
        f"{config}"
    )
    # what the command says still wins; --fp16 True makes SFTConfig's bf16 False
    said = _space([*line, "--gradient_checkpointing", "False", "--fp16", "True"], form="sft_flags")
    assert said.search.values("gradient_checkpointing") == [False]
    assert said.search.values("precision") == ["fp16"]
    # --bf16 False: the launcher's mixed precision decides, as TrainingArguments reads it
    assert _space([*line, "--bf16", "False"], form="sft_flags").search.values("precision") == [
        "fp32"
    ]
    # TrainingArguments' own defaults (knobs: flags) are sweeper's: nothing taken from TRL
    plain = _space(["python", "train.py"]).search
    assert plain.values("gradient_checkpointing") == [knobs.KNOB["gradient_checkpointing"].default]
    assert plain.values("precision") == [knobs.KNOB["precision"].default]
    # a listed knob is searched, whatever the defaults
    listed = _space(line, "  precision: [fp32, bf16]\n", form="sft_flags").search
    assert listed.values("precision") == ["fp32", "bf16"]


def test_a_true_bf16_flag_runs_over_the_launchers_mixed_precision() -> None:
    line = ["accelerate", "launch", "--mixed_precision", "no", "train.py", "--bf16", "True"]
    assert _space(line).search.values("precision") == ["bf16"]
    assert script_defaults.said(line, "flags")["precision"] == ("bf16", "--bf16 True")


def test_a_command_whose_own_run_is_shorter_than_a_trial_is_said_before_it_runs() -> None:
    """A walk's script trained 13 steps (one epoch of 200 samples at 16 rows a step), fewer
    than burn-in and the window may take: its trial ended unmeasured. The sweep (and doctor)
    say so beforehand, from the words and the space's largest step; a run that every trial
    must outlast is a preflight problem."""
    from sweeper.preflight import short_run_of

    notes: list[str] = []

    class Notes(SweepObserver):
        def note(self, message: str) -> None:
            notes.append(message)

    one_epoch = script_space(
        ["python", "train.py", "--num_train_epochs", "1"],
        search="  per_device_batch_size: [8, 64]\n",
    )
    resolve_lengths(one_epoch, None, Notes())
    (said,) = [n for n in notes if n.startswith("your command's own run")]
    assert "trains 16 optimizer steps (1 epoch of 1000 samples at 64 rows a step)" in said
    assert "a trial needs 10 to 200" in said and "--num_train_epochs, --max_steps" in said
    assert short_run_of(one_epoch) == (said, False)
    five = script_space(["python", "train.py", "--max_steps", "5"])
    said, certain = short_run_of(five) or ("", False)
    assert certain and "your run trains 5 optimizer steps (--max_steps 5)" in said
    long_run = script_space(["python", "train.py", "--num_train_epochs", "10"])
    assert short_run_of(long_run) is None  # 630 steps: burn-in and window fit at their longest
    # doctor shows the "may end" note as a warning, not a tick; its other notes stay ok
    from sweeper.doctor import space_findings

    (said,) = [n for n in notes if n.startswith("your command's own run")]
    other = "the run's learning rate comes from --learning_rate 2e-05"
    levels = {f.text: f.level for f in space_findings(one_epoch, [*notes, other])}
    assert levels[said] == "warning" and levels[other] == "ok"


def test_a_scripts_own_parser_is_not_given_trainingarguments_3_epochs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk's loop parsed its own --epochs (default 1) and doctor said its run "trains 57
    optimizer steps (3 epochs ...)": TrainingArguments' default where the program has none.
    A command silent on its length is said only for a program that reads TrainingArguments."""
    from sweeper.preflight import short_run_of

    monkeypatch.chdir(tmp_path)
    search = "  per_device_batch_size: [8, 64]\n"
    (tmp_path / "train.py").write_text("import argparse\nparser = argparse.ArgumentParser()\n")
    assert short_run_of(script_space(["python", "train.py"], search=search)) is None
    (tmp_path / "train.py").write_text("from transformers import HfArgumentParser\n")
    said, _ = short_run_of(script_space(["python", "train.py"], search=search)) or ("", False)
    assert "(3 epochs of 1000 samples at 64 rows a step)" in said, said
    # the command's own length flag is TrainingArguments' whatever the program
    (tmp_path / "train.py").write_text("import argparse\n")
    one = script_space(["python", "train.py", "--num_train_epochs", "1"], search=search)
    assert short_run_of(one) is not None


def test_a_command_that_saves_otherwise_than_the_space_prices_is_said() -> None:
    """A walk's script said --save_strategy no while $/run counted a checkpoint every 500
    steps: the sweep (and doctor, from the same notes) says so, and how to price what runs."""
    notes: list[str] = []

    class Notes(SweepObserver):
        def note(self, message: str) -> None:
            notes.append(message)

    never = script_space(["python", "train.py", "--save_strategy", "no"])
    assert never.workload.checkpoint.save_steps is not None  # the space prices saves
    resolve_lengths(never, None, Notes())
    (said,) = [n for n in notes if "checkpoint" in n]
    assert "--save_strategy no" in said and "save_steps: null" in said
    notes.clear()
    resolve_lengths(script_space(["python", "train.py", "--save_steps", "50"]), None, Notes())
    assert any("set workload.checkpoint.save_steps: 50" in n for n in notes), notes


def test_the_launchers_process_count_is_the_devices_the_space_does_not_list(
    tmp_path: Path,
) -> None:
    """A walk's `torchrun --nproc_per_node 2 train_lslora.py` with no search.devices ran, and
    was priced, as one process, unsaid: its run is two. The launcher's count is the devices
    knob's value where the space lists none; a listed one is searched as listed."""
    two = _space(["torchrun", "--nproc_per_node", "2", "train.py", "--batch_size", "2"])
    assert two.search.values("devices") == [2]
    said = script_defaults.describe(
        ["torchrun", "--nproc_per_node", "2", "train.py"], "flags", two.search
    )
    assert said is not None and "torchrun --nproc_per_node 2" in said, said
    four = _space(["torchrun", "--standalone", "--nproc-per-node=4", "-m", "pkg.train"])
    assert four.search.values("devices") == [4]
    listed = _space(["torchrun", "--nproc-per-node", "2", "train.py"], search="  devices: [1, 2]\n")
    assert listed.search.values("devices") == [1, 2]
    line = _space(["accelerate", "launch", "--num_processes", "2", "train.py"])
    assert line.search.values("devices") == [2]
    config = tmp_path / "accelerate.yaml"
    config.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    from_file = _space(["accelerate", "launch", "--config_file", str(config), "train.py"])
    assert from_file.search.values("devices") == [2]
    assert _space(["torchrun", "--nproc-per-node", "auto", "train.py"]).search.values(
        "devices"
    ) == [1]
    assert _space(["python", "train.py"]).search.values("devices") == [1]
