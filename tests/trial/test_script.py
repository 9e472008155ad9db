"""``engine: script``: the user's own training program is the trial.

The examples a user copies (``examples/trainer``: a Trainer script fed TrainingArguments flags;
``examples/amp_loop``: seed 004's custom AMP loop, fed flags too, on chat records here; its
pre-training job is ``tests/test_seeds.py::test_seed_004``) are swept
end to end with ``sweeper launch`` on the tiny stand-in job (``scripts/tiny_job.py``), on SQLite
and on Postgres. Scripts that go wrong run as real trial children: one that never calls the
hook, one that crashes, one that hangs, one that ignores a knob.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from sweeper.job import ScriptSpec
from sweeper.launcher import run_child
from sweeper.measurement import Measurement, parse_measurement
from sweeper.space import Space
from sweeper.store import Store
from sweeper.trial.protocol import PreparedData
from tests.helpers import REPO, run_sweeper, tiny_config, trial_request

pytestmark = pytest.mark.torch


def _example_space(
    example: str, job: Path, tmp_path: Path, workload: dict | None = None, **search: list[object]
) -> Path:
    """The example's space as a user would point it at their job: its paths made absolute,
    its python this one, one trial; ``workload``: fields to change."""
    text = (REPO / "examples" / example / "space.yaml").read_text()
    text = text.replace("my-job/", f"{job}/")
    text = text.replace("[python, examples/", f"[{sys.executable}, {REPO}/examples/")
    space = yaml.safe_load(text)
    space["budget"]["n_trials"] = 1  # one trial is the whole path; the search has its own tests
    space["trial"]["preflight"] = False  # preflight's probes have tests of their own
    space["search"].update(search)
    space["workload"].update(workload or {})
    path = tmp_path / f"{example}.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def _sweep_and_check(
    space: Path, url: str, study: str, cache_dir: Path, job: Path
) -> tuple[dict, Measurement]:
    launch = run_sweeper(
        "launch", "--space", str(space), "--storage", url, cache_dir=cache_dir, timeout=900
    )
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    store = Store(url)
    try:
        trials = store.list_trials(study, include_measurement=True)
    finally:
        store.dispose()
    done = [t for t in trials if t.state == "complete"]
    assert len(done) == 1, [(t.state, t.failure_message) for t in trials]
    for trial in done:
        assert trial.measurement is not None
        measured = parse_measurement(trial.measurement)
        assert measured.engine == "script"
        # read back from the script's own objects, not copied from the config
        effective = measured.effective
        assert effective["per_device_batch_size"] == trial.config["per_device_batch_size"]
        assert (
            effective["gradient_accumulation_steps"]
            == (trial.config["gradient_accumulation_steps"])
        )
        assert effective["attn_implementation"] == trial.config["attn_implementation"]
        assert effective["optim"] == "adamw_torch"
        assert measured.measured_steps >= 3 and measured.tokens_per_s > 0
        assert 0 < measured.padding_share < 1  # the script's own padded chat batches
        assert measured.flops_per_token > 0 and measured.loss_first > 0
        # a step's loss, not one per micro-batch added up: random weights start near ln(vocab)
        vocab = json.loads((job / "model" / "config.json").read_text())["vocab_size"]
        assert measured.loss_first < 1.5 * math.log(vocab), (measured.losses, vocab)
        assert measured.startup_s > 0
    best = run_sweeper("best", "--study", study, "--storage", url, "--json", cache_dir=cache_dir)
    assert best.returncode == 0, best.stderr
    answer = json.loads(best.stdout)
    assert answer["config"]["per_device_batch_size"] in (2, 4)
    return dict(answer), measured


def test_the_trainer_example_is_swept_end_to_end(
    job: Path, tmp_path: Path, sqlite_url: str, cache_dir: Path
) -> None:
    # the space prices one epoch, and the command (silent on epochs) trains TrainingArguments'
    # default 3: read from the running Trainer, and said beside the answer with its cost
    # The space also says 200 samples per epoch where the command trains the file's 400 rows
    space = _example_space(
        "trainer", job, tmp_path, workload={"epochs": 1, "samples": 200},
        attn_implementation=["sdpa"],
    )  # fmt: skip
    answer, measured = _sweep_and_check(space, sqlite_url, "trainer-script", cache_dir, job)
    assert measured.program_run is not None
    assert measured.program_run.num_train_epochs == 3.0 and measured.program_run.max_steps == -1
    rows = len((job / "chats.jsonl").read_text().splitlines())
    assert measured.program_run.train_rows == rows
    steps_per_epoch = math.ceil(rows / measured.effective_batch)
    assert measured.program_run.planned_steps == 3 * steps_per_epoch
    said = [w for w in answer["warnings"] if w.startswith("your program trains 3 epochs")]
    assert said and "pass --num_train_epochs 1 in the command" in said[0], answer["warnings"]
    part = answer["projection"]
    hours = (
        3 * part["train_hours"]
        + (part["startup_s"] + part["compile_s"] + 3 * part["checkpoint_s"]) / 3600
    )
    cost = hours * answer["usd_per_hour"]  # a CPU's cents: two significant digits
    assert f"about {hours:.2f} h and ${cost:.2g} (an estimate" in said[0], said
    assert f"your program's training set holds {rows} rows per epoch, the records" in " ".join(
        answer["warnings"]
    ), answer["warnings"]
    # the export is the user's own command with the winner's flags; run as the user runs it
    # (outside a trial the callback does nothing), two steps of it
    export = run_sweeper(
        "export", "--study", "trainer-script", "--storage", sqlite_url, "--format", "command",
        cache_dir=cache_dir,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    command = export.stdout.strip().splitlines()[-1]
    batch = answer["config"]["per_device_batch_size"]
    assert f"--per_device_train_batch_size {batch} " in command
    assert "#   attn_implementation: sdpa" in export.stdout  # read via trial_config()
    out = tmp_path / "real-run"
    ran = subprocess.run(
        [*shlex.split(command), "--max_steps", "2", "--output_dir", str(out)],
        capture_output=True, text=True, timeout=600, env=_outside_a_trial(),
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert (out / "model.safetensors").is_file()


def _outside_a_trial() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_")}


@pytest.mark.postgres
def test_the_amp_loop_example_is_swept_end_to_end_on_postgres(
    job: Path, tmp_path: Path, postgres_url: str, cache_dir: Path
) -> None:
    space = _example_space("amp_loop", job, tmp_path, attn_implementation=["eager"])
    _, measured = _sweep_and_check(space, postgres_url, "amp-loop", cache_dir, job)
    # a loop shows its DataLoader's rows (loader=...), not how many epochs or steps it runs
    assert measured.program_run is not None
    assert measured.program_run.num_train_epochs is None and measured.program_run.max_steps is None
    assert measured.program_run.train_rows == len((job / "chats.jsonl").read_text().splitlines())


def _run_script(
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    command: list[str],
    *,
    knobs: str = "flags",
    timeout_s: float = 300,
) -> tuple[str | None, str]:
    workload = tiny_space.workload.model_copy(
        update={"engine": "script", "script": ScriptSpec(command=command, knobs=knobs)}
    )
    request = trial_request(
        tiny_space.model_copy(update={"workload": workload}),
        tiny_prepared,
        cache_dir,
        tiny_config(per_device_batch_size=2, gradient_accumulation_steps=1),
    )
    run = run_child(request, timeout_s=timeout_s)
    assert run.result.status == "failed", run.result
    return run.result.failure_kind, run.result.failure_message or ""


def test_a_script_that_never_calls_the_hook_is_told_the_line_to_add(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    kind, message = _run_script(
        tiny_space, tiny_prepared, cache_dir, [sys.executable, "-c", "print('trained')"]
    )
    assert kind == "error"
    assert "never reached sweeper's recorder" in message
    assert "callbacks=[sweeper.callback()]" in message and "sweeper.step(" in message


def test_a_callback_made_but_not_given_to_the_trainer_fails_at_train_not_at_the_runs_end(
    job: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """A walk's script made `sweeper_cb = sweeper.callback()` and gave its Trainer its own
    logging callback only: each trial trained the whole 3-epoch run, then failed with "let
    the run go on longer". It fails as train() starts, naming where the callback was made."""
    source = (REPO / "examples/trainer/train.py").read_text()
    line = "        callbacks=[sweeper.callback()],  # sweeper's one line\n"
    assert line in source
    made = source.replace(line, "        callbacks=[],\n").replace(
        "    trainer = Trainer(\n",
        "    sweeper_cb = sweeper.callback()\n    trainer = Trainer(\n",
        1,
    )
    script = tmp_path / "train_unused_callback.py"
    script.write_text(made)
    at = made.splitlines().index("    sweeper_cb = sweeper.callback()") + 1
    command = [
        sys.executable, str(script), "--model_name_or_path", str(job / "model"),
        "--data_file", str(job / "chats.jsonl"), "--output_dir", str(tmp_path / "out"),
        "--report_to", "none", "--save_strategy", "no", "--use_cpu", "True",
        "--num_train_epochs", "50",  # a long run: the trial must not train it
    ]  # fmt: skip
    started = time.monotonic()
    kind, message = _run_script(tiny_space, tiny_prepared, cache_dir, command)
    assert kind == "error", message
    assert message.startswith(
        f"sweeper.callback() was made (at {script.name}:{at}), but the Trainer that trains was "
        "not given it"
    ), message
    assert "callbacks=[sweeper.callback()]" in message and "let the run go on" not in message
    assert time.monotonic() - started < 240  # not 50 epochs


SHORT_RUN = """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import sweeper
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
    num_attention_heads=2, num_key_value_heads=2))
optimizer = torch.optim.AdamW(model.parameters())
batch = {"input_ids": torch.randint(0, 64, (2, 16))}
batch["labels"] = batch["input_ids"]
for _ in range(2):  # the program's own run: two steps, then it ends as a run does
    with sweeper.step(batch, model=model, optimizer=optimizer):
        model(**batch).loss.backward(); optimizer.step(); optimizer.zero_grad()
"""


def test_a_script_whose_run_ends_before_the_measurement_is_told_so_not_to_add_the_line(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """A walk's Trainer script (13 steps in its one epoch, burn-in up to 10 and 4 timed) had
    the line in place and was told it "never reached sweeper's recorder: add the line"."""
    script = tmp_path / "short.py"
    script.write_text(SHORT_RUN)
    kind, message = _run_script(tiny_space, tiny_prepared, cache_dir, [sys.executable, str(script)])
    assert kind == "error"
    assert "never reached" not in message and "callbacks=[sweeper.callback()]" not in message
    assert "ended after 2 optimizer steps, all of them burn-in (up to 4, trial.warmup)" in message
    assert "before the timed window (at least 3 steps, trial.measure)" in message
    assert "more --num_train_epochs or --max_steps in workload.script.command" in message


def test_a_script_that_crashes_is_classified_from_what_it_raised(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    oom = (
        "import torch; raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2 GiB')"
    )
    kind, message = _run_script(tiny_space, tiny_prepared, cache_dir, [sys.executable, "-c", oom])
    assert kind == "oom" and "Tried to allocate 2 GiB" in message, message
    kind, message = _run_script(
        tiny_space, tiny_prepared, cache_dir, [sys.executable, "-c", "import sys; sys.exit(3)"]
    )
    assert kind == "error" and "exited 3" in message
    kind, message = _run_script(tiny_space, tiny_prepared, cache_dir, ["no-such-program-here"])
    assert kind == "error" and "could not start" in message


def test_a_script_that_crashes_says_where_and_a_json_config_script_is_told_why(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    # a crash at import names the user's file and line, as the traceback has them
    crash = tmp_path / "train.py"
    crash.write_text("import sweeper\n\nimport no_such_module_here\n")
    kind, message = _run_script(tiny_space, tiny_prepared, cache_dir, [sys.executable, str(crash)])
    assert kind == "error", message
    assert "No module named 'no_such_module_here'" in message
    assert "train.py:3 (import no_such_module_here)" in message, message
    # HF's `python train.py config.json` form: the flags each trial appends are not parsed
    script = tmp_path / "train_json.py"
    script.write_text(
        "import sys\n"
        "from transformers import HfArgumentParser, TrainingArguments\n"
        "import sweeper\n"
        "parser = HfArgumentParser(TrainingArguments)\n"
        "if len(sys.argv) == 2 and sys.argv[1].endswith('.json'):\n"
        "    (args,) = parser.parse_json_file(sys.argv[1])\n"
        "else:\n"
        "    (args,) = parser.parse_args_into_dataclasses()\n"
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"output_dir": str(tmp_path / "out")}))
    kind, message = _run_script(
        tiny_space, tiny_prepared, cache_dir, [sys.executable, str(script), str(config)]
    )
    assert kind == "error" and "not used by the HfArgumentParser" in message, message
    assert "train_json.py:8" in message, message
    assert "workload.script.knobs: flags each trial appends the knobs" in message
    assert "knobs: env" in message and "sweeper.trial_config()" in message
    # a misspelt flag of the user's own command is named as theirs, not blamed on the knobs;
    # the error comes before the command (a trial's line on the terminal is cut at its width)
    typo = [sys.executable, str(script), "--output_dir", str(tmp_path / "o"), "--lora_alpah", "32"]
    kind, message = _run_script(tiny_space, tiny_prepared, cache_dir, typo)
    assert message.startswith("your command exited"), message
    assert "; --lora_alpah is a word of workload.script.command, not an argument" in message
    assert "appends the knobs" not in message and message.endswith(f"{' '.join(typo)})")


def test_a_script_that_hangs_is_killed_at_the_trial_timeout(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    # the two trials only wait for their timeouts, each in its own child and trial directory:
    # run side by side, the test takes the longer timeout (30 s), not the sum (45 s). The one
    # that reaches the line imports sweeper's hook first (transformers' trainer_utils, peft):
    # 47 s at load 8 on 2 cores, past a fixed 30 s, so its timeout grows with the load
    reach_s = min(180.0, 30.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))
    with ThreadPoolExecutor(max_workers=2) as pool:
        never = pool.submit(
            _run_script,
            tiny_space,
            tiny_prepared,
            cache_dir,
            [sys.executable, "-c", "import time; time.sleep(600)"],
            timeout_s=15,
        )
        # one that reached it and then hung is told apart
        reached = pool.submit(
            _run_script,
            tiny_space,
            tiny_prepared,
            cache_dir,
            [sys.executable, "-c", "import sweeper, time; sweeper.callback(); time.sleep(600)"],
            timeout_s=reach_s,
        )
        kind, message = never.result()
        assert kind == "timeout" and "15 s" in message
        # it never reached sweeper's line: the message says so, and what to add (a script that
        # forgot it trains to its end unmeasured, so its trials end here)
        assert "your command, which never reached sweeper's line" in message, message
        assert "callbacks=[sweeper.callback()]" in message
        kind, message = reached.result()
        assert kind == "timeout" and "sweeper's line reached" in message, message


def test_a_script_that_ignores_a_knob_fails_naming_it(
    job: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """The Trainer example given its knobs in the environment only: TrainingArguments keep
    their defaults (batch size 8), and the read-back from the script's Trainer says so."""
    command = [
        sys.executable, str(REPO / "examples/trainer/train.py"),
        "--model_name_or_path", str(job / "model"), "--data_file", str(job / "chats.jsonl"),
        "--output_dir", str(job / "out"), "--report_to", "none", "--use_cpu", "True",
    ]  # fmt: skip
    kind, message = _run_script(tiny_space, tiny_prepared, cache_dir, command, knobs="env")
    assert kind == "mismatch", message
    assert "per_device_batch_size: asked 2, ran 8" in message


_OWN_CUT = '''
"""A user's Trainer script with its own cut (256 tokens) and collator; no trial_config()."""
import sys
import time

import torch
from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, Trainer
from transformers import TrainingArguments

import sweeper

model_dir, data = sys.argv[1], sys.argv[2]
(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(sys.argv[3:])
tokenizer = AutoTokenizer.from_pretrained(model_dir)
rows = load_dataset("json", data_files=data, split="train").map(
    lambda r: {
        "input_ids": tokenizer(tokenizer.apply_chat_template(r["messages"], tokenize=False))[
            "input_ids"
        ][:256]
    },
    remove_columns=["messages"],
)


def collate(batch):
    width = max(len(r["input_ids"]) for r in batch)
    ids = torch.full((len(batch), width), tokenizer.pad_token_id or 0)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(batch):
        ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        mask[i, : len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


model = AutoModelForCausalLM.from_pretrained(model_dir)
Trainer(model=model, args=args, train_dataset=rows, data_collator=collate,
        callbacks=[sweeper.callback()]).train()
'''


def test_a_knob_that_never_reached_the_script_is_recorded_as_its_own_or_fails_if_searched(
    job: Path, tmp_path: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """max_seq_length is not a TrainingArguments flag: a script that never calls
    sweeper.trial_config() cuts its samples where it likes. Its trial records the cut as the
    script's own, not the config's 512; a space that searches the length fails the trial."""
    script = tmp_path / "train.py"
    script.write_text(_OWN_CUT)
    command = [
        sys.executable, str(script), str(job / "model"), str(job / "chats.jsonl"),
        "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--use_cpu", "True",
    ]  # fmt: skip
    workload = tiny_space.workload.model_copy(
        update={"engine": "script", "script": ScriptSpec(command=command, knobs="flags")}
    )
    request = trial_request(
        tiny_space.model_copy(update={"workload": workload}),
        tiny_prepared,
        cache_dir,
        tiny_config(per_device_batch_size=2, gradient_accumulation_steps=1, max_seq_length=512),
        warmup={"min_steps": 1, "max_steps": 1},
        measure={"min_steps": 2, "max_steps": 2},
    )
    one = run_child(request, timeout_s=300)
    assert one.result.status == "ok", (one.result.failure_message, one.log_tail[-2000:])
    cut = parse_measurement(one.result.payload).effective["max_seq_length"]
    assert cut != 512 and "the script's own" in cut and "sweeper.trial_config()" in cut, cut
    # named as such, for best, the dashboard and the export (tests/test_store_own_values.py)
    # (packing reaches it only there too; its rows show no packing, but that is not a reading)
    assert parse_measurement(one.result.payload).unreached == ["max_seq_length", "packing"]

    searched = run_child(request.model_copy(update={"varied": ("max_seq_length",)}), timeout_s=300)
    assert searched.result.failure_kind == "mismatch", searched.result
    message = searched.result.failure_message or ""
    assert "searches max_seq_length" in message and "never called it" in message, message


_TRL_SCRIPT = '''
"""A user's TRL SFT + LoRA script: SFTConfig from the command, its defaults where it is silent."""
from dataclasses import dataclass

from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser
from trl import SFTConfig, SFTTrainer

import sweeper


@dataclass
class Job:
    model: str
    data: str


job, config = HfArgumentParser((Job, SFTConfig)).parse_args_into_dataclasses()
chats = load_dataset("json", data_files=job.data, split="train").select(range(48))
SFTTrainer(
    model=AutoModelForCausalLM.from_pretrained(job.model),
    args=config,
    train_dataset=chats.map(lambda r: {"messages": r["messages"]}),
    processing_class=AutoTokenizer.from_pretrained(job.model),
    peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
    callbacks=[sweeper.callback()],
).train()
'''


def test_an_sftconfig_scripts_own_defaults_are_what_its_trials_run_and_record(
    job: Path, tmp_path: Path, sqlite_url: str, cache_dir: Path
) -> None:
    """A TRL script launched as `accelerate launch train.py ...` with `accelerate config
    default`'s file (mixed_precision 'no'), its command silent on precision and checkpointing:
    the user's run trains bf16 with gradient checkpointing (SFTConfig's defaults; bf16=True
    beats the launcher's 'no'). A space that does not list those knobs measures that run, and
    the study records it. Before, the trials appended --bf16 False --gradient_checkpointing
    False and recorded fp32 without checkpointing: a run the user's command never does."""
    script = tmp_path / "train.py"
    script.write_text(_TRL_SCRIPT)
    hf_home = tmp_path / "hf"
    (hf_home / "accelerate").mkdir(parents=True)
    (hf_home / "accelerate" / "default_config.yaml").write_text(
        json.dumps(
            {
                "distributed_type": "NO",
                "mixed_precision": "no",
                "num_processes": 1,
                "use_cpu": True,
                "compute_environment": "LOCAL_MACHINE",
            }
        )  # fmt: skip
    )
    accelerate = str(Path(sys.executable).parent / "accelerate")
    space = {
        "study": "trl-defaults",
        "hardware": {"name": "CPU", "usd_per_hour": 0.10, "device": "cpu"},
        "workload": {
            "model": {"id": str(job / "model")},
            "adapter": {"kind": "lora", "r": 4, "alpha": 8, "target_modules": "all-linear"},
            "dataset": {"path": str(job / "chats.jsonl"), "messages_field": "messages"},
            "engine": "script",
            "script": {
                "command": [
                    accelerate,
                    "launch",
                    str(script),
                    "--model",
                    str(job / "model"),
                    "--data",
                    str(job / "chats.jsonl"),
                    "--output_dir",
                    str(tmp_path / "out"),
                    "--report_to",
                    "none",
                    "--use_cpu",
                    "True",
                    "--save_strategy",
                    "no",
                ],  # fmt: skip
                "knobs": "sft_flags",
            },
            "samples": 48,
            "epochs": 1,
        },
        "search": {"per_device_batch_size": [2], "max_seq_length": [256]},
        "trial": {
            "warmup": {"min_steps": 1, "max_steps": 3, "window": 2},
            "measure": {"min_steps": 2, "max_steps": 3, "min_seconds": 0, "max_seconds": 10},
            "timeout_s": 300,
            "preflight": False,
        },
        "budget": {
            "n_trials": 1,
            "remeasure": {"rounds": 0, "contended_reruns": 0, "contended_later": 0},
        },  # fmt: skip
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_")}
    env.update(
        HF_HOME=str(hf_home), SWEEPER_CACHE_DIR=str(cache_dir), COLUMNS="200",
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])]),
    )  # fmt: skip
    launch = run_sweeper("launch", "--space", str(path), "--storage", sqlite_url, env=env)
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    assert "precision bf16 (SFTConfig's default bf16=True, over mixed_precision no in " in (
        launch.stdout
    ), launch.stdout
    assert "gradient_checkpointing True (SFTConfig's default" in launch.stdout
    store = Store(sqlite_url)
    try:
        (trial,) = store.list_trials("trl-defaults", include_measurement=True)
    finally:
        store.dispose()
    assert trial.state == "complete", trial.failure_message
    assert trial.config["precision"] == "bf16" and trial.config["gradient_checkpointing"]
    assert trial.measurement is not None
    effective = parse_measurement(trial.measurement).effective  # read back from what ran
    assert effective["precision"] == "bf16" and effective["gradient_checkpointing"] is True


_TRL_ENV_SCRIPT = '''
"""A user's TRL SFT script that takes its knobs from sweeper.trial_config() (knobs: env)."""
from dataclasses import dataclass

from datasets import load_dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser
from trl import SFTConfig, SFTTrainer

import sweeper


@dataclass
class Job:
    model: str
    data: str


job, config = HfArgumentParser((Job, SFTConfig)).parse_args_into_dataclasses()
trial = sweeper.trial_config()
if trial is not None:  # the knobs it takes; precision and checkpointing stay SFTConfig's
    config.per_device_train_batch_size = trial["per_device_batch_size"]
    config.gradient_accumulation_steps = trial["gradient_accumulation_steps"]
    config.max_length = trial["max_seq_length"]
SFTTrainer(
    model=AutoModelForCausalLM.from_pretrained(job.model),
    args=config,
    train_dataset=load_dataset("json", data_files=job.data, split="train").select(range(48)),
    processing_class=AutoTokenizer.from_pretrained(job.model),
    callbacks=[sweeper.callback()],
).train()
'''


def test_an_env_scripts_own_sftconfig_values_are_read_back_and_recorded(
    job: Path, tmp_path: Path, sqlite_url: str, cache_dir: Path
) -> None:
    """knobs: env, a TRL script silent on precision and checkpointing: SFTConfig's bf16 and
    gradient checkpointing run. The space does not list them, so the trial records what its
    Trainer ran (read back after SFTConfig's defaults), and derives the measurement from it.
    Before, the trial compared them with sweeper's own defaults (fp32, no checkpointing,
    adamw_torch) and failed every trial as a mismatch."""
    script = tmp_path / "train.py"
    script.write_text(_TRL_ENV_SCRIPT)
    command = [
        sys.executable, str(script), "--model", str(job / "model"), "--data",
        str(job / "chats.jsonl"), "--output_dir", str(tmp_path / "out"), "--report_to", "none",
        "--use_cpu", "True", "--save_strategy", "no",
    ]  # fmt: skip
    space = {
        "study": "trl-env",
        "hardware": {"name": "CPU", "usd_per_hour": 0.10, "device": "cpu"},
        "workload": {
            "model": {"id": str(job / "model")},
            "dataset": {"path": str(job / "chats.jsonl"), "messages_field": "messages"},
            "engine": "script",
            "script": {"command": command, "knobs": "env"},
            "samples": 48,
            "epochs": 1,
        },
        "search": {"per_device_batch_size": [2], "max_seq_length": [256]},
        "trial": {
            "warmup": {"min_steps": 1, "max_steps": 2, "window": 2},
            "measure": {"min_steps": 2, "max_steps": 3, "min_seconds": 0, "max_seconds": 10},
            "timeout_s": 300,
            "preflight": False,
        },
        "budget": {
            "n_trials": 1,
            "remeasure": {"rounds": 0, "contended_reruns": 0, "contended_later": 0},
        },  # fmt: skip
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    launch = run_sweeper("launch", "--space", str(path), "--storage", sqlite_url,
                         cache_dir=cache_dir)  # fmt: skip
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    assert "knobs: env: a knob search: does not list runs at your script's own value" in (
        " ".join(launch.stdout.split())
    ), launch.stdout
    store = Store(sqlite_url)
    try:
        (trial,) = store.list_trials("trl-env", include_measurement=True)
    finally:
        store.dispose()
    assert trial.state == "complete", trial.failure_message
    assert trial.measurement is not None
    measured = parse_measurement(trial.measurement)
    effective = measured.effective or {}
    assert effective["precision"] == "bf16" and effective["gradient_checkpointing"] is True
    assert effective["per_device_batch_size"] == 2  # the knob it took from trial_config()
    assert measured.effective_batch == 2
    # the row keeps the config asked (the study's key of it: a resumed sweep must not run it
    # again) and records the script's own values beside it, which is what the answer shows
    assert trial.config["precision"] == "fp32" and trial.config["gradient_checkpointing"] is False
    own = trial.own_values or {}
    assert own["precision"] == "bf16" and own["gradient_checkpointing"] is True, own
    assert measured.own_values == own
    assert "per_device_batch_size" not in own  # taken from trial_config(): asked, not its own
    shown = run_sweeper("best", "--study", "trl-env", "--storage", sqlite_url, "--json",
                        cache_dir=cache_dir)  # fmt: skip
    assert shown.returncode == 0, shown.stdout + shown.stderr
    answer = json.loads(shown.stdout)
    assert answer["config"]["precision"] == "bf16", answer["config"]
    assert answer["config"]["gradient_checkpointing"] is True
    assert answer["own_values"] == own
    printed = run_sweeper("best", "--study", "trl-env", "--storage", sqlite_url,
                          cache_dir=cache_dir)  # fmt: skip
    assert printed.returncode == 0, printed.stdout + printed.stderr
    assert "precision: bf16  # your script's own" in printed.stdout, printed.stdout
    # its Trainer ran an SFTConfig, read from the running object: knobs: env says nothing of
    # it, yet its export is SFTConfig's (walk 002's leftover: TrainingArguments only)
    assert measured.program_run is not None and measured.program_run.arguments == "SFTConfig"
    exported = run_sweeper("export", "--study", "trl-env", "--storage", sqlite_url,
                           cache_dir=cache_dir)  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    assert "also takes sft, trainer, yaml" in " ".join(exported.stderr.split()), exported.stderr
    sft = run_sweeper("export", "--study", "trl-env", "--storage", sqlite_url, "--format", "sft",
                      cache_dir=cache_dir)  # fmt: skip
    assert sft.returncode == 0 and "SFTConfig(" in sft.stdout, sft.stderr


def test_an_sftconfig_script_given_trainingarguments_flags_is_told_to_use_sft_flags(
    job: Path, tmp_path: Path, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """knobs: flags on a script that parses SFTConfig: --max_length never reaches it and its
    bf16 default runs. The mismatch says which form its arguments need."""
    script = tmp_path / "train.py"
    script.write_text(_TRL_SCRIPT)
    command = [
        sys.executable, str(script), "--model", str(job / "model"), "--data",
        str(job / "chats.jsonl"), "--output_dir", str(tmp_path / "out"), "--report_to", "none",
        "--use_cpu", "True", "--save_strategy", "no",
    ]  # fmt: skip
    kind, message = _run_script(tiny_space, tiny_prepared, cache_dir, command, knobs="flags")
    assert kind == "mismatch", message
    assert "max_seq_length: asked 64, a batch was" in message, message
    assert "your script's arguments are TRL's SFTConfig" in message
    assert "set workload.script.knobs: sft_flags" in message


def test_a_length_flag_of_the_scripts_own_parser_is_given_or_said_unknown(
    job: Path, tmp_path: Path, sqlite_url: str, cache_dir: Path
) -> None:
    """A walk's HfArgumentParser script cut its rows at its own --max_seq_length (a dataclass
    of its own beside TrainingArguments) and never read sweeper's: the trials recorded
    sweeper's length and `best` said "truncates 0.0%" where 2% were cut. Now a length flag
    the command already says is one the script takes: each trial gives it the config's length
    (the last flag wins), and read back it ran. Without the flag in the command the length
    never reached the script: `best` says what it cuts is not known, instead of a figure."""
    source = (REPO / "examples/trainer/train.py").read_text()
    taken = (
        "    trial = sweeper.trial_config()  # None outside a sweeper trial\n"
        "    if trial is not None:  # the knobs that are not TrainingArguments\n"
        '        script.max_length = trial["max_seq_length"]\n'
        '        script.attn_implementation = trial["attn_implementation"]\n'
    )
    assert taken in source
    script = tmp_path / "train_own_length.py"
    script.write_text(source.replace(taken, ""))  # its own --max_length (and sdpa) only
    shown = {}
    for name, words in (("said", ["--max_length", "16"]), ("unsaid", [])):
        one = {"per_device_batch_size": [2], "gradient_accumulation_steps": [1]}
        space_path = _example_space("trainer", job, tmp_path, attn_implementation=["sdpa"], **one)
        space = yaml.safe_load(space_path.read_text())
        command = space["workload"]["script"]["command"]
        command[1] = str(script)
        space["workload"]["script"]["command"] = command + words
        space["study"] = name
        space_path.write_text(yaml.safe_dump(space))
        launch = run_sweeper("launch", "--space", str(space_path), "--storage", sqlite_url,
                             cache_dir=cache_dir, timeout=900)  # fmt: skip
        assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
        store = Store(sqlite_url)
        try:
            (trial,) = store.list_trials(name, include_measurement=True)
        finally:
            store.dispose()
        assert trial.state == "complete", trial.failure_message
        shown[name] = (
            parse_measurement(trial.measurement or {}),
            json.loads(
                run_sweeper(
                    "best", "--study", name, "--storage", sqlite_url, "--json", cache_dir=cache_dir
                ).stdout  # fmt: skip
            ),
        )
    measured, answer = shown["said"]
    assert "max_seq_length" not in (measured.unreached or ())  # given as --max_length 128, and ran
    assert answer["config"]["max_seq_length"] == 128
    # its rows were not cut at the command's own 16: the trial's --max_length 128 came last
    assert measured.tokens_per_s / measured.samples_per_s > 16
    assert answer["truncated_tokens_share"] is not None
    assert not any(w.startswith("your script cut its rows") for w in answer["warnings"])
    measured, answer = shown["unsaid"]
    assert "max_seq_length" in (measured.unreached or ())
    assert answer["truncated_tokens_share"] is None and answer["truncated_samples_share"] is None
    assert any(w.startswith("your script cut its rows at a length of its own") for w in
               answer["warnings"]), answer["warnings"]  # fmt: skip
