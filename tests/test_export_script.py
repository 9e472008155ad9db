"""A study of the user's own script (``engine: script``) exports what its trials ran, and no
data pipeline of sweeper's: its DataLoader form is the keywords the trials' DataLoader took,
which build a real torch DataLoader; the exports of sweeper's own engines import each module
once and drop the short last batch as their trials did (walk 002, defect 5)."""

from __future__ import annotations

import ast
import re
from typing import Any

import pytest

from sweeper.export import page_formats, render, trainer_kwargs
from sweeper.knob_values import UNREACHED_WHY
from sweeper.measurement import ProgramRun, sample_measurement
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config
from tests.test_export import _recommendation

CPU_SPACE = TINY_SPACE.read_text()
LOOP_SCRIPT = (
    "  engine: script\n  script: {command: [python, train_sw.py, --epochs, '5'], knobs: env}\n"
)
SFT_SCRIPT = "  engine: script\n  script: {command: [python, sft.py], knobs: sft_flags}\n"
CONFIG = tiny_config(
    per_device_batch_size=8,
    gradient_accumulation_steps=2,
    num_workers=2,
    prefetch_factor=4,
    persistent_workers=True,
    max_seq_length=64,
).model_dump()
# what a loop's sweeper.step(..., loader=) reports: the rows of an epoch, no epochs
LOOP_RUN = ProgramRun(train_rows=300)
# what a Trainer's sweeper.callback() reports: its run after TrainingArguments' defaults
TRAINER_RUN = ProgramRun(num_train_epochs=3.0, max_steps=-1, planned_steps=120, train_rows=300)
# an SFTTrainer script's (its arguments an SFTConfig), whatever its knobs form
SFT_RUN = TRAINER_RUN.model_copy(update={"arguments": "SFTConfig"})


def with_script(script: str) -> str:
    return CPU_SPACE.replace("  samples: 10000\n", f"  samples: 10000\n{script}")


def one_trial_study(store: Store, name: str, space_yaml: str, **measured: Any) -> None:
    """Study ``name`` of ``space_yaml`` with one completed trial of CONFIG, its measurement
    ``sample_measurement(**measured)``."""
    store.upsert_study(name, **(STUDY_FIELDS | {"space_yaml": space_yaml}))
    store.start_trial(name, 0, CONFIG)
    store.finish_trial(name, 0, "complete", samples_per_s=50.0, it_per_s=1.5,
                       hours_per_run=10.0, cost_per_run_usd=25.0,
                       measurement=sample_measurement(**measured).model_dump())  # fmt: skip


def seed_script_studies(url: str) -> None:
    """A loop script's study, the same with a knob that never reached the script, a Trainer
    script's, an SFT script's and a study of sweeper's own engine, one trial each."""
    store = Store(url)
    store.migrate()
    for name, space_yaml, run, unreached in (
        ("loop-script", with_script(LOOP_SCRIPT), LOOP_RUN, None),
        ("unreached", with_script(LOOP_SCRIPT), LOOP_RUN, ["prefetch_factor"]),
        ("trainer-script", with_script(LOOP_SCRIPT), TRAINER_RUN, None),
        ("sft-script", with_script(SFT_SCRIPT), TRAINER_RUN, None),
        ("sft-env-script", with_script(LOOP_SCRIPT), SFT_RUN, None),
        ("builtin", CPU_SPACE, None, None),
        (
            "sft-engine",
            CPU_SPACE.replace("  epochs: 1\n", "  epochs: 1\n  engine: sft\n"),
            None,
            None,
        ),
        (
            "trainer-engine",
            CPU_SPACE.replace("  epochs: 1\n", "  epochs: 1\n  engine: trainer\n"),
            None,
            None,
        ),
    ):
        one_trial_study(store, name, space_yaml, program_run=run, unreached=unreached)
    store.dispose()


@pytest.fixture
def url(sqlite_url: str) -> str:
    seed_script_studies(sqlite_url)
    return sqlite_url


@pytest.mark.torch
def test_a_script_studys_dataloader_export_is_the_keywords_its_trials_ran(url: str) -> None:
    """No tokenizing, padding, shuffling or drop_last of sweeper's: the script's own data code
    was measured. What is left builds a real DataLoader with the measured knobs."""
    from torch.utils.data import DataLoader

    rec, space_yaml = _recommendation(url, "loop-script")
    text = render(rec, "dataloader", space_yaml)
    for pipeline in ("dataset.map", "tokenize", "Padded", "collate", "drop_last", "shuffle"):
        assert f"{pipeline}=" not in text and f"{pipeline}(" not in text, pipeline
    assert not re.search(r"^(import|from) ", text, re.M)  # nothing to import: literals
    assert "--format command" in text  # where the rest of the config is
    namespace: dict = {}
    exec(compile(text, "<export>", "exec"), namespace)  # noqa: S102 — our own generated code
    kwargs = namespace["loader_kwargs"]
    assert kwargs == {
        "batch_size": 8,
        "num_workers": 2,
        "prefetch_factor": 4,
        "persistent_workers": True,
        "pin_memory": False,
    }
    loader = DataLoader(list(range(20)), **kwargs)  # the user's own call, with the keywords
    assert loader.batch_size == 8 and loader.num_workers == 2 and loader.prefetch_factor == 4
    assert loader.persistent_workers is True and loader.drop_last is False
    assert [len(batch) for batch in loader] == [8, 8, 4]  # the user's own drop_last (none)


@pytest.mark.torch
def test_a_knob_that_never_reached_the_script_is_not_exported_as_what_ran(url: str) -> None:
    from torch.utils.data import DataLoader

    rec, space_yaml = _recommendation(url, "unreached")
    text = render(rec, "dataloader", space_yaml)
    namespace: dict = {}
    exec(compile(text, "<export>", "exec"), namespace)  # noqa: S102 — our own generated code
    assert "prefetch_factor" not in namespace["loader_kwargs"]
    assert f"# not here: prefetch_factor: {UNREACHED_WHY}" in text
    assert DataLoader(list(range(4)), **namespace["loader_kwargs"]).batch_size == 8


def test_sweepers_own_engines_export_one_import_each_and_the_trials_drop_last(url: str) -> None:
    """The DataLoader export imported torch twice; its drop_last=True is what the loop
    engine's DataLoader and the Trainer engines' dataloader_drop_last ran."""
    rec, space_yaml = _recommendation(url, "builtin")
    quantized = rec.model_copy(update={"config": rec.config | {"quantization": "4bit"}})
    for fmt in ("dataloader", "trainer", "sft"):
        text = render(quantized, fmt, space_yaml)
        ast.parse(text)
        imports = [line for line in text.splitlines() if re.match(r"(import|from) \S", line)]
        assert len(imports) == len(set(imports)), (fmt, imports)
        assert "import torch" in imports, fmt
    loader = render(rec, "dataloader", space_yaml)
    assert "drop_last=True,  # as the trials' DataLoader dropped a short last batch" in loader
    assert trainer_kwargs(rec, space_yaml)["dataloader_drop_last"] is True
    script, script_yaml = _recommendation(url, "trainer-script")  # its Trainer ran its own
    assert "dataloader_drop_last" not in trainer_kwargs(script, script_yaml)


def test_the_forms_offered_are_those_of_the_studys_program(url: str) -> None:
    """A loop of the user's own has no TrainingArguments or SFTConfig; a Trainer script has,
    as its recorder said (its program_run's epochs); the command first for any script."""
    forms = {}
    names = ("loop-script", "trainer-script", "sft-script", "sft-env-script", "builtin",
             "sft-engine", "trainer-engine")  # fmt: skip
    store = Store(url)
    try:
        for name in names:
            trial = store.get_trial(name, 0)
            assert trial is not None
            measured = trial.measurement or {}
            forms[name] = page_formats(store.get_study(name).space_yaml, measured["program_run"])
    finally:
        store.dispose()
    assert forms == {
        "loop-script": ("command", "dataloader", "yaml"),
        "trainer-script": ("command", "trainer", "yaml"),
        "sft-script": ("command", "sft", "trainer", "yaml"),
        # knobs: env, but its Trainer ran an SFTConfig (walk 002's leftover: it was offered
        # TrainingArguments only)
        "sft-env-script": ("command", "sft", "trainer", "yaml"),
        # sweeper's engines: the engine's own arguments first
        "builtin": ("dataloader", "trainer", "sft", "yaml"),
        "sft-engine": ("sft", "trainer", "yaml"),
        "trainer-engine": ("trainer", "sft", "yaml"),
    }


def test_export_without_a_format_gives_the_studys_own_form(url: str) -> None:
    """`sweeper export --study S` gave TrainingArguments whatever the study trained with: a
    loop script's user got a Trainer's arguments, an SFT engine's user TrainingArguments.
    Without --format it is the study's own first form, and says so on stderr."""
    from tests.helpers import run_sweeper

    outputs = {}
    for name in ("loop-script", "sft-env-script", "sft-engine", "trainer-engine"):
        done = run_sweeper("export", "--study", name, "--storage", url)
        assert done.returncode == 0, done.stderr
        outputs[name] = done
    assert outputs["loop-script"].stdout.rstrip().endswith("python train_sw.py --epochs 5")
    # its own parser's 5 epochs against the priced 1: said beside the command it keeps
    said = " ".join(outputs["loop-script"].stdout.split())
    assert "# warning: your command says --epochs 5, and hours and $/run price workload." in said
    assert "or set workload.epochs: 5 if it trains 5" in said
    said = "exported as --format command, this study's own form (--format also takes dataloader,"
    assert f"{said} yaml, json)" in " ".join(outputs["loop-script"].stderr.split())
    assert outputs["sft-env-script"].stdout.rstrip().endswith("python train_sw.py --epochs 5")
    assert "also takes sft, trainer, yaml" in " ".join(outputs["sft-env-script"].stderr.split())
    assert "sft_config = SFTConfig(" in outputs["sft-engine"].stdout
    assert "TrainingArguments(" in outputs["trainer-engine"].stdout
    assert outputs["trainer-engine"].stderr == ""  # the form it always gave, unannounced


def test_a_script_that_masks_its_prompts_under_loss_all_is_said_and_exported_as_it_ran(
    sqlite_url: str,
) -> None:
    """A walk's script masked its prompts (labels on the replies only) while its space said
    loss: all: the trial recorded loss_labels "replies", and the exports labelled every
    token. `best` says so, and the exports follow what ran."""
    chat = re.sub(r"    generate:\n      samples: 400\n      median_chars: 300\n", "", CPU_SPACE)
    chat = chat.replace(
        "  dataset:\n", "  dataset:\n    path: chats.jsonl\n    messages_field: messages\n"
        "    loss: all\n"
    ).replace("  samples: 10000\n", f"  samples: 10000\n{LOOP_SCRIPT}")  # fmt: skip
    store = Store(sqlite_url)
    store.migrate()
    for name, labels in (("masked", "replies"), ("every", "all")):
        one_trial_study(store, name, chat, program_run=TRAINER_RUN, loss_labels=labels)
    store.dispose()
    rec, space_yaml = _recommendation(sqlite_url, "masked")
    said = [w for w in rec.warnings if w.startswith("your program took the loss on the")]
    assert len(said) == 1 and "workload.dataset.loss: all" in said[0], rec.warnings
    from sweeper.export_data import _replies, space_of

    assert _replies(space_of(space_yaml), rec.loss_labels)  # the exports mask as it ran
    rec, space_yaml = _recommendation(sqlite_url, "every")
    assert not [w for w in rec.warnings if w.startswith("your program took the loss on the")]
    assert not _replies(space_of(space_yaml), rec.loss_labels)


def test_a_command_that_saves_otherwise_than_the_space_prices_is_said_by_best(
    sqlite_url: str,
) -> None:
    """A walk's command said --save_steps 20 against the space's 500: the launch said so, and
    `best`, which prices the run with the space's interval, said nothing."""
    saves = CPU_SPACE.replace(
        "  samples: 10000\n",
        "  samples: 10000\n  engine: script\n  script: {command: [python, t.py, --save_steps, "
        "'20'], knobs: flags}\n",
    )
    store = Store(sqlite_url)
    store.migrate()
    one_trial_study(store, "saves", saves, program_run=TRAINER_RUN)
    store.dispose()
    rec, _ = _recommendation(sqlite_url, "saves")
    said = [w for w in rec.warnings if w.startswith("your command saves a checkpoint every 20")]
    assert len(said) == 1 and "set workload.checkpoint.save_steps: 20" in said[0], rec.warnings


@pytest.mark.parametrize(
    ("command", "launched"),
    [
        (
            "[python, train_sw.py, --epochs, '5']",
            "torchrun --standalone --nproc-per-node 2 train_sw.py --epochs 5",
        ),
        (
            "[torchrun, --nproc_per_node, '4', train_sw.py]",
            "torchrun --nproc_per_node 2 train_sw.py",
        ),
    ],
    ids=["python", "torchrun-line"],
)
def test_a_winner_on_two_devices_is_exported_with_its_launch(
    sqlite_url: str, command: str, launched: str
) -> None:
    """A walk's 2-device DDP winner exported as `python train_lslora.py ...` with `devices: 2`
    among "set them the way it does outside one": pasted, it trained one process. The command
    now starts the devices as the trial did."""
    space_yaml = with_script(
        f"  engine: script\n  script: {{command: {command}, knobs: env}}\n"
    ).replace(
        "  attn_implementation: [sdpa, eager]\n",
        "  attn_implementation: [sdpa, eager]\n  devices: [1, 2]\n",
    )
    store = Store(sqlite_url)
    store.migrate()
    try:
        store.upsert_study("ddp", **(STUDY_FIELDS | {"space_yaml": space_yaml}))
        store.start_trial("ddp", 0, CONFIG | {"devices": 2, "data_parallel": "ddp"})
        measured = sample_measurement(program_run=LOOP_RUN).model_dump()
        store.finish_trial(
            "ddp", 0, "complete", samples_per_s=50.0, it_per_s=1.5, hours_per_run=10.0,
            cost_per_run_usd=25.0, measurement=measured,
        )  # fmt: skip
    finally:
        store.dispose()
    rec, stored = _recommendation(sqlite_url, "ddp")
    text = render(rec, "command", stored)
    last = text.strip().splitlines()[-1]
    assert last.startswith(launched), text
    assert "#   devices:" not in text, text


def test_the_command_export_sets_the_threads_its_trials_ran_with(url: str) -> None:
    """A trial of a script runs with the sweep's environment; one that had OMP_NUM_THREADS
    set ran those threads, and its exported line (torch's default threads without it) would
    not (a walk measured 19 steps/s with 1 thread, 1.3 as exported): the export says so."""
    store = Store(url)
    store.migrate()
    started = {"runtime_env": {"OMP_NUM_THREADS": "4", "CUDA_VISIBLE_DEVICES": "0"}}
    one_trial_study(store, "threads", with_script(LOOP_SCRIPT), program_run=LOOP_RUN, env=started)
    one_trial_study(store, "default", with_script(LOOP_SCRIPT), program_run=LOOP_RUN)
    store.dispose()
    rec, space_yaml = _recommendation(url, "threads")
    text = render(rec, "command", space_yaml)
    assert text.splitlines()[-1].startswith("python train_sw.py"), text  # the command, as is
    assert "# the trials ran with OMP_NUM_THREADS=4 in their environment" in text
    assert "run `export OMP_NUM_THREADS=4` first" in text
    assert "CUDA_VISIBLE_DEVICES" not in text
    rec, space_yaml = _recommendation(url, "default")
    assert "OMP_NUM_THREADS" not in render(rec, "command", space_yaml)
