"""The recommended config, written the way users paste it: TrainingArguments, SFTConfig, a
DataLoader with its training loop, YAML, JSON; for a study of the user's own script
(``engine: script``), its command and the DataLoader keywords its trials ran.

Every knob reaches the snippets through ``sweeper.knobs`` (``trainer_arguments``,
``sft_arguments``, ``dataloader_arguments``) — the same functions the trial engines build their
``TrainingArguments`` and DataLoader from, so what is pasted is what was measured. The CLI
(``sweeper export``) and the REST API render through here and say the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import yaml

from sweeper import knobs, launch_export
from sweeper.cost import device_count, hours_figure, money
from sweeper.errors import ConflictError
from sweeper.export_data import data_lines, padded_to_max, sft_data_lines, space_of
from sweeper.export_model import adapter_lines as _adapter_lines
from sweeper.export_model import model_lines as _model_lines
from sweeper.export_model import quantization_lines as _quantization_lines
from sweeper.export_model import quantized as _quantized
from sweeper.job import AdapterSpec, Workload
from sweeper.knob_values import UNREACHED_WHY
from sweeper.recommendation import Recommendation
from sweeper.trial import accelerate_line

if TYPE_CHECKING:
    from sweeper.store import Store

ExportFormat = Literal["trainer", "sft", "dataloader", "yaml", "json", "command", "accelerate"]
FORMATS: tuple[ExportFormat, ...] = (
    "trainer", "sft", "dataloader", "yaml", "json", "command", "accelerate",
)  # fmt: skip
MEDIA_TYPES = {
    "accelerate": "application/yaml",
    "command": "text/x-shellscript",
    "trainer": "text/x-python",
    "sft": "text/x-python",
    "dataloader": "text/x-python",
    "yaml": "application/yaml",
    "json": "application/json",
}


def full_config(rec: Recommendation, space_yaml: str) -> dict[str, Any]:
    """The winner's value of every knob. A config stored before a knob existed takes the
    study's only choice for it (``workload.precision: bf16`` of an older space), else the
    knob's default."""
    space = space_of(space_yaml)
    values = dict(rec.config)
    for knob in knobs.KNOBS:
        if values.get(knob.name) is None and space is not None:
            listed = space.search.values(knob.name)
            if len(listed) == 1:
                values[knob.name] = listed[0]
    return knobs.normalize(values)


def learning_rate(rec: Recommendation, space_yaml: str) -> float:
    """The run's learning rate: the space's ``workload.learning_rate`` (scaled where the
    winner's effective batch differs from the baseline's), to three significant digits.

    >>> learning_rate(Recommendation.model_construct(suggested_learning_rate=7.071067811865475e-05,
    ...                                              learning_rate=1e-4), "")
    7.07e-05
    """
    value = rec.suggested_learning_rate or rec.learning_rate
    if value is None:
        space = space_of(space_yaml)
        value = space.workload.learning_rate if space is not None else 1e-4
    return float(f"{value:.3g}")


def _device(space_yaml: str) -> str:
    space = space_of(space_yaml)
    return "cpu" if space is None else space.hardware.device


def trainer_kwargs(rec: Recommendation, space_yaml: str) -> dict[str, Any]:
    """Keyword arguments of ``transformers.TrainingArguments`` for the recommended config."""
    config = full_config(rec, space_yaml)
    kwargs: dict[str, Any] = {"output_dir": "output", **knobs.trainer_arguments(config)}
    if _device(space_yaml) != "cuda":
        kwargs.pop("tf32", None)  # TrainingArguments refuses tf32 without an Ampere+ GPU
    # scaled when the effective batch differs from the baseline's (see the header's warning)
    kwargs["learning_rate"] = learning_rate(rec, space_yaml)
    space = space_of(space_yaml)
    if space is not None:
        # the epochs the hours and $/run were priced for (TrainingArguments' default is 3)
        kwargs["num_train_epochs"] = _epochs(space.workload)
        if space.workload.checkpoint.save_steps:
            kwargs["save_steps"] = space.workload.checkpoint.save_steps  # what $/run counted
        if space.workload.engine != "loop":
            kwargs["logging_steps"] = space.workload.logging_steps
        if space.workload.script is None:
            # sweeper's engines dropped a short last batch (a script's Trainer ran its own)
            kwargs["dataloader_drop_last"] = True
        if space.workload.engine == "script":
            # a script's trials ran its own learning rate and logging (sweeper passes neither):
            # the space's defaults would be a value nothing ran; what the space says stays
            said = space.workload.model_fields_set
            if "learning_rate" not in said and rec.suggested_learning_rate is None:
                kwargs.pop("learning_rate")
            if "logging_steps" not in said:
                kwargs.pop("logging_steps", None)
    return kwargs


def _epochs(workload: Workload) -> float:
    """``workload.epochs``, written as a person would (1, not 1.0)."""
    epochs = workload.epochs
    return int(epochs) if float(epochs).is_integer() else epochs


def sft_kwargs(rec: Recommendation, space_yaml: str) -> dict[str, Any]:
    """Keyword arguments of ``trl.SFTConfig``: TrainingArguments' plus max_length, packing
    (and assistant_only_loss where the space trains on the replies of chat records and the
    chat template marks them, see ``loss_note``; pad_to_multiple_of=max_seq_length where the
    trials padded every batch to it, as ``padded_to_max`` says)."""
    config = full_config(rec, space_yaml)
    kwargs = trainer_kwargs(rec, space_yaml) | knobs.sft_arguments(config)
    if _replies_only(rec, space_yaml):
        kwargs["assistant_only_loss"] = True
    if padded_to_max(config, space_yaml):
        # SFTTrainer's collator pads to the batch's longest sample: every sample is at most
        # max_length, so padding to a multiple of it pads each batch to it, as measured
        kwargs["pad_to_multiple_of"] = config["max_seq_length"]
    return kwargs


def _asks_replies(space_yaml: str) -> bool:
    space = space_of(space_yaml)
    return space is not None and space.workload.dataset.loss == "completion"


def _replies_only(rec: Recommendation, space_yaml: str) -> bool:
    """TRL's assistant_only_loss runs only with {% generation %} markers in the chat template:
    exported where the trial found them (or, for a trial recorded before that, where the
    space asks for it; ``loss_note`` then says what it needs)."""
    return _asks_replies(space_yaml) and rec.reply_markers is not False


def loss_note(rec: Recommendation, space_yaml: str) -> str | None:
    """What the sft export's loss is taken on, where the space asks for the replies only."""
    if not _asks_replies(space_yaml):
        return None
    if rec.reply_markers is None:
        return (
            "# assistant_only_loss needs {% generation %} ... {% endgeneration %} around the\n"
            "# assistant's reply in your chat template (TRL raises otherwise); without them,\n"
            "# drop it and the loss is taken on every token"
        )
    if rec.reply_markers:
        return "# loss on the assistant's replies only: your chat template marks them"
    measured = (
        "the trials measured this loss"
        if rec.loss_labels == "all"
        else "the trials masked the replies with sweeper's own labels, at the same speed"
    )
    return "\n".join(
        [
            "# loss on every token: the space asks for the replies only (loss: completion), but",
            "# your chat template has no {% generation %} markers, which TRL's",
            f"# assistant_only_loss needs (it raises without them); {measured}.",
            "# To train on the replies only: wrap the assistant's message in the template in",
            "# {% generation %} ... {% endgeneration %} and add assistant_only_loss=True.",
        ]
    )


def _header(rec: Recommendation) -> str:
    """What the export is: the study's recommended config, which trial measured it and what
    it measured, and how many trials it was picked from (a walk read "trial #3 of 12" as a
    count of trials, and could not tell a measured config from an estimate)."""
    trials = f"{rec.completed_trials} completed trial{'s' if rec.completed_trials != 1 else ''}"
    lines = [
        f"# sweeper's recommended config for study {rec.study!r}: trial #{rec.trial_number}, "
        f"as measured: {rec.throughput_text()}, {_hours(rec.hours_per_run)} h and "
        f"{money(rec.cost_per_run_usd)} per run on {rec.hardware_name} at "
        f"${rec.usd_per_hour:.2f}/h",
        f"# (picked among the study's {trials}, {rec.constraints})",
    ]
    if rec.measurements > 1 or rec.contended:  # what those figures are (sweeper.noise.Basis)
        lines.append(f"# its $/run, with its 95% interval: {rec.interval_text()}")
    if rec.tie_note:  # picked among configs that tie within the noise, and why this one
        lines.append(f"# it {rec.tie_note}")
    if rec.keeps_baseline:
        lines.append(
            f"# this is your baseline (trial #{rec.trial_number}): {rec.keep_baseline_text}"
        )
    elif rec.speedup_vs_baseline is not None and rec.usd_saved_per_run is not None:
        lines.append(
            f"# vs your baseline (trial #{rec.baseline_trial_number}): "
            f"{rec.speedup_vs_baseline:.2f}x faster, {money(rec.usd_saved_per_run)} saved per run"
        )
    lines += [f"# warning: {w}" for w in rec.warnings]
    return "\n".join(lines)


def _hours(hours: float | None) -> str:
    """Hours as ``sweeper best`` shows them (``cost.hours_figure``: a short CPU job's 0.031 h,
    not 0.0), '?' where not known."""
    return "?" if hours is None else hours_figure(hours)


def _call(name: str, kwargs: dict[str, Any], notes: dict[str, str] | None = None) -> str:
    """``name(key=value, ...)``, one keyword a line; ``notes``: a comment after a keyword."""
    notes = notes or {}
    arguments = "\n".join(
        f"    {key}={value!r}," + (f"  # {notes[key]}" if key in notes else "")
        for key, value in kwargs.items()
    )
    return f"{name}(\n{arguments}\n)"


def _notes(kwargs: dict[str, Any], space_yaml: str) -> dict[str, str]:
    """What a TrainingArguments/SFTConfig keyword stands for, where the number alone does not
    say it."""
    space = space_of(space_yaml)
    notes = {}
    if space is not None and "num_train_epochs" in kwargs:
        notes["num_train_epochs"] = (
            f"workload.epochs (of {space.workload.samples:,} samples): what the hours and "
            "$/run above price"
        )
    if "pad_to_multiple_of" in kwargs:
        notes["pad_to_multiple_of"] = (
            "every batch padded to max_length, as the trials padded theirs"
        )
    return notes


def _lines(config: dict[str, Any], place: str) -> str:
    """The knobs' own lines for ``place`` (``Knob.code``), each ended by a newline."""
    return "".join(f"{line}\n" for line in knobs.code_lines(config, place))


def _trainer(rec: Recommendation, space_yaml: str) -> str:
    config = full_config(rec, space_yaml)
    kwargs = trainer_kwargs(rec, space_yaml)
    data = data_lines(config, space_yaml, rec.loss_labels)  # packed or not, as the trials batched
    usage = (
        "# trainer = Trainer(model=model, args=training_args, train_dataset=dataset, "
        "data_collator=collate)\n# trainer.train()\n"
    )
    return _once(
        f"{_header(rec)}\n"
        + _launch_line(config)
        + "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n\n"
        + _model_lines(config, space_yaml, rec)
        + f"training_args = {_call('TrainingArguments', kwargs, _notes(kwargs, space_yaml))}\n"
        + _lines(config, "trainer")
        + data
        + usage
    )


def _launch_line(config: dict[str, Any]) -> str:
    """How the measured trial was launched, where it ran on several devices."""
    devices = config.get("devices") or 1
    if devices == 1:
        return ""
    return (
        f"# on {devices} devices, as measured: torchrun --standalone --nproc-per-node "
        f"{devices} train.py ({config.get('data_parallel')}); or accelerate launch "
        "--config_file accelerate.yaml train.py (sweeper export --format accelerate)\n"
    )


def _sft(rec: Recommendation, space_yaml: str) -> str:
    config = full_config(rec, space_yaml)
    note = loss_note(rec, space_yaml)
    kwargs = sft_kwargs(rec, space_yaml)
    return _once(
        f"{_header(rec)}\n"
        + _launch_line(config)
        + "from transformers import AutoModelForCausalLM\n"
        "from trl import SFTConfig, SFTTrainer\n\n"
        + _model_lines(config, space_yaml, rec)
        + (f"{note}\n" if note else "")
        + _lines(config, "sft")
        + f"sft_config = {_call('SFTConfig', kwargs, _notes(kwargs, space_yaml))}\n"
        + sft_data_lines(space_yaml, _replies_only(rec, space_yaml))
        + "# trainer = SFTTrainer(model=model, args=sft_config, train_dataset=dataset, "
        "processing_class=tokenizer)\n# trainer.train()\n"
    )


# over the parameters that train (a LoRA adapter's only), as the trial's optimizer
_OPTIMIZERS = {
    "adamw_torch": "torch.optim.AdamW(params, lr=LEARNING_RATE)",
    "adamw_torch_fused": "torch.optim.AdamW(params, lr=LEARNING_RATE, fused=True)",
    "adamw_8bit": "bitsandbytes.optim.AdamW8bit(params, lr=LEARNING_RATE)",
    "adafactor": "transformers.optimization.Adafactor(params, lr=LEARNING_RATE, "
    "scale_parameter=False, relative_step=False)",
}
# fp8: what is not a float8 Linear runs under bf16 autocast
_AUTOCAST = {"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp8": "torch.bfloat16"}


def loop_lines(
    config: dict[str, Any],
    learning_rate: float,
    device: str,
    adapter: AdapterSpec | None = None,
    epochs: float | None = None,
) -> str:
    """The training-loop side of the knobs (what TrainingArguments would do for a plain loop):
    ``prepare(model)`` returns the model and optimizer the trial measured: with ``adapter``,
    the LoRA adapter on the loaded model (its base quantized where the config says, see
    ``_dataloader``), and an optimizer over what trains."""
    devices = config.get("devices") or 1
    lines = []
    if devices > 1:
        lines += [
            f"# on {devices} devices: torchrun --standalone --nproc-per-node {devices} "
            "train.py; each rank calls",
            f"# torch.distributed.init_process_group({'nccl' if device != 'cpu' else 'gloo'!r})"
            " and reads its share of the data",
            "# (DataLoader(..., sampler=DistributedSampler(dataset, shuffle=True, seed=0, "
            "drop_last=True)))",
        ]
    lines += [
        f"LEARNING_RATE = {learning_rate!r}",
        f"ACCUMULATION_STEPS = {config['gradient_accumulation_steps']}  # batches per "
        "optimizer step",
    ]
    if epochs is not None:
        lines.append(f"EPOCHS = {epochs}  # workload.epochs: what the hours and $/run above price")
    lines += [
        "",
        "",
        "def prepare(model):",
        '    """The model and optimizer as measured (precision: see AUTOCAST)."""',
    ]
    if adapter is not None:
        lines += [f"    {line}".rstrip() for line in _adapter_lines(config, adapter, loop=True)]
    if config.get("tf32") and device == "cuda":
        lines += [
            "    torch.backends.cuda.matmul.allow_tf32 = True",
            "    torch.backends.cudnn.allow_tf32 = True",
        ]
    if config.get("gradient_checkpointing"):
        lines.append("    model.gradient_checkpointing_enable()")
    if config.get("optim") == "adamw_8bit":
        lines.append("    import bitsandbytes")
    if config.get("optim") == "adafactor":
        lines.append("    import transformers.optimization")
    lines += [f"    {line}".rstrip() for line in knobs.code_lines(config, "model")]
    lines += knobs.code_lines(config, "loop")
    lines += _data_parallel_lines(config.get("data_parallel") if devices > 1 else None, device)
    lines += [
        "    params = [p for p in model.parameters() if p.requires_grad]"
        + ("  # the adapter's" if adapter is not None else ""),
        f"    optimizer = {_OPTIMIZERS[config.get('optim') or 'adamw_torch']}",
    ]
    if config.get("compile_mode", "none") != "none":
        lines.append(f"    model = torch.compile(model, mode={config['compile_mode']!r})")
    lines.append("    return model, optimizer")
    dtype = _AUTOCAST.get(config.get("precision") or "fp32")
    lines += [
        "",
        "",
        "# each forward pass runs in `with AUTOCAST():`"
        + (
            " (and fp16 scales its loss with torch.amp.GradScaler)"
            if dtype == "torch.float16"
            else ""
        ),
        f"AUTOCAST = functools.partial(torch.autocast, {device if device != 'auto' else 'cuda'!r}, "
        f"dtype={dtype})"
        if dtype
        else "AUTOCAST = contextlib.nullcontext  # fp32",
    ]
    return "\n".join(lines) + "\n"


def _data_parallel_lines(strategy: str | None, device: str) -> list[str]:
    """How the measured trial wrapped the model on its ranks (before the optimizer: FSDP2's
    optimizer must see the sharded parameters)."""
    if strategy == "ddp":
        ids = "[int(os.environ['LOCAL_RANK'])]" if device != "cpu" else "None"
        return [f"    model = torch.nn.parallel.DistributedDataParallel(model, device_ids={ids})"]
    if strategy == "fsdp2":
        return [
            "    from torch.distributed.fsdp import fully_shard",
            "",
            "    for layer in model.model.layers:  # each decoder layer, then the rest",
            "        fully_shard(layer)",
            "    fully_shard(model)",
        ]
    if strategy in ("zero2", "zero3"):
        return [f"    # DeepSpeed ZeRO stage {strategy[-1]}: through accelerate's DeepSpeed plugin"]
    return []


def _loader_kwargs(config: dict[str, Any], space_yaml: str) -> dict[str, Any]:
    """The DataLoader keywords of the config's knobs, as the trials ran them."""
    kwargs = knobs.dataloader_arguments(config)
    if _device(space_yaml) != "cuda":
        kwargs["pin_memory"] = False  # pinning needs a GPU to copy to
    return kwargs


def _dataloader(rec: Recommendation, space_yaml: str) -> str:
    """sweeper's own engines: the data as they read it, their DataLoader and the loop's
    side of the knobs (``loop_lines``). A script's trials ran the script's own data code:
    ``_script_dataloader``."""
    config = full_config(rec, space_yaml)
    device = _device(space_yaml)
    space = space_of(space_yaml)
    if space is not None and space.workload.script is not None:
        return _script_dataloader(rec, config, space_yaml)
    kwargs = _loader_kwargs(config, space_yaml)
    # the loop engine's DataLoader dropped a short last batch, and the Trainer engines ran
    # dataloader_drop_last=True (sweeper.trial.workload.build_loader, engines.trainer)
    extra: dict[str, Any] = {"shuffle": True, "drop_last": True, "collate_fn": _Raw("collate")}
    arguments = {"dataset": _Raw("dataset"), **kwargs, **extra}
    where = data_lines(config, space_yaml, rec.loss_labels)  # packed blocks, or padded/flattened
    loading = ""
    if _quantized(config):
        loading = (
            "\n".join(_quantization_lines(config))
            + "\n# load the model with it, as the trial did: AutoModelForCausalLM.from_pretrained("
            "MODEL_ID,\n#     quantization_config=quantization, device_map={'': 0}), then "
            "prepare(model)\n\n"
        )
    return _once(
        f"{_header(rec)}\n"
        "import contextlib\n"
        "import functools\n"
        "import os\n\n"
        "import torch\n"
        "from torch.utils.data import DataLoader\n\n"
        + _lines(config, "loader")
        + f"{where}\n"
        + f"loader = {_call('DataLoader', arguments, _LOADER_NOTES)}\n\n"
        + loading
        + loop_lines(
            config,
            learning_rate(rec, space_yaml),
            device,
            adapter=None if space is None else space.workload.adapter,
            epochs=None if space is None else _epochs(space.workload),
        )
    )


_LOADER_NOTES = {"drop_last": "as the trials' DataLoader dropped a short last batch"}


def _script_dataloader(rec: Recommendation, config: dict[str, Any], space_yaml: str) -> str:
    """``engine: script``: only the DataLoader keywords the trials ran, for the script's own
    ``DataLoader(...)`` call. Its dataset, tokenizing, collate, shuffle and drop_last were
    measured as the script has them; sweeper's data code (``data_lines``) would be another
    pipeline at another speed, so none is written here."""
    kwargs = _loader_kwargs(config, space_yaml)
    notes = {name: "your script's own value, as it ran" for name in rec.own_values}
    unreached = [
        keyword
        for name in rec.unreached
        for keyword in knobs.KNOB[name].dataloader(config[name])
        if name in config and config[name] is not None
    ]
    for keyword in unreached:  # the config's value never ran: the script's own did, unseen
        kwargs.pop(keyword, None)
    named = {
        keyword: note
        for name, note in notes.items()
        if name in config and config[name] is not None
        for keyword in knobs.KNOB[name].dataloader(config[name])
    }
    lines = [
        _header(rec),
        "# the DataLoader keywords your script's trials ran: pass them to your own DataLoader,",
        "#     loader = DataLoader(dataset, **loader_kwargs, ...)",
        "# keeping your dataset, collate_fn, shuffle and drop_last as your script has them: its",
        "# own data code is what was measured (sweeper adds none, which would run at another",
        "# speed). The other knobs (accumulation, sequence length, precision, ...) and your",
        f"# command: sweeper export --study {rec.study} --format command",
    ]
    if unreached:
        lines.append(f"# not here: {', '.join(unreached)}: {UNREACHED_WHY}")
    lines.append(f"loader_kwargs = {_call('dict', kwargs, named)}")
    return "\n".join(lines) + "\n"


def _once(text: str) -> str:
    """``text`` with each top-level one-line import kept at its first place only: the model,
    data and loop parts of an export each import what they use.

    >>> _once("import torch\\nx = 1\\nimport torch\\n    import torch\\n")
    'import torch\\nx = 1\\n    import torch\\n'
    """
    seen: set[str] = set()
    kept = []
    for line in text.split("\n"):
        if line.startswith(("import ", "from ")) and not line.endswith("("):
            if line in seen:
                continue
            seen.add(line)
        kept.append(line)
    return "\n".join(kept)


PAGE_LABELS: dict[ExportFormat, str] = {
    "command": "command",
    "dataloader": "DataLoader keywords",
    "trainer": "TrainingArguments",
    "sft": "SFTConfig",
    "yaml": "YAML",
}


def page_label(fmt: ExportFormat, space_yaml: str) -> str:
    """The copy button's name of ``fmt``: a script's DataLoader export is the keywords alone,
    sweeper's loop engine's the DataLoader with its training loop."""
    space = space_of(space_yaml)
    if fmt == "dataloader" and (space is None or space.workload.script is None):
        return "DataLoader and loop"
    return PAGE_LABELS[fmt]


def page_formats(
    space_yaml: str, program_run: Mapping[str, Any] | None = None
) -> tuple[ExportFormat, ...]:
    """The exports that apply to a study, the first the one to paste: for sweeper's own
    engines TrainingArguments, SFTConfig and YAML (the engine's own first: SFTConfig for
    ``sft``, the DataLoader and loop for ``loop``); for a script of the user's, its command,
    then the TrainingArguments (SFTConfig first, where its knobs are SFTConfig's flags or its
    Trainer ran an SFTConfig: ``program_run``'s arguments) of a Trainer script, or the
    DataLoader keywords of a loop of its own. Which one the script is, its recorder said: a
    Trainer's reports its run (``program_run``: num_train_epochs, after TrainingArguments'
    defaults), a loop's ``sweeper.step`` no epochs.

    >>> page_formats("")  # no space to read: sweeper's own engines
    ('trainer', 'sft', 'yaml')
    """
    space = space_of(space_yaml)
    script = None if space is None else space.workload.script
    if script is None:  # the engine's own arguments first: what its trials ran
        engine = None if space is None else space.workload.engine
        if engine == "sft":
            return ("sft", "trainer", "yaml")
        if engine == "loop":
            return ("dataloader", "trainer", "sft", "yaml")
        return ("trainer", "sft", "yaml")
    if (program_run or {}).get("num_train_epochs") is None:
        return ("command", "dataloader", "yaml")
    # SFTConfig's flags, or an SFTTrainer script whatever its knobs form (its recorder said)
    if script.knobs == "sft_flags" or (program_run or {}).get("arguments") == "SFTConfig":
        return ("command", "sft", "trainer", "yaml")
    return ("command", "trainer", "yaml")


def study_formats(store: Store, rec: Recommendation, space_yaml: str) -> tuple[ExportFormat, ...]:
    """``page_formats`` of a recommendation: its trial's recorder said what the program is
    (``program_run``), for the page's buttons and `sweeper export`'s default alike."""
    winner = store.get_trial(rec.study, rec.trial_number)
    measured = (winner.measurement if winner is not None else None) or {}
    return page_formats(space_yaml, measured.get("program_run"))


def _command(rec: Recommendation, space_yaml: str) -> str:
    """``engine: script``: the user's own command with the winner's knobs in the form the
    trials gave them (TrainingArguments/SFTConfig flags), and the rest as the values the
    script was given through ``sweeper.trial_config()``."""
    import shlex

    space = space_of(space_yaml)
    script = None if space is None else space.workload.script
    if script is None:
        raise ConflictError(
            f"study {rec.study!r} does not train with a script of yours (workload.engine: "
            "script), so there is no command to export; use trainer, sft or dataloader"
        )
    config = full_config(rec, space_yaml)
    # the knobs your script ran at its own values were given to it by no flag in the trials:
    # none here either (a flag would override what it sets itself, and what ran)
    own = rec.own_values
    flagged = {name: value for name, value in config.items() if name not in own}
    from sweeper.trial.script import script_flags  # as a trial gave them

    flags = script_flags(script, flagged)
    command = list(script.command)
    launched: tuple[str, ...] = ()
    if accelerate_line.is_line(command):  # the launch says devices, precision, compile, DP
        try:
            command = accelerate_line.line_for(command, config)
        except ValueError as e:
            raise ConflictError(f"trial #{rec.trial_number} of study {rec.study!r}: {e}") from e
        launched = accelerate_line.OWNED
    else:  # the devices the winner ran on, as torchrun starts them (walk 003: it said none)
        command = launch_export.on_devices(command, device_count(config))
        launched = ("devices",)
    passed = {flag.removeprefix("--") for flag in flags[::2]}
    # the winner's flags replace the user's own of the same name (in a trial they came after
    # them, and the last one won): one --optim, not the user's and then the winner's
    words = [*_without(command, passed), *flags]
    # what the flags do not carry, the script read from trial_config(): the knobs the space
    # lists, and any other away from its default (a lever the space never searched, such as
    # liger_kernel: False, is not the script's business)
    assert space is not None
    from sweeper.trial.script import carried  # what the flags and the launch carry, as a trial

    given = carried(flagged, script)
    rest = {
        knob.name: value
        for knob in knobs.KNOBS
        if (value := config.get(knob.name)) is not None
        and knob.name not in given
        and knob.name not in launched
        and knob.name not in own
        and knob.name not in rec.unreached
        and (value != knob.default or knob.name in space.search.model_fields_set)
    }
    lines = [
        _header(rec).rstrip("\n"),
        f"# the command the trials ran{' (in ' + script.cwd + ')' if script.cwd else ''}, "
        "with the recommended knobs",
    ]
    if launched == accelerate_line.OWNED:
        lines.append(
            "# (accelerate launch's own options say the devices, precision, compile mode and "
            "data parallelism)"
        )
    if rest:
        lines.append(
            "# not flags: in the trials these reached your script only through "
            "sweeper.trial_config(); set them the way it does outside one:"
        )
        lines += [f"#   {name}: {value}" for name, value in rest.items()]
    if rec.unreached:
        lines.append(
            f"# not here: {', '.join(rec.unreached)}, so nothing here changes them: {UNREACHED_WHY}"
        )
    if own:
        lines.append(
            "# your script's own values (no flag and no sweeper.trial_config() set them; the "
            "trials ran them and were measured with them), unchanged:"
        )
        lines += [f"#   {name}: {value}" for name, value in own.items()]
    threads = _thread_env(rec, device_count(config))
    if threads:  # said, not prefixed: the last line stays the command (its words run as is)
        lines.append(
            f"# the trials ran with {' '.join(threads)} in their environment, and the CPU "
            f"threads change the speed: run `export {' '.join(threads)}` first"
        )
    return "\n".join(lines) + "\n" + shlex.join(words) + "\n"


def _thread_env(rec: Recommendation, devices: int) -> list[str]:
    """``NAME=value`` for the thread variables the winning trial started with that its
    exported line would not give it: all of them, except the OMP_NUM_THREADS=1 torchrun sets
    itself on several processes."""
    import shlex

    return [
        f"{name}={shlex.quote(value)}"
        for name, value in rec.thread_env.items()
        if not (name == "OMP_NUM_THREADS" and value == "1" and devices > 1)
    ]


def _without(command: list[str], names: set[str]) -> list[str]:
    """``command`` less its ``--name value``, ``--name=value`` and bare ``--name`` words for
    each of ``names``.

    >>> _without(["python", "t.py", "--optim", "sgd", "--bf16", "--lr", "1", "--tf32=True"],
    ...          {"optim", "bf16", "tf32"})
    ['python', 't.py', '--lr', '1']
    """
    kept: list[str] = []
    index = 0
    while index < len(command):
        word = command[index]
        index += 1
        name, eq, _ = word.removeprefix("--").partition("=")
        if not word.startswith("--") or name not in names:
            kept.append(word)
        elif not eq and index < len(command) and not command[index].startswith("--"):
            index += 1  # its value
    return kept


class _Raw(str):
    """A name written as is in a generated call (not quoted)."""

    def __repr__(self) -> str:
        return str(self)


def render(rec: Recommendation, fmt: ExportFormat, space_yaml: str) -> str:
    """The recommendation in ``fmt``; ConflictError when its stored config lacks a knob that
    every config must set (a study recorded by an older sweeper)."""
    if fmt == "json":
        return rec.model_dump_json(indent=2) + "\n"
    if fmt == "accelerate":  # accelerate launch's config file (sweeper.launch_export)
        from sweeper.launch_export import accelerate_config_yaml

        header = _header(rec).removeprefix("# ")
        space = space_of(space_yaml)
        # a script's trials ran the user's own line: `export --format command` gives it
        launched = (
            None
            if space is None or space.workload.script is None
            else f"your command with the winner's options: sweeper export --study {rec.study} "
            "--format command"
        )
        return accelerate_config_yaml(
            rec.config, device=_device(space_yaml), header=header, launched=launched
        )
    missing = [k.name for k in knobs.KNOBS if k.required and k.name not in rec.config]
    if missing:
        raise ConflictError(
            f"trial #{rec.trial_number} of study {rec.study!r} was stored without "
            f"{', '.join(missing)} (an older sweeper's record): it cannot be exported as "
            f"{fmt}; measure the config again, or export it as json"
        )
    if fmt == "yaml":
        document = {
            "study": rec.study,
            "trial": rec.trial_number,
            # paste as `baseline:` into a space file to compare a later sweep against it
            "config": {k: v for k, v in full_config(rec, space_yaml).items() if v is not None},
            "per_run": {
                "hours": rec.hours_per_run,
                "usd": rec.cost_per_run_usd,
                "usd_per_hour": rec.usd_per_hour,
            },
            "measured": {"samples_per_s": rec.samples_per_s, "tokens_per_s": rec.tokens_per_s},
        }
        return yaml.safe_dump(document, sort_keys=False)
    if fmt == "trainer":
        return _trainer(rec, space_yaml)
    if fmt == "sft":
        return _sft(rec, space_yaml)
    if fmt == "dataloader":
        return _dataloader(rec, space_yaml)
    if fmt == "command":
        return _command(rec, space_yaml)
    raise ValueError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
