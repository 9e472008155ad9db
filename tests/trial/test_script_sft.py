"""``engine: script`` with the third example a user copies: ``examples/sft_lora``, a TRL
``SFTTrainer`` script that trains a peft LoRA adapter, its knobs as SFTConfig flags
(``knobs: sft_flags``: --max_length, --packing) and its attention kernel from
``sweeper.trial_config()``. Swept end to end with ``sweeper launch`` on the tiny stand-in job
(``scripts/tiny_job.py``) on SQLite: each trial's knobs are read back from the script's own
SFTTrainer, and what trains is the adapter alone, counted from the peft-wrapped model.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import yaml

from sweeper.measurement import parse_measurement
from sweeper.store import Store
from tests.helpers import run_sweeper
from tests.trial.test_script import _example_space

pytestmark = pytest.mark.torch


def _lora_counts(model_dir: Path, adapter: dict[str, object]) -> tuple[int, int]:
    """(all parameters, trainable ones) of the job's model under the space's adapter, as
    peft builds it: what the script's SFTTrainer trains, counted here independently."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    with warnings.catch_warnings():  # peft reads transformers' deprecated checkpointing flag
        warnings.simplefilter("ignore", FutureWarning)
        wrapped = get_peft_model(
            model,
            LoraConfig(
                r=adapter["r"],
                lora_alpha=adapter["alpha"],
                lora_dropout=adapter["dropout"],
                target_modules=adapter["target_modules"],
                task_type="CAUSAL_LM",
            ),
        )
    trainable, total = wrapped.get_nb_trainable_parameters()
    return int(total), int(trainable)


def test_the_sft_lora_example_is_swept_end_to_end(
    job: Path, tmp_path: Path, sqlite_url: str, cache_dir: Path
) -> None:
    # two configs, two trials: the sampler never repeats one, so both packing values run
    space = _example_space(
        "sft_lora",
        job,
        tmp_path,
        per_device_batch_size=[2],
        gradient_accumulation_steps=[2],
        max_seq_length=[128],
        packing=[False, True],
        attn_implementation=["sdpa"],
    )
    spec = yaml.safe_load(space.read_text())
    # a short trial on this (often shared) 2-core machine: no re-measures of a contended
    # window, and the fewest steps the recorder takes (the burn-in and the window are tested
    # elsewhere); each trial still pays the script's own start-up (TRL, peft, the data)
    spec["trial"]["warmup"] = {"min_steps": 1, "max_steps": 2, "window": 2}
    spec["trial"]["measure"] = {"min_steps": 3, "max_steps": 3, "min_seconds": 0, "max_seconds": 20}
    spec["budget"]["n_trials"] = 2  # both packing values
    spec["budget"]["remeasure"] = {
        "rounds": 0, "drift_every": None, "contended_reruns": 0, "contended_later": 0
    }  # fmt: skip
    space.write_text(yaml.safe_dump(spec))
    assert spec["workload"]["script"]["knobs"] == "sft_flags"
    adapter = spec["workload"]["adapter"]
    # the space's adapter is what the command gives the script
    command = spec["workload"]["script"]["command"]
    for flag, key in (("--lora_r", "r"), ("--lora_alpha", "alpha"), ("--lora_dropout", "dropout")):
        assert float(command[command.index(flag) + 1]) == adapter[key]
    assert command[command.index("--lora_target_modules") + 1] == adapter["target_modules"]
    n_params, trainable = _lora_counts(job / "model", adapter)
    assert trainable * 3 < n_params  # sanity: LoRA trains a small share

    launch = run_sweeper(
        "launch", "--space", str(space), "--storage", sqlite_url, cache_dir=cache_dir, timeout=900
    )
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    store = Store(sqlite_url)
    try:
        trials = store.list_trials("sft-lora-script", include_measurement=True)
    finally:
        store.dispose()
    done = [t for t in trials if t.state == "complete"]
    assert len(done) == 2, [(t.state, t.failure_message) for t in trials]
    assert {t.config["packing"] for t in done} == {False, True}
    for trial in done:
        assert trial.measurement is not None
        measured = parse_measurement(trial.measurement)
        assert measured.engine == "script"
        # read back from the script's own SFTTrainer (its DataLoader, its SFTConfig, the
        # batches of the first optimizer step), not copied from the config
        effective = measured.effective
        for knob in ("per_device_batch_size", "gradient_accumulation_steps", "max_seq_length"):
            assert effective[knob] == trial.config[knob], (knob, effective, trial.config)
        assert effective["packing"] is trial.config["packing"]
        assert effective["packing_strategy"] == ("wrapped" if trial.config["packing"] else None)
        assert effective["attn_implementation"] == "sdpa"
        assert effective["optim"] == "adamw_torch"
        # the peft-wrapped model: every weight counted, only the adapter's trained
        assert measured.n_params == n_params
        assert measured.trainable_params == trainable
        assert measured.measured_steps >= 3 and measured.tokens_per_s > 0
        assert measured.flops_per_token > 0 and measured.loss_first > 0
        # a step's loss, not one per micro-batch added up: random weights start near ln(vocab)
        vocab = json.loads((job / "model" / "config.json").read_text())["vocab_size"]
        assert measured.loss_first < 1.5 * math.log(vocab), (measured.losses, vocab)
        assert measured.startup_s > 0
        if trial.config["packing"]:
            # wrapped rows are full, but the stream's last one (the Trainer samples rows at
            # random, so it may come up): at most one short row among the window's >= 12
            assert measured.padding_share < 0.1
        else:  # the SFT collator pads each batch to its longest record
            assert 0 < measured.padding_share < 1
    best = run_sweeper(
        "best", "--study", "sft-lora-script", "--storage", sqlite_url, "--json",
        cache_dir=cache_dir,
    )  # fmt: skip
    assert best.returncode == 0, best.stderr
    answer = json.loads(best.stdout)
    assert answer["config"]["max_seq_length"] == 128
    # the export is the user's command with the winner's SFTConfig flags
    export = run_sweeper(
        "export", "--study", "sft-lora-script", "--storage", sqlite_url, "--format", "command",
        cache_dir=cache_dir,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    command_line = export.stdout.strip().splitlines()[-1]
    assert "--max_length 128 " in command_line
    assert f"--packing {answer['config']['packing']}" in command_line
    assert "--lora_r 16 " in command_line
    assert "#   attn_implementation: sdpa" in export.stdout  # read via trial_config()
