"""``sweeper doctor``: real probes on this machine, verdicts that name their fix, exit 1 when the
space asks for what the machine cannot do. The rules are also checked on measured facts with
one fact changed at a time (a GPU without bf16, a full disk) that this machine cannot show."""

from __future__ import annotations

import copy
import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.doctor import DoctorReport, diagnose, findings
from sweeper.preflight import ProbeOutcome
from sweeper.space import Space, parse_space
from tests.helpers import TINY_SPACE, run_sweeper

pytestmark = pytest.mark.torch


def _doctor(*args: str, cache_dir: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_sweeper("doctor", *args, cache_dir=cache_dir, timeout=timeout)


@pytest.fixture(scope="module")
def measured(cache_dir: Path) -> DoctorReport:
    """doctor's real report for the tiny space on this machine."""
    return diagnose(parse_space(TINY_SPACE.read_text()), cache_dir, write_mb=8)


def _findings(space: Space, report: DoctorReport, **facts: Any) -> list:
    changed = copy.deepcopy(report.facts)
    for key, value in facts.items():
        changed[key] = value
    return findings(space, changed, report.preflight, report.disk)


def _with(text: str) -> Space:
    return parse_space(TINY_SPACE.read_text() + text)


def test_tiny_space_runs_here(cache_dir: Path) -> None:
    result = _doctor("--space", str(TINY_SPACE), "--write-mb", "8", cache_dir=cache_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert f"Python {platform.python_version()}" in out
    assert f"torch {importlib.metadata.version('torch')}" in out
    assert f"transformers {importlib.metadata.version('transformers')}" in out
    for line in ("sdpa: trains", "eager: trains", "usable CPU cores", "MiB/s (fsynced)"):
        assert line in out
    assert "can run here" in out
    # how long: a range from the tiny space's trial settings (a 3-step window, burn-in capped
    # at 600 s, a 120 s timeout), said to be an estimate
    said = " ".join(out.split())
    assert re.search(r"each trial: \d+ s to 2 min \(timed window at least", said), said
    assert "trial.timeout_s 120 s kills a longer one" in said
    assert "The sweep: 3 trials and up to 0 re-measures" in said
    assert "An estimate from the space's trial settings, not a measurement" in said


def test_each_thing_the_machine_cannot_do_is_a_problem_with_its_fix(
    tmp_path: Path, cache_dir: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    space = tmp_path / "space.yaml"
    space.write_text(
        TINY_SPACE.read_text()
        .replace("[sdpa, eager]", "[sdpa, eager, flash_attention_2]")
        .replace("  attn_implementation: eager", "  attn_implementation: flash_attention_2")
        .replace("  epochs: 1\n", f"  epochs: 1\n  checkpoint:\n    dir: {blocker}/checkpoints\n")
    )
    result = _doctor("--space", str(space), "--write-mb", "8", cache_dir=cache_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    out = " ".join(result.stdout.split())  # rich wraps long lines
    # a value the sweep skips while sdpa and eager train is a warning; the baseline's is not
    assert "flash_attention_2: cannot train here" in out
    assert "fix: remove flash_attention_2 from search.attn_implementation" in out
    assert "baseline cannot run here" in out
    assert "cannot write where checkpoints go" in out and "fix: set workload.checkpoint.dir" in out
    assert "2 problem(s)" in out and "Traceback" not in result.stderr


def test_a_cuda_space_on_a_machine_without_cuda(tmp_path: Path, cache_dir: Path) -> None:
    if Path("/proc/driver/nvidia/version").exists():
        pytest.skip("this machine has an NVIDIA driver")
    space = tmp_path / "space.yaml"
    space.write_text(TINY_SPACE.read_text().replace("device: cpu", "device: cuda"))
    result = _doctor("--space", str(space), "--json", "--write-mb", "8", cache_dir=cache_dir)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    (problem,) = [f for f in report["findings"] if f["level"] == "problem"]
    assert problem["topic"] == "device" and "hardware.device: cpu" in problem["fix"]
    assert report["preflight"]["probes"] == []  # every probe would fail alike: none ran


def test_an_invalid_space_exits_2(tmp_path: Path, cache_dir: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("study: x\nhardware: 3\n")
    result = _doctor("--space", str(space), cache_dir=cache_dir)
    assert result.returncode == 2
    assert "invalid space file" in result.stderr and "Traceback" not in result.stderr


def test_the_machine_alone(cache_dir: Path) -> None:
    """Without a space: every attention implementation and the default compile mode are
    probed; what cannot run is a warning, not a failure."""
    result = _doctor("--json", "--write-mb", "8", cache_dir=cache_dir, timeout=900)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    facts = report["facts"]
    assert facts["torch"] == importlib.metadata.version("torch")
    assert facts["python"] == platform.python_version()
    assert 1 <= facts["cpu"]["usable_cores"] <= (os.cpu_count() or 1)
    probed = {(p["knob"], p["value"]): p["ok"] for p in report["preflight"]["probes"]}
    assert probed[("attn_implementation", "sdpa")] and probed[("attn_implementation", "eager")]
    assert ("attn_implementation", "flash_attention_2") in probed
    assert ("attn_implementation", "flex_attention") in probed
    assert ("compile_mode", "default") in probed
    assert report["disk"]["write_mb_per_s"] > 0
    assert not [f for f in report["findings"] if f["level"] == "problem"]
    if not facts["cuda_available"]:
        assert not probed[("attn_implementation", "flash_attention_2")]


def test_rules_on_measured_facts(measured: DoctorReport) -> None:
    space = parse_space(TINY_SPACE.read_text())
    assert not [f for f in measured.findings if f.level == "problem"], measured.findings

    bf16_space = parse_space(
        TINY_SPACE.read_text().replace("  epochs: 1\n", "  epochs: 1\n  precision: bf16\n")
    )
    no_bf16 = copy.deepcopy(measured.facts["precisions"])
    no_bf16["bf16"] = {"runs": False, "error": "torch.cuda.is_bf16_supported() is False"}
    (problem,) = [
        f for f in _findings(bf16_space, measured, precisions=no_bf16) if f.level == "problem"
    ]
    assert problem.topic == "precision" and problem.fix == "set workload.precision: fp16"

    # an attention implementation that cannot train: a warning while another listed one trains
    # (the sweep skips it at no cost, as the demo space's flex_attention), a problem when none does
    cannot = ProbeOutcome(knob="attn_implementation", value="flash_attention_2", ok=False,
                          reason="unsupported: flash-attn is not installed")  # fmt: skip
    report = dataclasses.replace(
        measured,
        preflight=dataclasses.replace(
            measured.preflight, outcomes=(*measured.preflight.outcomes, cannot)
        ),
    )
    text = yaml.safe_load(TINY_SPACE.read_text())
    text["search"]["attn_implementation"] = ["eager", "flash_attention_2"]
    (skipped,) = [f for f in _findings(parse_space(yaml.safe_dump(text)), report) if f.topic ==
                  "attention" and "cannot train" in f.text]  # fmt: skip
    assert skipped.level == "warning" and "the sweep skips it" in (skipped.fix or "")
    text["search"]["attn_implementation"] = ["flash_attention_2"]
    del text["baseline"]
    (alone,) = [f for f in _findings(parse_space(yaml.safe_dump(text)), report) if f.topic ==
                "attention" and "cannot train" in f.text]  # fmt: skip
    assert alone.level == "problem" and "add a value" in (alone.fix or "")

    huge = copy.deepcopy(measured.facts["model"]) | {"params": 10**12}
    problems = [f for f in _findings(space, measured, model=huge) if f.level == "problem"]
    assert {f.topic for f in problems} == {"memory", "checkpoint"}  # 16 TB of state, 4 TB saves

    gpu_priced = parse_space(TINY_SPACE.read_text().replace("name: CPU", "name: H100 SXM 80GB"))
    warnings = [f for f in _findings(gpu_priced, measured) if f.level == "warning"]
    if not measured.facts["devices"]:
        assert any("priced as the GPU" in f.text for f in warnings)

    many_workers = parse_space(
        TINY_SPACE.read_text().replace("num_workers: [0]", "num_workers: [0, 64]")
    )
    warnings = [f for f in _findings(many_workers, measured) if f.level == "warning"]
    assert any(f.topic == "cpu" and "num_workers" in (f.fix or "") for f in warnings)


# peft (0.17/0.18) asks transformers 5 for a deprecated property: theirs to change
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_a_lora_space_counts_what_trains(cache_dir: Path) -> None:
    """Seen on seed 003: doctor priced a LoRA run of 3.8B parameters as full training (57 GiB at
    16 bytes per parameter) where the H100 measured 9-16 GiB in all. The adapter is counted as
    peft builds it; the frozen base takes its loaded width, 4-bit on CUDA only."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from sweeper.sweep.prepare import prepare_workload
    from sweeper.trial.workload import load_tokenizer, model_config

    text = yaml.safe_load(TINY_SPACE.read_text())
    text["workload"]["adapter"] = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    text["workload"]["checkpoint"] = {"save_steps": 100}
    text["search"]["quantization"] = ["none", "4bit"]
    space = parse_space(yaml.safe_dump(text))
    report = diagnose(space, cache_dir, write_mb=8)
    model = report.facts["model"]

    # the same count, on a real model built the way trials build it
    data = prepare_workload(space, cache_dir)
    built = AutoModelForCausalLM.from_config(model_config(space.workload, load_tokenizer(data), 64))
    base = sum(p.numel() for p in built.parameters())
    lora = get_peft_model(built, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trains = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    assert (model["params"], model["trainable"]) == (base, trains) and 0 < trains < base / 10

    (memory,) = [f for f in report.findings if "with LoRA it trains" in f.text]
    # counted as the sweep's answer counts them: the adapter among the adapted model's
    from sweeper.recommendation import param_count

    said = f"trains {param_count(trains)} of {param_count(base + trains)} "
    assert said + f"({trains / (base + trains):.2%})" in memory.text and memory.level == "ok"
    if not report.facts["devices"]:  # no CUDA: trials load the base unquantized
        assert "4-bit" not in memory.text and "fp32, 4 bytes" in memory.text
    (saves,) = [f for f in report.findings if "one checkpoint of this" in f.text]
    assert "of this adapter" in saves.text

    # on a GPU whose free memory holds the 4-bit base but not the fp32 one
    full_fp32 = base * 4 + trains * 16
    device = {"name": "GPU", "memory_free_bytes": full_fp32 - 1, "memory_bytes": 2 * full_fp32}
    found = _findings(space, report, devices=[device])
    (memory,) = [f for f in found if "with LoRA it trains" in f.text]
    assert memory.level == "ok" and "4-bit NF4" in memory.text
    (heavy,) = [f for f in found if f.topic == "memory" and f.level == "warning"]
    assert "quantization none" in heavy.text and heavy.fix == "remove none from search.quantization"


def test_report_json_round_trips(measured: DoctorReport) -> None:
    text = json.dumps(measured.to_json(), default=str)
    again = json.loads(text)
    assert again["exit_code"] == 0
    assert [f["text"] for f in again["findings"]] == [f.text for f in measured.findings]


@pytest.mark.gpu
def test_doctor_on_a_gpu(cache_dir: Path) -> None:
    if not Path("/proc/driver/nvidia/version").exists():
        pytest.skip("no NVIDIA GPU on this machine")
    result = _doctor("--json", "--write-mb", "64", cache_dir=cache_dir, timeout=900)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    facts = report["facts"]
    assert facts["cuda_available"] and facts["devices"] and facts["driver"]
    device = facts["devices"][0]
    assert 0 < device["memory_free_bytes"] <= device["memory_bytes"]
    if float(device["capability"]) >= 8.0:
        assert facts["precisions"]["bf16"]["runs"] and facts["precisions"]["tf32"]["runs"]
    probed = {(p["knob"], p["value"]): p for p in report["preflight"]["probes"]}
    assert probed[("attn_implementation", "sdpa")]["ok"]
    assert report["preflight"]["precision_factor"] is not None  # bf16 timed against fp32


def test_a_script_whose_python_cannot_run_it_is_said_before_any_probe(
    tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script's python has no sweeper (and no torch): the system's, say, when the venv
    is not active. Every attention probe ran in it and failed "No module named 'torch'",
    then doctor said no attention implementation can train here; now the python is named
    first, with the fix, and nothing is probed in it."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    bare = tmp_path / "bare"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120
    )
    (tmp_path / "train.py").write_text("import sweeper\n\nsweeper.callback()\n")
    space = yaml.safe_load(TINY_SPACE.read_text())
    space["workload"]["engine"] = "script"
    space["workload"]["script"] = {
        "command": [str(bare / "bin" / "python"), "train.py"],
        "cwd": str(tmp_path),
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    result = _doctor("--space", str(path), "--json", "--write-mb", "8", cache_dir=cache_dir)
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    problems = [f["text"] for f in report["findings"] if f["level"] == "problem"]
    # sweeper itself where the python finds none; here (run_sweeper puts the repository on
    # PYTHONPATH, which the script inherits) the first of its own imports that it lacks
    assert any(
        re.search(r"bare/bin/python cannot import \w+ \(ModuleNotFoundError", p)
        and sys.executable in p
        for p in problems
    ), problems
    assert not any("attention implementation" in p for p in problems), problems
    assert report["preflight"]["probes"] == []


def test_a_script_space_says_which_knobs_run_at_the_commands_values(
    tmp_path: Path, cache_dir: Path
) -> None:
    """A knob the space does not list runs at the value the script's command gives it: launch
    says so before its trials, and doctor, reading the same space, says it too. The script's
    parser needs an argument the command does not give: doctor runs it as far as its parse
    and says so (it said "can run here", and every trial then exited 2)."""
    (tmp_path / "train.py").write_text(
        "import argparse\n\nimport sweeper\n\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--data_file', required=True)\n"
        "parser.parse_known_args()\nsweeper.callback()\n"
    )
    space = yaml.safe_load(TINY_SPACE.read_text())
    space["workload"]["engine"] = "script"
    space["workload"]["script"] = {
        "command": [sys.executable, "train.py", "--gradient_checkpointing", "True"],
        "cwd": str(tmp_path),
    }
    space["search"]["attn_implementation"] = ["sdpa"]  # one probe: the note is the point
    del space["baseline"]
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    result = _doctor("--space", str(path), "--json", "--write-mb", "8", cache_dir=cache_dir)
    assert result.returncode == 1, result.stderr
    findings = json.loads(result.stdout)["findings"]
    assert any(
        f["level"] == "problem"
        and "train.py: error: the following arguments are required: --data_file" in f["text"]
        for f in findings
    ), findings
    said = [f["text"] for f in findings if f["topic"] == "space"]
    assert any(
        text.startswith("from your command: ")
        and "gradient_checkpointing True (--gradient_checkpointing True)" in text
        for text in said
    ), said


def test_a_data_file_the_command_names_and_is_not_there_is_a_problem(
    tmp_path: Path, cache_dir: Path
) -> None:
    """A walk's `--dataset_path data/chats_v2.jsonl` (no such file): doctor said "can run
    here" with exit 0, the note reaching only its progress line, and every trial of the sweep
    then failed at the program's load. Doctor says the space cannot run as written; a file the
    program writes (`--output_file`) is not one it needs."""
    (tmp_path / "train.py").write_text("import sweeper\n\nsweeper.callback()\n")
    space = yaml.safe_load(TINY_SPACE.read_text())
    space["workload"]["engine"] = "script"
    space["workload"]["script"] = {
        "command": [sys.executable, "train.py", "--dataset_path", "data/chats_v2.jsonl",
                    "--output_file", "results.json"],
        "cwd": str(tmp_path),
    }  # fmt: skip
    space["search"]["attn_implementation"] = ["sdpa"]
    del space["baseline"]
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    result = _doctor("--space", str(path), "--json", "--write-mb", "8", cache_dir=cache_dir)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    problems = [f["text"] for f in report["findings"] if f["level"] == "problem"]
    assert any(
        p.startswith(f"workload.script.command: data/chats_v2.jsonl is not a file in {tmp_path}")
        for p in problems
    ), problems
    assert not any("results.json" in f["text"] for f in report["findings"]), report["findings"]
    text = _doctor("--space", str(path), "--write-mb", "8", cache_dir=cache_dir)
    assert text.returncode == 1
    assert "data/chats_v2.jsonl is not a file" in " ".join(text.stdout.split())
    assert "can run here" not in text.stdout


def test_a_script_that_keeps_its_own_length_is_said_by_doctor(
    tmp_path: Path, cache_dir: Path
) -> None:
    """A walk's script had --max_seq_length (default 512), which `knobs: flags` does not
    pass: doctor said "can run here", and every trial failed as a mismatch. Doctor reads the
    length the script's parser gives it and says what the trials will run."""
    (tmp_path / "train.py").write_text(
        "import argparse\n\nimport sweeper\n\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--max_seq_length', type=int, default=512)\n"
        "parser.parse_known_args()\nsweeper.callback()\n"
    )
    space = yaml.safe_load(TINY_SPACE.read_text())  # lists max_seq_length [64]
    space["workload"]["engine"] = "script"
    space["workload"]["script"] = {"command": [sys.executable, "train.py"], "cwd": str(tmp_path)}
    space["search"]["attn_implementation"] = ["sdpa"]
    del space["baseline"]
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    result = _doctor("--space", str(path), "--json", "--write-mb", "8", cache_dir=cache_dir)
    findings = json.loads(result.stdout)["findings"]
    said = [f for f in findings if "your script's parser gives it a sequence length" in f["text"]]
    assert said, findings
    assert said[0]["level"] == "warning"
    assert "a sequence length of 512" in said[0]["text"] and "the space has 64" in said[0]["text"]
    assert "fails as a mismatch" in said[0]["text"] and "--max_seq_length 64" in said[0]["text"]
