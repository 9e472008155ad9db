"""Measured = recorded: every knob's value is read back from what each engine really ran.

Each engine trains the tiny model in a real child with a few configs that between them set
every knob the CPU can run to a value other than its default (and the CUDA-only knobs to the
value the CPU runs); the trial records each knob's effective value, and a test per knob ×
engine pair checks it is the value the config asked for. A config whose value does not reach
what runs fails the trial as a ``mismatch`` naming the knob."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import pytest

from sweeper import knobs
from sweeper.space import Space
from sweeper.trial.engines.readback import READERS, has_generation_markers
from sweeper.trial.protocol import PreparedData
from tests.helpers import SessionForkServer, tiny_config, trial_request

ENGINES = ("loop", "trainer", "sft")

# Configs per engine, each knob set away from its default in one of them where the CPU can
# run another value; several knobs share a trial to keep the test short, and a mismatch names
# its knob, so a failure stays attributable.
WORKERS_AND_LOOP = {
    "per_device_batch_size": 3,
    "gradient_accumulation_steps": 3,
    "num_workers": 1,
    "prefetch_factor": 3,
    "persistent_workers": True,
    "max_seq_length": 48,
    "optim": "adafactor",
    "gradient_checkpointing": True,
    "attn_implementation": "eager",
    # samples end to end in a row, kept apart by the eager attention's packed-sequence mask
    "padding_free": True,
    # CUDA-only values are out of reach here: the CPU's value is asked and read back
    "pin_memory": False,
    "tf32": False,
    "quantization": "none",
}
PACKED_COMPILED = {
    "per_device_batch_size": 2,
    "gradient_accumulation_steps": 1,
    "packing": True,
    "precision": "bf16",
    "compile_mode": "default",
    "max_seq_length": 64,
    "gradient_checkpointing": False,  # SFTConfig's default is True: said explicitly
}
CONFIGS: dict[str, list[dict[str, Any]]] = {
    # the Trainer engines start workers the default way (TrainingArguments has no
    # multiprocessing_context); the plain loop takes spawn
    "loop": [WORKERS_AND_LOOP | {"multiprocessing_context": "spawn"}, PACKED_COMPILED],
    "trainer": [WORKERS_AND_LOOP | {"multiprocessing_context": "fork"}, PACKED_COMPILED],
    # TRL's own packing strategy (bfd: best-fit decreasing), which sweeper's engines do not have
    "sft": [
        WORKERS_AND_LOOP | {"multiprocessing_context": "fork"},
        PACKED_COMPILED | {"packing_strategy": "bfd"},
    ],
}


def test_every_knob_has_a_read_back_in_every_engine() -> None:
    for engine in (*ENGINES, "script"):  # a user's script: tests/trial/test_script.py
        assert set(READERS[engine]) == set(knobs.NAMES), engine


# several devices: tests/trial/test_multi_device.py reads both back from two gloo ranks of
# the plain loop (the Trainer engines train on one device so far; here devices reads back 1)
MULTI_DEVICE = ("devices", "data_parallel")


def test_the_configs_cover_every_knob_away_from_its_default_where_the_cpu_can() -> None:
    for engine, configs in CONFIGS.items():
        for knob in knobs.KNOBS:
            if knob.name in MULTI_DEVICE:
                continue
            values = {tiny_config(**c).model_dump()[knob.name] for c in configs}
            choices = knob.choices()
            # values other than the default that run without CUDA (None: an open type)
            elsewhere = None if choices is None else set(choices) - {knob.default, *knob.needs}
            if knob.name == "multiprocessing_context" and engine != "loop":
                elsewhere = set()  # the Trainer engines start workers the default way only
            if knob.name == "packing_strategy" and engine != "sft":
                elsewhere = set()  # bfd and bfd_split are TRL's packings (engine: sft)
            if elsewhere is None or elsewhere:
                assert values - {knob.default, None}, f"{engine}: {knob.name} is only default"


_RUNS: dict[tuple[str, int], dict[str, Any]] = {}


@pytest.fixture(scope="session")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the runs are kept for every test process of this session: each (engine, config)
    trains once, not once per pytest-xdist worker (the engines' runs are this file's cost)."""
    base = tmp_path_factory.getbasetemp()
    # under xdist each worker's base is <session>/popen-gwN: their parent is the session's
    where = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "readback-runs"
    where.mkdir(exist_ok=True)
    return where


def _run(
    run_forked: SessionForkServer,
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    shared: Path,
    engine: str,
    index: int,
) -> Any:
    key = (engine, index)
    if key in _RUNS:
        return _RUNS[key]
    saved = shared / f"{engine}-{index}.json"
    with open(shared / f"{engine}-{index}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker training this one: wait, then read
        if not saved.exists():
            engine_space = space.model_copy(
                update={"workload": space.workload.model_copy(update={"engine": engine})}
            )
            config = tiny_config(**CONFIGS[engine][index])
            run = run_forked(
                trial_request(
                    engine_space,
                    prepared,
                    cache_dir,
                    config,
                    warmup={"min_steps": 1, "max_steps": 1},
                    measure={"min_steps": 2, "max_steps": 2},
                ),
                timeout_s=420,
            )
            assert run.result.status == "ok", (run.result.failure_message, run.log_tail[-2000:])
            record = {"config": config.model_dump(), "measurement": run.result.payload}
            partial = saved.with_suffix(".part")
            partial.write_text(json.dumps(record))
            partial.replace(saved)  # whole or absent: a worker that fails writes nothing
        _RUNS[key] = json.loads(saved.read_text())
    return _RUNS[key]


def _pairs() -> list[Any]:
    return [
        pytest.param(engine, knob.name, id=f"{engine}-{knob.name}")
        for engine in ENGINES
        for knob in knobs.KNOBS
        if knob.name != "data_parallel"  # it applies on several devices only (MULTI_DEVICE)
    ]


@pytest.mark.torch
@pytest.mark.parametrize(("engine", "knob"), _pairs())
def test_the_recorded_value_is_what_ran(
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    shared_runs: Path,
    engine: str,
    knob: str,
) -> None:
    checked = 0
    for index in range(len(CONFIGS[engine])):
        run = _run(run_forked, tiny_space, tiny_prepared, cache_dir, shared_runs, engine, index)
        asked = run["config"][knob]
        effective = run["measurement"]["effective"]
        assert knob in effective, f"{engine} recorded no effective {knob}"
        if asked is None:  # the knob does not apply to this config (prefetch without workers)
            continue
        assert effective[knob] == asked, (engine, knob, asked, effective[knob])
        checked += 1
    assert checked, f"no config of {engine} makes {knob} apply"


@pytest.mark.torch
def test_a_value_that_does_not_reach_what_runs_fails_the_trial_naming_it() -> None:
    """Real objects that differ from the config (a DataLoader of 2 rows for a config of 4, an
    eager model for sdpa): the check names each knob, the value asked and the value that ran,
    as a ``mismatch`` failure, and leaves the matching knobs out."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from sweeper.errors import TrialError
    from sweeper.trial.engines.readback import Running, check, read

    model = LlamaForCausalLM._from_config(
        LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2,
        ),
        attn_implementation="eager",
    )  # fmt: skip
    config = tiny_config(per_device_batch_size=4, gradient_accumulation_steps=2).model_dump()
    running = Running(
        device=torch.device("cpu"),
        model=model,
        runnables=[model],
        optimizer=torch.optim.AdamW(model.parameters()),
        loader=torch.utils.data.DataLoader(list(range(8)), batch_size=2),
        micro_batches=2,
        widest_row=40,
        compute_dtype=torch.float32,
    )
    assert read("loop", running, config).effective["per_device_batch_size"] == 2
    with pytest.raises(TrialError) as failure:
        check("loop", running, config)
    assert failure.value.kind == "mismatch"
    message = failure.value.message
    assert "per_device_batch_size: asked 4, ran 2" in message
    assert "attn_implementation: asked 'sdpa', ran 'eager'" in message
    assert "gradient_accumulation_steps" not in message and "optim" not in message


def test_generation_markers_are_recognised() -> None:
    assert has_generation_markers("{% generation %}{{ m }}{% endgeneration %}")
    assert has_generation_markers("{%- generation -%}x{%- endgeneration -%}")
    assert not has_generation_markers("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    assert not has_generation_markers(None)


@pytest.mark.torch
def test_a_gpt2_models_compute_dtype_is_read_from_its_conv1d_layers() -> None:
    """GPT-2's projections are transformers' Conv1D and its only torch Linear is the LM head,
    which the read-back skips: it found no layer, read precision 'not observed', and failed
    every trial of a GPT-2 model (arch: gpt2, or a GPT-2 checkpoint) as a mismatch."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from sweeper.trial.engines.readback import ComputeDtype

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64))
    ids = torch.tensor([[1, 2, 3, 4]])
    plain = ComputeDtype(model)
    model(input_ids=ids, labels=ids).loss.backward()
    assert plain.dtype == torch.float32
    plain.remove()
    autocast = ComputeDtype(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=ids, labels=ids)
    assert autocast.dtype == torch.bfloat16


# torch's TF32 settings are process-wide: each form is set in a fresh interpreter. The forms a
# program sets TF32 by: the legacy flags, set_float32_matmul_precision, and torch 2.9's
# fp32_precision (global, as transformers' TrainingArguments(tf32=...) does, or per backend).
_TF32_FORMS = {
    "untouched": ("", False),
    "legacy on": ("torch.backends.cuda.matmul.allow_tf32 = True", True),
    "legacy off": ("torch.backends.cuda.matmul.allow_tf32 = False", False),
    "matmul precision high": ("torch.set_float32_matmul_precision('high')", True),
    "new API, global on": ("torch.backends.fp32_precision = 'tf32'", True),
    "new API, global off": ("torch.backends.fp32_precision = 'ieee'", False),
    "new API, matmul on": ("torch.backends.cuda.matmul.fp32_precision = 'tf32'", True),
    "legacy on, then the new API off globally": (
        "torch.backends.cuda.matmul.allow_tf32 = True; torch.backends.fp32_precision = 'ieee'",
        True,  # the matmul's own setting (tf32, from the legacy flag) wins over the global
    ),
}


@pytest.mark.parametrize("form", list(_TF32_FORMS))
def test_tf32_is_read_whichever_api_set_it(form: str) -> None:
    """On an H200 a user's Trainer script run as a trial failed: TrainingArguments(tf32=True)
    sets torch.backends.fp32_precision (torch >= 2.9) and the recorder's read of the legacy
    allow_tf32 raised "mix of the legacy and new APIs". The read must follow every form."""
    import subprocess
    import sys

    setter, expected = _TF32_FORMS[form]
    code = (
        "import torch\n"
        f"{setter}\n"
        "from sweeper.trial.engines.readback import tf32_matmul\n"
        "try:\n"
        "    legacy = repr(torch.backends.cuda.matmul.allow_tf32)\n"
        "except RuntimeError as e:\n"
        "    legacy = 'raises: ' + str(e)[:60]\n"
        "print(tf32_matmul(), '|', legacy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    read, legacy = out.split(" | ")
    assert read == str(expected), (form, out)
    if form == "new API, global on":
        import torch

        if hasattr(torch.backends, "fp32_precision"):
            # the failure the read avoids is real on this torch: the legacy getter raises
            assert legacy.startswith("raises"), legacy


def test_a_model_no_rank_wrapped_is_told_what_wraps_it() -> None:
    """A walk's SFTConfig on a CPU without use_cpu=True trained each rank alone (Trainer joins
    DDP there only with it): the mismatch said to take the DataLoader's values from sweeper,
    which does nothing for it. It now says what wraps the model, for a Trainer and a loop."""
    import dataclasses
    import types

    import torch

    from sweeper.trial.engines.readback import SCRIPT_FIX, Running, _script_fix

    model = torch.nn.Linear(2, 2)
    trainer = Running(
        device=torch.device("cpu"), model=model, runnables=[model], optimizer=None,
        loader=None, args=types.SimpleNamespace(world_size=1),
    )  # fmt: skip
    said = _script_fix(trainer, {}, ["data_parallel: asked 'ddp', ran 'none'"])
    assert "on a CPU only with `use_cpu=True` in its arguments" in said
    assert SCRIPT_FIX not in said
    loop = dataclasses.replace(trainer, args=None)
    said = _script_fix(loop, {}, ["data_parallel: asked 'ddp', ran 'none'", "num_workers: x"])
    assert "torch.nn.parallel.DistributedDataParallel(model)" in said and SCRIPT_FIX in said
