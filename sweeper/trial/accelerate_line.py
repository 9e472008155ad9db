"""The knobs an ``accelerate launch`` line owns: precision, torch.compile and the data-parallel
strategy are launch options there, so a trial sets them on the launch, not on the program.

Each knob's value becomes accelerate launch's own option, whatever the line (or its
``--config_file``) says, as ``devices`` becomes its ``--num_processes``; the trial's log says
where it differs from the line:

==============  ==========================================================================
knob            accelerate launch
==============  ==========================================================================
precision       ``--mixed_precision``: fp32 ``no``, bf16 ``bf16``, fp16 ``fp16``, fp8 ``fp8``
                with ``--fp8_backend ao`` (torchao's float8 training, which sweeper's fp8
                is; a line's ``te`` or ``msamp`` backend is another recipe: refused)
compile_mode    ``--dynamo_backend inductor --dynamo_mode MODE`` (none: ``--dynamo_backend
                no``); max-autotune-no-cudagraphs is no ``--dynamo_mode``: refused
data_parallel   ddp: ``--multi_gpu``; fsdp2: ``--use_fsdp --fsdp_version 2
                --fsdp_reshard_after_forward true`` (FSDP2's full sharding), wrapping each
                decoder layer where the line names no wrap policy; zero2/zero3: refused
                (DeepSpeed's launcher is not torchrun's, which sweeper starts)
==============  ==========================================================================

The trial sets them on the line as accelerate's parser read it (``apply``), before its
launcher's environment is made; the export rewrites the user's own words (``line_for``), keeping
their spelling of each option. Under ``knobs: flags`` these knobs are not also appended as
TrainingArguments flags (``--bf16``, ``--torch_compile``, ``--fsdp``): the program's
``Accelerator`` (a Trainer's too) takes them from the launch, and a loop's own parser need not
know them. ``knobs: sft_flags`` still says them, as TRL's SFTConfig turns bf16 on unless told
otherwise, which would override the launch. What ran is read back either way: a program that
ignores the launch's precision fails as a mismatch.

No torch here: the export (controller side) rewrites the words without accelerate.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

OWNED = ("precision", "compile_mode", "data_parallel")

_MIXED = {"fp32": "no", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}
_DYNAMO_MODES = ("default", "reduce-overhead", "max-autotune")  # accelerate's --dynamo_mode
_WRAP = "TRANSFORMER_BASED_WRAP"  # each decoder layer (the model's _no_split_modules)

# accelerate launch's options that take no value (accelerate 1.15's parser; a test checks it)
FLAGS = frozenset(
    {
        "cpu", "debug", "downcast_bf16", "dynamo_use_dynamic", "dynamo_use_fullgraph",
        "dynamo_use_regional_compilation", "enable_cpu_affinity", "fp8_use_autocast_during_eval",
        "help", "module", "multi_gpu", "no_python", "no_tpu_cluster", "quiet", "same_network",
        "tpu", "tpu_cluster", "tpu_use_sudo", "use_deepspeed", "use_fsdp", "use_megatron_lm",
        "use_parallelism_config",
    }
)  # fmt: skip
_SHORT = {"-m": "module", "-q": "quiet", "-h": "help"}


def is_line(command: list[str]) -> bool:
    """Whether ``command`` is an ``accelerate launch`` line."""
    return Path(command[0]).name == "accelerate" and command[1:2] == ["launch"]


def flag_config(script: Any, config: dict[str, Any]) -> dict[str, Any]:
    """The config whose knobs a script's flags say (``workload.script``): on an accelerate
    line under ``knobs: flags``, none of those the launch says (``OWNED``)."""
    if not is_line(list(script.command)) or script.knobs != "flags":
        return config
    return {name: None if name in OWNED else value for name, value in config.items()}


def options(config: Mapping[str, Any]) -> dict[str, Any]:
    """The accelerate launch options (its parser's names) that ``config``'s knobs set; a
    ValueError says why a value has none.

    >>> options({"precision": "bf16", "compile_mode": "none", "data_parallel": "fsdp2"})
    ... # doctest: +NORMALIZE_WHITESPACE
    {'mixed_precision': 'bf16', 'dynamo_backend': 'no', 'use_fsdp': True, 'multi_gpu': False,
     'fsdp_version': '2', 'fsdp_reshard_after_forward': 'true'}
    """
    said: dict[str, Any] = {}
    precision = config.get("precision")
    if precision is not None:
        said["mixed_precision"] = _MIXED[precision]
    mode = config.get("compile_mode")
    if mode == "none":
        said["dynamo_backend"] = "no"
    elif mode is not None:
        if mode not in _DYNAMO_MODES:
            raise ValueError(
                f"compile_mode {mode}: accelerate launch's --dynamo_mode takes "
                f"{', '.join(_DYNAMO_MODES)}; leave {mode} out of search.compile_mode for an "
                "accelerate line, or compile in the script (knobs: env)"
            )
        said |= {"dynamo_backend": "inductor", "dynamo_mode": mode}
    strategy = config.get("data_parallel")
    if strategy == "ddp":
        said |= {"multi_gpu": True, "use_fsdp": False}
    elif strategy == "fsdp2":
        said |= {"use_fsdp": True, "multi_gpu": False, "fsdp_version": "2",
                 "fsdp_reshard_after_forward": "true"}  # fmt: skip
    elif strategy is not None:
        raise ValueError(
            f"data_parallel {strategy}: an accelerate line runs ZeRO with --use_deepspeed, "
            "through DeepSpeed's launcher, which sweeper does not start; leave zero2/zero3 out "
            "of search.data_parallel for an accelerate line, or give a torchrun line (the "
            "Trainer then runs ZeRO from its deepspeed argument)"
        )
    return said


def _compiled(backend: Any, mode: Any) -> str:
    if str(backend or "no").lower() == "no":
        return "--dynamo_backend no"
    return f"--dynamo_backend {str(backend).lower()} --dynamo_mode {mode}"


def _strategy(use_fsdp: Any, version: Any, reshard: Any) -> str:
    if not use_fsdp:
        return "DDP"
    return f"FSDP{version} (reshard after forward: {str(reshard).lower()})"


def apply(args: Any, config: Mapping[str, Any], cpu: bool) -> list[str]:
    """Set ``config``'s launch-owned knobs on accelerate's parsed ``args`` (the line, its
    config file's defaults applied); return what the trial's log says where the line differs.
    ValueError: a value accelerate's launch cannot run here."""
    said = options(config)
    if said.get("mixed_precision") == "fp8":
        backend = getattr(args, "fp8_backend", None)
        if backend not in (None, "ao"):
            raise ValueError(
                f"precision fp8: the line's --fp8_backend {backend} is not torchao's float8 "
                "training, which sweeper's fp8 knob is (and reads back); set --fp8_backend ao "
                "or leave fp8 out of search.precision"
            )
        if cpu:
            raise ValueError("precision fp8: accelerate's fp8 needs a CUDA device, not the CPU")
        said["fp8_backend"] = "ao"
    if said.get("use_fsdp") and getattr(args, "fsdp_auto_wrap_policy", None) is None:
        said["fsdp_auto_wrap_policy"] = _WRAP
    line = {
        "precision": f"--mixed_precision {args.mixed_precision}",
        "compile_mode": _compiled(args.dynamo_backend, args.dynamo_mode),
        "data_parallel": _strategy(
            args.use_fsdp, args.fsdp_version, args.fsdp_reshard_after_forward
        ),
    }
    for option, value in said.items():
        setattr(args, option, value)
    trial = {
        "precision": f"--mixed_precision {args.mixed_precision}",
        "compile_mode": _compiled(args.dynamo_backend, args.dynamo_mode),
        "data_parallel": _strategy(
            args.use_fsdp, args.fsdp_version, args.fsdp_reshard_after_forward
        ),
    }
    shown = {
        "DDP": "without --use_fsdp (DDP)",
        "FSDP2 (reshard after forward: true)": (
            "--use_fsdp --fsdp_version 2 --fsdp_reshard_after_forward true"
        ),
    }
    return [
        f"sweeper: accelerate {shown.get(trial[knob], trial[knob])} (the line says "
        f"{line[knob].removeprefix('--mixed_precision ')}; this trial's {knob} knob)"
        for knob in OWNED
        if config.get(knob) is not None and line[knob] != trial[knob]
    ]


def _name(word: str) -> str | None:
    """accelerate's name for an option word (``--mixed-precision=fp16``: mixed_precision)."""
    if word in _SHORT:
        return _SHORT[word]
    if word.startswith("--"):
        return word[2:].split("=", 1)[0].replace("-", "_")
    return None


def _spans(command: list[str]) -> tuple[dict[str, tuple[int, int]], int]:
    """Each launch option's words (start, end) in ``command`` (``accelerate launch ...``),
    and where the program starts (its script or module)."""
    spans: dict[str, tuple[int, int]] = {}
    index = 2
    while index < len(command):
        word = command[index]
        name = _name(word)
        if name is None:
            break
        end = index + 1 if name in FLAGS or "=" in word else index + 2
        spans[name] = (index, end)
        index = end
    return spans, index


def line_for(command: list[str], config: Mapping[str, Any]) -> list[str]:
    """An ``accelerate launch`` line with ``config``'s devices and launch-owned knobs, in the
    line's own words: an option it gives keeps its spelling with the new value, one it lacks
    is added before the program, a mode the config does not run is dropped.

    >>> line_for(["accelerate", "launch", "--mixed_precision=bf16", "--multi_gpu",
    ...     "--num_processes", "8", "train.py", "--lr", "1"], {"devices": 4, "precision":
    ...     "fp16", "compile_mode": "none", "data_parallel": "ddp"})
    ... # doctest: +NORMALIZE_WHITESPACE
    ['accelerate', 'launch', '--mixed_precision=fp16', '--multi_gpu', '--num_processes', '4',
     '--dynamo_backend', 'no', 'train.py', '--lr', '1']
    """
    devices = int(config.get("devices") or 1)
    said: dict[str, Any] = {"num_processes": devices, **options(config)}
    if said.get("mixed_precision") == "fp8":
        said["fp8_backend"] = "ao"
    if devices == 1:  # --multi_gpu needs 2 processes; one device runs the simple launcher
        said["multi_gpu"] = False
    spans, program = _spans(command)
    if "cpu" in spans:  # --cpu on several processes is DDP already; --multi_gpu would clash
        said.pop("multi_gpu", None)
    words = {index: [word] for index, word in enumerate(command)}
    added: list[str] = []
    for option, value in said.items():
        span = spans.get(option)
        if isinstance(value, bool):
            if span is not None and not value:
                for index in range(*span):
                    words[index] = []
            elif span is None and value:
                added.append(f"--{option}")
        elif span is None:
            added += [f"--{option}", str(value)]
        elif "=" in command[span[0]]:
            words[span[0]] = [f"{command[span[0]].split('=', 1)[0]}={value}"]
        else:
            words[span[0] + 1] = [str(value)]
    # after the line's options, before -m/--no_python (which say how the program runs)
    at = program
    while at > 2 and _name(command[at - 1]) in ("module", "no_python"):
        at -= 1
    out = [word for index in range(program) for word in words[index]]
    at -= sum(1 for index in range(at) if not words[index])  # removed words before it
    return [*out[:at], *added, *out[at:], *command[program:]]
