"""The knob values a user's own command already says: what a script trial runs for a knob the
space does not list.

A script trial is worth what it shares with the user's run, and the command is the run's. A
knob left out of ``search:`` would otherwise take sweeper's default, which the trial then says
in the command's own form after the user's words (``--bf16 False`` after their ``--bf16
True``; on an accelerate line, ``--mixed_precision no`` in place of their ``bf16``): every
trial would measure a run the user does not do. So for each knob the space does not list, the
value the command gives it is its one value (the space's ``_command_knobs``), and the sweep
says so (``describe``):

- flags in HfArgumentParser's form (``--per_device_train_batch_size 8``,
  ``--per_device_train_batch_size=8``, a bare ``--bf16``), read as each knob writes them
  (``Knob.trainer``, ``Knob.sft``), whatever ``knobs:`` says (the command's own flags reach
  the program either way): the value whose flags the command gives, none contradicted; where
  two values write the same flags (bf16 and fp8 both say ``--bf16 True``), the first the knob
  lists;
- an accelerate launch line's ``--mixed_precision``, ``--dynamo_backend``/``--dynamo_mode`` and
  ``--multi_gpu``/``--use_fsdp --fsdp_version 2``, or its config file's ``mixed_precision``,
  ``dynamo_config`` and ``distributed_type`` (MULTI_GPU, FSDP with
  ``fsdp_config.fsdp_version``): the file its ``--config_file`` names, else the default file
  ``accelerate config`` writes (``default_config_file``), as ``accelerate launch`` reads them;
  FSDP1 is no value of the data_parallel knob, so it is left to the knob's default.

A script whose arguments are TRL's SFTConfig (``knobs: sft_flags``) runs SFTConfig's own
defaults where its command is silent, not TrainingArguments': ``gradient_checkpointing=True``
and ``bf16=True`` unless ``--fp16`` says otherwise (``SFT_DEFAULTS``). The precision that runs
is TrainingArguments' reading of them: ``--bf16``/``--fp16`` True (SFTConfig's default bf16
included) beat the launcher's ``ACCELERATE_MIXED_PRECISION``, which counts only where both are
False, so an accelerate config's ``mixed_precision: 'no'`` under an SFTConfig script trains bf16.

Under ``knobs: env`` the command gives no knob, so a knob ``search:`` leaves out runs at the
script's own value unless it takes it from ``sweeper.trial_config()``; which value that is, the
words cannot tell (an SFTConfig built in the script, its own defaults): the trial reads it back
from what ran and records it (``sweeper.trial.script.owned``), and the sweep says so.

Read from the words alone, without the program's parser: a flag spelled otherwise, or a value
the script sets in its code, is not seen (list the knob in ``search:`` to be sure).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from sweeper import knobs
from sweeper.trial import accelerate_line

# knobs that are the trial's layout, not the program's settings (devices, data parallelism:
# the device pool and the launch say them: ``_launch_devices``) or that no flag writes
_NOT_FROM_FLAGS = ("devices", "data_parallel")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
_DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")
# the launch option that says each launch-owned knob (in the sweep's note)
_OPTION = {"precision": "mixed_precision", "compile_mode": "dynamo_backend"}
# TRL's SFTConfig's defaults that differ from TrainingArguments' for a knob (its docstring's
# note, TRL >= 1.0): what a script parsing SFTConfig runs where its command says nothing
SFT_DEFAULTS: dict[str, tuple[Any, str]] = {
    "gradient_checkpointing": (True, "SFTConfig's default gradient_checkpointing=True"),
    "precision": ("bf16", "SFTConfig's default bf16=True"),
}
_SFT_FIELD = {"gradient_checkpointing": "gradient_checkpointing", "precision": "bf16"}


def flags_of(words: Sequence[str]) -> dict[str, str]:
    """``--name value``, ``--name=value`` and a bare ``--name`` (``"true"``) pairs, by name.

    >>> flags_of(["python", "train.py", "--bf16", "--lr=1e-4", "--per_device_train_batch_size",
    ...           "8", "--tf32", "False"])
    {'bf16': 'true', 'lr': '1e-4', 'per_device_train_batch_size': '8', 'tf32': 'False'}
    """
    said: dict[str, str] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if not word.startswith("--") or word == "--":
            continue
        name, eq, value = word[2:].partition("=")
        if not eq:
            following = words[index] if index < len(words) else None
            if following is None or following.startswith("--"):
                value = "true"  # HfArgumentParser: a bool field's flag alone is True
            else:
                value, index = following, index + 1
        said[name] = value
    return said


def _same(given: str, value: Any) -> bool:
    if isinstance(value, bool):
        return given.lower() in (_TRUE if value else _FALSE)
    return given == str(value)


def _from_flags(knob: knobs.Knob, flags: Mapping[str, str]) -> Any:
    def written(value: Any) -> dict[str, Any]:
        try:
            return {**knob.trainer(value), **knob.sft(value)}
        except (TypeError, ValueError, KeyError):
            return {}

    choices = knob.choices()
    if choices is None:  # an open type (an int): the one flag it writes, read as its type
        keys = list(written(1))
        if len(keys) != 1 or keys[0] not in flags:
            return None
        return _open_value(knob, flags[keys[0]])
    best, best_count = None, 0
    for value in choices:
        given = {key: v for key, v in written(value).items() if key in flags}
        if any(isinstance(v, dict) for v in given.values()):
            continue
        agrees = given and all(_same(flags[key], v) for key, v in given.items())
        if agrees and len(given) > best_count:  # ties: the first listed (bf16 before fp8)
            best, best_count = value, len(given)
    return best


def default_config_file(environ: Mapping[str, str] | None = None) -> Path:
    """The file ``accelerate launch`` reads when its line names none: the one ``accelerate
    config`` writes (accelerate's ``config_args.default_config_file``: ``$HF_HOME``, else
    ``$XDG_CACHE_HOME/huggingface``, else ``~/.cache/huggingface``, then
    ``accelerate/default_config.yaml``). The trial's program runs with the sweep's environment,
    so its accelerate reads this same file.

    >>> str(default_config_file({"HF_HOME": "/data/hf"}))
    '/data/hf/accelerate/default_config.yaml'
    """
    env = os.environ if environ is None else environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(os.path.expanduser(home)) / "accelerate" / "default_config.yaml"


def _launch_options(
    command: Sequence[str], environ: Mapping[str, str] | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """An accelerate line's own options, its config file's beneath them (the file the line
    names, or accelerate's default file where it names none and is not ``--cpu``, as
    ``accelerate launch`` reads them), and the file each option that is the file's came from."""
    words = list(command)
    spans, program = accelerate_line._spans(words)
    said: dict[str, str] = {}
    line = flags_of(words[2:program])
    config_file = spans.get("config_file")
    path: str | None = None
    if config_file is not None:
        start, end = config_file
        path = words[start].partition("=")[2] if end == start + 1 else words[start + 1]
    elif line.get("cpu", "false").lower() not in _TRUE:
        default = default_config_file(environ)
        path = str(default) if default.is_file() else None
    if path is not None:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            loaded = None  # the trial reads it with accelerate's parser, and says what is wrong
        if isinstance(loaded, dict):
            if loaded.get("mixed_precision") is not None:
                said["mixed_precision"] = str(loaded["mixed_precision"])
            fsdp = loaded.get("fsdp_config")
            if loaded.get("distributed_type") == "FSDP" and isinstance(fsdp, dict):
                said["use_fsdp"] = "true"
                said["fsdp_version"] = str(fsdp.get("fsdp_version", 1))
            elif loaded.get("distributed_type") == "MULTI_GPU":
                said["multi_gpu"] = "true"
            if loaded.get("num_processes") is not None:
                said["num_processes"] = str(loaded["num_processes"])
            dynamo = loaded.get("dynamo_config")
            if isinstance(dynamo, dict):
                for key in ("dynamo_backend", "dynamo_mode"):
                    if dynamo.get(key) is not None:
                        said[key] = str(dynamo[key])
    return said | line, {key: str(path) for key in said if key not in line}


def _from_launch(options: Mapping[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    mixed = {v: k for k, v in accelerate_line._MIXED.items() if k != "fp8"}
    if options.get("mixed_precision", "").lower() in mixed:
        found["precision"] = mixed[options["mixed_precision"].lower()]
    if options.get("use_fsdp", "").lower() in _TRUE:
        if options.get("fsdp_version") == "2":  # FSDP1 is no value of the knob: left to it
            found["data_parallel"] = "fsdp2"
    elif options.get("multi_gpu", "").lower() in _TRUE:
        found["data_parallel"] = "ddp"
    backend = options.get("dynamo_backend")
    if backend is not None:
        if backend.lower() == "no":
            found["compile_mode"] = "none"
        elif backend.lower() == "inductor":
            mode = options.get("dynamo_mode", "default").lower()
            if mode in _DYNAMO_MODES:
                found["compile_mode"] = mode
    return found


def said(command: Sequence[str], form: str) -> dict[str, tuple[Any, str]]:
    """Each knob the command gives a value, with the words that say it.

    >>> said(["accelerate", "launch", "--mixed_precision", "bf16", "train.py",
    ...       "--per_device_train_batch_size", "8", "--gradient_checkpointing"], "flags")
    ... # doctest: +NORMALIZE_WHITESPACE
    {'per_device_batch_size': (8, '--per_device_train_batch_size 8'),
     'gradient_checkpointing': (True, '--gradient_checkpointing true'),
     'precision': ('bf16', 'accelerate --mixed_precision bf16')}
    """
    found: dict[str, tuple[Any, str]] = {}
    words = list(command)
    launch: dict[str, Any] = {}
    options: dict[str, str] = {}
    files: dict[str, str] = {}
    if accelerate_line.is_line(words):
        options, files = _launch_options(words)
        launch = _from_launch(options)
        words = words[accelerate_line._spans(words)[1] :]
    flags = flags_of(words)
    for knob in knobs.KNOBS:
        if knob.name in _NOT_FROM_FLAGS:
            continue
        if form == "sft_flags" and knob.name in SFT_DEFAULTS and _SFT_FIELD[knob.name] not in flags:
            value, why = _sft_default(knob.name, flags)
            found[knob.name] = (value, why)
            continue
        value = _from_flags(knob, flags)
        own = _own_parser_flag(knob, flags) if value is None else None
        if own is not None:  # a flag of the script's own parser (--max_seq_length 1536)
            found[knob.name] = own
            continue
        # the launch's precision counts only where the arguments' bf16 and fp16 are False
        # (TrainingArguments reads ACCELERATE_MIXED_PRECISION, then either flag over it)
        if value is None or (knob.name in launch and not _overrides_launch(knob.name, value)):
            continue
        launch.pop(knob.name, None)
        keys = [k for k in {**knob.trainer(value), **knob.sft(value)} if k in flags]
        found[knob.name] = (value, " ".join(f"--{k} {flags[k]}" for k in keys))
    devices = _launch_devices(list(command), options, files)
    if devices is not None:
        found["devices"] = devices
    for name, value in launch.items():
        option = _OPTION.get(name) or ("use_fsdp" if value == "fsdp2" else "multi_gpu")
        if option in files:  # the config file's, not the line's: said in the file's words
            shown = {
                "use_fsdp": "distributed_type FSDP, fsdp_version 2",
                "multi_gpu": "distributed_type MULTI_GPU",
                "dynamo_backend": f"dynamo_backend {options[option]}",
            }.get(option, f"{option} {options[option]}")
            shown = f"{shown} in accelerate's config file {files[option]}"
        else:
            shown = f"accelerate --{option} {options[option]}"
        if name in found:  # SFTConfig's default precision runs over the launch's
            if found[name][0] != value:
                found[name] = (found[name][0], f"{found[name][1]}, over {shown}")
            continue
        found[name] = (value, shown)
    return found


def _launch_devices(
    words: list[str], options: Mapping[str, str], files: Mapping[str, str]
) -> tuple[int, str] | None:
    """The processes the command's launcher starts, one per device: torchrun's
    ``--nproc-per-node N`` (``--nproc_per_node``), accelerate's ``--num_processes N`` (or its
    config file's). A walk's ``torchrun --nproc_per_node 2`` line with no ``search.devices``
    ran and was priced as one process, unsaid. None: not said, or not a count (``auto``)."""
    from sweeper.space_script import script_of
    from sweeper.trial.launch_line import launcher

    said_by = launcher(words)
    if said_by == "torchrun":
        found = script_of(words)
        flags = flags_of(words[: found[0]] if found else words)
        for name in ("nproc-per-node", "nproc_per_node"):
            if flags.get(name, "").isdigit() and int(flags[name]) >= 1:
                return int(flags[name]), f"torchrun --{name} {flags[name]}"
        return None
    count = options.get("num_processes", "")
    if said_by == "accelerate" and count.isdigit() and int(count) >= 1:
        where = (
            f"num_processes {count} in accelerate's config file {files['num_processes']}"
            if "num_processes" in files
            else f"accelerate --num_processes {count}"
        )
        return int(count), where
    return None


def _own_parser_flag(knob: knobs.Knob, flags: Mapping[str, str]) -> tuple[Any, str] | None:
    """The value a flag of the script's own parser gives ``knob`` (``knobs.OWN_PARSER_FLAGS``:
    ``--max_seq_length 1536`` of a dataclass of the user's), with its words; None when the
    command says none, or one that is no value of the knob.

    >>> _own_parser_flag(knobs.KNOB["max_seq_length"], {"max_seq_length": "1536"})
    (1536, '--max_seq_length 1536')
    >>> _own_parser_flag(knobs.KNOB["max_seq_length"], {"max_seq_length": "4"}) is None
    True
    """
    for name in knobs.OWN_PARSER_FLAGS.get(knob.name, ()):
        if name in flags:
            value = _open_value(knob, flags[name])
            return None if value is None else (value, f"--{name} {flags[name]}")
    return None


def _open_value(knob: knobs.Knob, text: str) -> Any:
    """``text`` as a value of open-typed (int) ``knob``, or None when it is none."""
    try:
        return TypeAdapter(knob.value_type).validate_python(int(text))
    except (ValueError, ValidationError):
        return None


def _overrides_launch(name: str, value: Any) -> bool:
    """Whether a flag-given ``value`` of knob ``name`` runs over an accelerate line's option:
    only a precision whose bf16 or fp16 flag is True does (TrainingArguments' mixed precision)."""
    return name == "precision" and value != "fp32"


def _sft_default(name: str, flags: Mapping[str, str]) -> tuple[Any, str]:
    """SFTConfig's own value of knob ``name``, whose field (``_SFT_FIELD``) the command's
    flags do not give: its default, but for precision, fp16 where ``--fp16`` is True
    (SFTConfig's bf16 is ``not fp16``)."""
    if name == "precision" and flags.get("fp16", "false").lower() in _TRUE:
        return "fp16", f"--fp16 {flags['fp16']}"
    return SFT_DEFAULTS[name]


# knobs: env gives the program no flag: what search: leaves out is the program's own
_ENV_NOTE = (
    "knobs: env: a knob search: does not list runs at your script's own value (its "
    "TrainingArguments' or SFTConfig's default, say) unless the script takes it from "
    "sweeper.trial_config(); each trial reads back what ran and records that"
)


def describe(command: Sequence[str], form: str, search: Any) -> str | None:
    """The sweep's note on the knobs that run at the command's values, and under ``knobs:
    env`` on those that run at the script's own (None: nothing to say)."""
    taken = [
        f"{name} {value} ({words})"
        for name, (value, words) in said(command, form).items()
        if list(search.values(name)) == [value]
    ]
    notes = [_ENV_NOTE] if form == "env" else []
    if taken:
        notes.insert(
            0,
            "from your command: "
            + ", ".join(taken)
            + " (search: does not list them, so every trial runs your run's values; list one "
            "there to search it)",
        )
    return "\n".join(notes) or None


def epochs_note(command: Sequence[str], form: str, epochs: float) -> str | None:
    """What to say when the command says it trains another run than the one the space prices:
    ``--num_train_epochs`` other than ``workload.epochs``, or ``--max_steps`` (that many
    steps whatever the epochs), while hours and $/run are for ``workload.epochs`` of
    ``workload.samples``. From the words only, under ``knobs: flags``/``sft_flags``: a command
    silent on both trains its program's own default (TrainingArguments' 3 epochs, a loop's
    own), which the words cannot tell (None then, and when they agree).

    >>> epochs_note(["python", "train.py", "--num_train_epochs", "2"], "flags", 2.0) is None
    True
    >>> epochs_note(["python", "train.py"], "flags", 1.0) is None
    True
    >>> epochs_note(["python", "t.py", "--num_train_epochs=3"], "flags", 1.0)[:63]
    'your command trains 3 epochs (--num_train_epochs=3), and the sp'
    >>> "set workload.epochs: 3 if" in epochs_note(["--num_train_epochs", "3"], "flags", 1.0)
    True
    >>> epochs_note(["python", "t.py", "--max_steps", "500"], "sft_flags", 1.0)[:54]
    'your command trains --max_steps 500 optimizer steps, w'
    """
    if form not in ("flags", "sft_flags"):
        return None
    flags = flags_of(command)
    try:
        max_steps = int(flags.get("max_steps", "-1"))
    except ValueError:
        max_steps = -1
    if max_steps > 0:
        return (
            f"your command trains --max_steps {max_steps} optimizer steps, whatever its epochs, "
            f"and the space prices workload.epochs {epochs:g} of workload.samples: the hours "
            f"and $/run are for that, not for {max_steps} steps"
        )
    given = flags.get("num_train_epochs")
    try:
        trained = float(given) if given is not None else epochs
    except ValueError:
        return None
    if abs(trained - epochs) < 1e-9:
        return None
    return (
        f"your command trains {trained:g} epochs (--num_train_epochs={given}), and the space "
        f"prices workload.epochs {epochs:g}: each hour and $/run figure is for {epochs:g} "
        f"epoch{'' if epochs == 1 else 's'}; set workload.epochs: {trained:g} if your run "
        f"trains {trained:g}"
    )


# a run-length flag of a program's own parser (TrainingArguments' --num_train_epochs is read
# from its running Trainer instead: sweeper.caveats.program_run_warnings)
OWN_EPOCH_FLAGS = ("epochs", "num_epochs", "n_epochs")


def own_epochs_note(command: Sequence[str], epochs: float) -> str | None:
    """What to say where the command gives its own parser's epochs (``--epochs 20``) other
    than the ``workload.epochs`` that hours and $/run price: the trials ran the command as
    it is (a trial ends the program once it has measured, whatever its length), and its
    export keeps the words (a walk lengthened its trials' runs so, and was handed
    ``--epochs 20`` back beside a price for 1).

    >>> own_epochs_note(["python", "t.py", "--epochs", "20"], 1.0)[:47]
    'your command says --epochs 20, and hours and $/'
    >>> own_epochs_note(["python", "t.py", "--epochs=1"], 1.0) is None
    True
    """
    flags = flags_of(command)
    name = next((n for n in OWN_EPOCH_FLAGS if n in flags), None)
    if name is None:
        return None
    try:
        said = float(flags[name])
    except ValueError:
        return None
    if math.isclose(said, epochs):
        return None
    return (
        f"your command says --{name} {flags[name]}, and hours and $/run price workload.epochs "
        f"{epochs:g}: the exported command keeps --{name} {flags[name]} as the trials ran it "
        "(a trial ends your program once it has measured, whatever its length); give your "
        f"real run the epochs it trains, or set workload.epochs: {said:g} if it trains {said:g}"
    )


def checkpoint_note(command: Sequence[str], form: str, save_steps: int | None) -> str | None:
    """What to say when the command saves checkpoints otherwise than the space prices them
    (``workload.checkpoint.save_steps``): ``--save_strategy no`` against a priced save, or
    ``--save_steps`` at another interval. From the words only, under ``knobs: flags``/
    ``sft_flags``; a command silent on both saves at its program's default (TrainingArguments'
    every 500 steps), which the words cannot tell. A walk's script said ``--save_strategy
    no`` and $/run still counted a save every 500 steps.

    >>> checkpoint_note(["python", "t.py", "--save_strategy", "no"], "flags", 500)[:62]
    'your command saves no checkpoint (--save_strategy no), and the'
    >>> checkpoint_note(["python", "t.py", "--save_strategy", "no"], "flags", None) is None
    True
    >>> "set workload.checkpoint.save_steps: 200" in checkpoint_note(
    ...     ["t.py", "--save_steps=200"], "sft_flags", 500)
    True
    >>> checkpoint_note(["t.py", "--save_steps", "500"], "flags", 500) is None
    True
    >>> checkpoint_note(["t.py", "--save_strategy", "epoch"], "flags", 500)[:61]
    'your command saves a checkpoint each epoch (--save_strategy e'
    """
    if form not in ("flags", "sft_flags"):
        return None
    flags = flags_of(command)
    strategy = flags.get("save_strategy", "steps").lower()
    priced = (
        "prices no save (workload.checkpoint.save_steps: null)"
        if save_steps is None
        else f"prices a save every {save_steps} optimizer steps (workload.checkpoint.save_steps)"
    )
    if strategy == "no":
        if save_steps is None:
            return None
        return (
            f"your command saves no checkpoint (--save_strategy no), and the space {priced}: "
            "each $/run counts saves your run never makes; set workload.checkpoint.save_steps: "
            "null if it saves none"
        )
    if strategy == "epoch":
        return (
            f"your command saves a checkpoint each epoch (--save_strategy epoch), and the space "
            f"{priced}: set workload.checkpoint.save_steps to your steps per epoch to price "
            "what it saves"
        )
    given = flags.get("save_steps")
    if given is None:
        return None
    try:
        every = int(float(given))
    except ValueError:
        return None
    if every <= 0 or every == save_steps:
        return None
    return (
        f"your command saves a checkpoint every {every} optimizer steps (--save_steps "
        f"{given}), and the space {priced}: set workload.checkpoint.save_steps: {every} to "
        "price what your run saves"
    )


def short_run(
    command: Sequence[str],
    form: str,
    samples: int,
    rows_per_step: int,
    warmup: Any,
    measure: Any,
) -> tuple[str, bool] | None:
    """Whether the command's own run (``--max_steps``, else ``--num_train_epochs`` of
    ``samples`` rows, TrainingArguments' 3 when silent) has fewer optimizer steps than a trial
    of ``rows_per_step`` rows a step (batch × accumulation × devices) measures: (what to say,
    whether every trial must end first) or None. A trial ends the program once it has
    measured, but cannot make a run longer than the program makes it. Under ``knobs:
    flags``/``sft_flags`` only: another program's length is its own.

    >>> from sweeper.space_trial import MeasureSettings, WarmupSettings
    >>> w, m = WarmupSettings(max_steps=10), MeasureSettings(min_steps=4)
    >>> short_run(["python", "t.py", "--num_train_epochs", "1"], "flags", 200, 16, w, m)[1]
    False
    >>> short_run(["python", "t.py", "--max_steps", "6"], "flags", 200, 16, w, m)[1]
    True
    >>> short_run(["python", "t.py"], "flags", 200, 16, w, m) is None  # 3 epochs: 39 steps
    False
    >>> short_run(["python", "t.py"], "flags", 2000, 16, w, m) is None
    True
    """
    if form not in ("flags", "sft_flags"):
        return None
    flags = flags_of(command)
    try:
        max_steps = int(flags.get("max_steps", "-1"))
        epochs = float(flags.get("num_train_epochs", "3"))
    except ValueError:
        return None
    if max_steps > 0:
        steps, how = max_steps, f"--max_steps {max_steps}"
    else:
        steps = math.ceil(math.ceil(samples / rows_per_step) * epochs)
        how = (
            f"{epochs:g} epoch{'' if epochs == 1 else 's'} of {samples} samples at "
            f"{rows_per_step} rows a step"
        )
    at_least = warmup.min_steps + max(
        measure.min_steps, math.ceil(measure.warmup_multiple * warmup.min_steps)
    )
    at_most = warmup.max_steps + max(
        measure.min_steps, math.ceil(measure.warmup_multiple * warmup.max_steps)
    )
    if steps >= at_most:
        return None
    fix = (
        "train longer in workload.script.command (--num_train_epochs, --max_steps: a trial "
        "ends the program once it has measured) or measure fewer steps (trial.warmup, "
        "trial.measure)"
    )
    if steps < at_least:
        return (
            f"workload.script.command: your run trains {steps} optimizer steps ({how}) and a "
            f"trial needs at least {at_least} (burn-in at least {warmup.min_steps}, then the "
            f"timed window): every such trial would end before it is measured; {fix}",
            True,
        )
    return (
        f"your command's own run trains {steps} optimizer steps ({how}); a trial needs "
        f"{at_least} to {at_most} (burn-in until steady, up to {warmup.max_steps}, then the "
        f"timed window): one whose burn-in runs long ends before it is measured; {fix}",
        False,
    )
