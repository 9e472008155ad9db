"""``engine: script``: the user's own training program is the trial.

Outside ``sweeper/trial/engines`` on purpose: this side only starts the program, so a script
trial's child never imports torch (the engines package does, at import), except to read a
torchrun or accelerate line with their own parsers.

The trial child runs ``workload.script.command`` in its own process group (so the launcher's
timeout and kill reach it, and every DataLoader worker it starts), with the knobs as
``TrainingArguments`` flags and the whole config in the environment. One line in the program
(``sweeper.callback()`` for a Trainer, ``sweeper.step(...)`` for a loop: ``sweeper.trial.hook``)
runs the same recorder as the built-in engines inside the program's process, writes the
measurement to ``SWEEPER_SCRIPT_RESULT`` and ends the program once the window is done. This side
starts it, relays what it prints to the trial's log, and turns an exit without a result into
a classified failure that says what is missing.

On ``devices: N`` the trial's leader (``sweeper.trial.group``) starts N ranks with torchrun's
environment and each rank runs the command here: the program sees what
``torchrun --nproc-per-node N`` gives its workers, and its hook records that rank's steps. A
command that is itself a torchrun line (``torchrun [options] train.py ...``, read with torchrun's
own parser) runs its program the same way, on the trial's device count instead of the line's
``--nproc-per-node``: torchrun's agent starts its workers in sessions of their own, out of reach
of the trial's timeout and kill, so sweeper starts them itself. An ``accelerate launch`` line
is read the same way, with accelerate's own parser and config file (``--config_file``, or its
default file, as ``accelerate launch`` reads them): its program runs on the trial's device
count instead of the line's ``--num_processes``, each rank with torchrun's environment plus what
accelerate's multi-GPU launcher adds to it (``ACCELERATE_MIXED_PRECISION``, the dynamo and FSDP
settings), or on one device with its simple launcher's; the knobs its launcher owns
(precision, compile mode, data parallelism) are set on the line as read, over its options
(``sweeper.trial.accelerate_line``). accelerate's launcher on several processes is torchrun's
agent, whose sessions the trial's kill does not reach; its DeepSpeed, TPU and Megatron launches
are refused on several devices (their launchers are not torchrun's).
The group's leader reads the line once and hands each rank its program and environment.
"""

from __future__ import annotations

import ast
import collections
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper import knobs
from sweeper.errors import NOT_SHOWN, TrialError
from sweeper.job import LOOP_LINE, ONE_LINE
from sweeper.trial import accelerate_line, progress
from sweeper.trial.failures import classify_output, raised_at
from sweeper.trial.launch_line import launcher
from sweeper.trial.lifeline import die_with_parent
from sweeper.trial.protocol import ChildRequest, ChildResult

if TYPE_CHECKING:
    from sweeper.space_trial import MeasureSettings

REQUEST_ENV = "SWEEPER_SCRIPT_REQUEST"  # the trial's request (JSON file); the hook reads it
RESULT_ENV = "SWEEPER_SCRIPT_RESULT"  # where the hook writes its ChildResult
CONFIG_ENV = "SWEEPER_TRIAL_CONFIG"  # the config as JSON: sweeper.trial_config()
LAUNCH_ENV = "SWEEPER_SCRIPT_LAUNCH"  # a rank's program and environment, as its leader read them
NOTE_ENV = "SWEEPER_SCRIPT_NOTE"  # what the trial runs otherwise than the line says

THE_LINE = f"add sweeper's one line to it (import sweeper): {ONE_LINE}"


# accelerate launch's modes whose launcher is not torchrun's (DeepSpeed's, XLA's, Megatron's)
_NOT_TORCHRUN = ("--use_deepspeed", "--tpu", "--use_megatron_lm")


_VISIBILITY = ("_VISIBLE_DEVICES", "_VISIBLE_MODULES", "_VISIBLE_CORES", "_AFFINITY_MASK")


def devices_problem(command: list[str], devices: int) -> str | None:
    """Why ``command`` cannot run as ``devices`` ranks (None: it can). Read from the words
    only (preflight's environment need not have accelerate); a mode that only the line's
    config file names is refused when the trial reads it (``_accelerate_program``)."""
    if devices > 1 and launcher(command) == "accelerate":
        modes = [w for w in command if w.split("=")[0] in _NOT_TORCHRUN]
        if modes:
            return _not_torchrun(" ".join(modes), devices)
    return None


def _not_torchrun(mode: str, devices: int) -> str:
    return (
        f"devices {devices}: an accelerate launch line with {mode} runs through a launcher "
        "other than torchrun's, which sweeper does not start on several devices; launch "
        "DDP or FSDP (--multi_gpu, --use_fsdp), or give a torchrun line"
    )


def _torchrun_program(command: list[str]) -> tuple[list[str], int | str]:
    """The program a torchrun line starts on each worker, as torchrun would run it, and the
    line's own ``--nproc-per-node`` (read with torchrun's parser)."""
    from torch.distributed.run import get_args_parser

    words = command[3:] if command[1:3] == ["-m", "torch.distributed.run"] else command[1:]
    try:
        args = get_args_parser().parse_args(words)
    except SystemExit as e:
        raise TrialError(
            "error",
            f"workload.script.command: torchrun does not take {' '.join(words)!r} (its own "
            "parser said so above); fix the line so it runs as `torchrun ... train.py`",
        ) from e
    if args.no_python:
        return [args.training_script, *args.training_script_args], args.nproc_per_node
    # torchrun runs the program with its own interpreter: its #! line's python
    module = ["-m"] if args.module else []
    program = [_python(command), "-u", *module, args.training_script, *args.training_script_args]
    return program, args.nproc_per_node


class _Line:
    """A command as ``sweeper.preflight_script.script_python`` reads it."""

    def __init__(self, command: list[str]) -> None:
        self.command, self.cwd = command, None


def _accelerate_program(
    command: list[str],
    devices: int,
    device: str = "cuda",
    port: int | None = None,
    config: Mapping[str, Any] | None = None,
) -> tuple[list[str], dict[str, str], int | None, bool]:
    """What an ``accelerate launch`` line runs on each of ``devices`` processes of the trial's
    ``device`` kind, as its launcher would: the program, the environment the launcher adds to
    this one, the line's own process count (its flags, else its config file), and whether the
    launch is torchrun's (several processes, or FSDP on one), whose workers also get torchrun's
    variables (``port``: their rendezvous port). ``config``: the trial's knobs, whose
    launch-owned ones (``accelerate_line.OWNED``) replace the line's options; what differs
    from the line is in the environment's ``NOTE_ENV``."""
    import warnings

    # accelerate's own reading of the line: its parser, then its config file's defaults
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser  # type: ignore[import-untyped]
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env  # type: ignore[import-untyped]

    words = command[2:]
    try:
        parsed = launch_command_parser().parse_args(words)
        explicit = parsed.num_processes is not None
        args, defaults, _ = _validate_launch_command(parsed)
    except (SystemExit, ValueError, OSError) as e:
        said = "" if isinstance(e, SystemExit) else f": {e}"
        raise TrialError(
            "error",
            f"workload.script.command: accelerate launch does not take {' '.join(words)!r}"
            f"{said or ' (its own parser said so above)'}; fix the line (or its --config_file) "
            "so it runs as `accelerate launch ... train.py`",
        ) from e
    # said by the line or its config file (else accelerate counts the GPUs it sees)
    asked = args.num_processes if explicit or defaults is not None else None
    for flag, on in (("--use_deepspeed", args.use_deepspeed), ("--tpu", args.tpu),
                     ("--use_megatron_lm", args.use_megatron_lm)):  # fmt: skip
        if on and devices > 1:
            raise TrialError(
                "unsupported", _not_torchrun(f"{flag} (or its config file's)", devices)
            )
    # a trial on the CPU runs the line as --cpu does (else an Accelerator that finds no GPU
    # trains each process alone): the trial's device kind is the trial's, as its devices are
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    cpu = bool(args.cpu or getattr(args, "use_cpu", False)) or device == "cpu"
    notes = []
    if config is not None:
        try:
            notes = accelerate_line.apply(args, config, cpu)
        except ValueError as e:
            raise TrialError("unsupported", f"workload.script.command: {e}") from e
    args.num_processes = devices
    torchrun = devices > 1 or (bool(args.use_fsdp) and not cpu)
    with warnings.catch_warnings():
        # the port is the group's own (its rank 0 may have bound it already): not a clash
        warnings.simplefilter("ignore")
        try:
            if torchrun:
                args.main_process_port = port
                env = prepare_multi_gpu_env(args)
            else:
                _, env = prepare_simple_launcher_cmd_env(args)
        except (ValueError, RuntimeError) as e:  # e.g. fp8 without an fp8 backend installed
            raise TrialError(
                "unsupported", f"workload.script.command: accelerate's launcher refused: {e}"
            ) from e
        if cpu:  # what its simple launcher says of a --cpu launch
            env["ACCELERATE_USE_CPU"] = "True"
    # which devices the trial has is the trial's (its device pool's): the line's --gpu_ids
    # does not narrow them
    added = {
        key: value
        for key, value in env.items()
        if os.environ.get(key) != value and not key.endswith(_VISIBILITY)
    }
    if notes:
        added[NOTE_ENV] = "\n".join(notes)
    if args.no_python:
        return [args.training_script, *args.training_script_args], added, asked, torchrun
    module = ["-m"] if args.module else []
    unbuffered = ["-u"] if torchrun else []  # torchrun runs python -u; the simple launcher not
    program = [_python(command), *unbuffered, *module, args.training_script,
               *args.training_script_args]  # fmt: skip
    return program, added, asked, torchrun


def _python(command: list[str]) -> str:
    """The interpreter a launcher runs its program with: its own (its #! line's python)."""
    from sweeper.preflight_script import script_python

    if Path(command[0]).name.startswith("python"):
        return command[0]
    return script_python(_Line(command)) or sys.executable


def launch_of(request: ChildRequest, port: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The words this trial runs (on each rank) and the environment its launcher adds: the
    space's command, or the program of its torchrun or accelerate line, with the knobs in the
    user's flag form. ``port``: the group's rendezvous port, when its leader reads the line for
    its ranks (which have torchrun's variables already); None on one device."""
    script = request.workload.script
    assert script is not None and request.config is not None
    command, env = list(script.command), dict[str, str]()
    devices = request.config.devices
    asked: int | str | None = None
    # a torchrun launch's one worker gets torchrun's variables; a group's ranks have them
    one_rank = _one_rank_env if port is None else dict[str, str]
    if launcher(command) == "torchrun":
        command, asked = _torchrun_program(command)
        env = one_rank()
    elif launcher(command) == "accelerate":
        config = request.config.model_dump()
        command, env, asked, torchrun = _accelerate_program(
            command, devices, request.device, port, config
        )
        env |= one_rank() if torchrun else {}
    notes = [env.pop(NOTE_ENV)] if NOTE_ENV in env else []
    if asked is not None and str(asked) != str(devices):
        name = "--nproc-per-node" if launcher(script.command) == "torchrun" else "--num_processes"
        notes.insert(
            0,
            f"sweeper: the {launcher(script.command)} line says {name} {asked}; this trial "
            f"runs {devices} (its devices knob)",
        )
    if notes:
        env[NOTE_ENV] = "\n".join(notes)
    try:
        flags = script_flags(script, request.config.model_dump())
    except ValueError as e:  # a value the knobs form cannot say (knobs.flag_problems)
        raise TrialError("unsupported", f"workload.script.knobs {script.knobs}: {e}") from e
    return [*command, *flags], env


def script_flags(script: Any, config: dict[str, Any]) -> list[str]:
    """The flags a trial appends to the script's command: its knobs form's
    (``knobs.command_flags``), and, under ``flags``/``sft_flags``, those of its own parser
    that its command already says (``knobs.said_flags``: a ``--max_seq_length`` of its own).
    A ValueError: a value the form cannot say."""
    flags = knobs.command_flags(accelerate_line.flag_config(script, config), script.knobs)
    if script.knobs == "env":
        return flags
    return flags + knobs.said_flags(config, list(script.command), flags)


def carried(config: dict[str, Any], script: Any) -> set[str]:
    """The knobs the trial's command is given as flags or as its accelerate launch's options
    (the rest reach the program only through ``sweeper.trial_config()``)."""
    passed = {flag.removeprefix("--") for flag in script_flags(script, config)[::2]}
    names = {
        knob.name
        for knob in knobs.KNOBS
        if (value := config.get(knob.name)) is not None
        and {*knob.trainer(value), *knob.sft(value)} & passed
    }
    names |= {knob for knob, said in knobs.OWN_PARSER_FLAGS.items() if set(said) & passed}
    return names | (
        set(accelerate_line.OWNED) if accelerate_line.is_line(script.command) else set()
    )


# the trial's layout, which sweeper itself gives the program (its ranks, its launch): never
# the program's own
_LAYOUT = ("devices", "data_parallel")


def owned(request: ChildRequest) -> set[str]:
    """The knobs the program runs at its own values: those the space does not list
    (``request.listed``; their config value is sweeper's default, not an ask) and the trial
    does not give it as a flag or a launch option. Under ``knobs: env`` nothing is given so: a
    TRL script's SFTConfig runs its bf16 and gradient checkpointing wherever it does not take
    them from ``sweeper.trial_config()``. Their values are read back from what ran and
    recorded as such, not compared with the config's (empty: ``listed`` not known)."""
    script, config = request.workload.script, request.config
    if script is None or config is None or request.listed is None:
        return set()
    given = carried(config.model_dump(), script)
    return {
        knob.name
        for knob in knobs.KNOBS
        if knob.name not in request.listed and knob.name not in given and knob.name not in _LAYOUT
    }


def ran_config(request: ChildRequest, effective: Mapping[str, Any]) -> ChildRequest:
    """``request`` with the config the program ran: its own values of the knobs it owns
    (``owned``) where they were read back as a config can hold them, so what the measurement
    derives from the config (MFU's peak for the precision and TF32, the effective batch)
    is derived from what ran."""
    from pydantic import ValidationError

    from sweeper.trial.engines.readback import Unobserved

    assert request.config is not None
    config = request.config
    for name in sorted(owned(request)):
        value = effective.get(name)
        if value is None or isinstance(value, Unobserved):
            continue
        try:
            config = knobs.TrialConfig.model_validate(config.model_dump() | {name: value})
        except ValidationError:
            continue  # a value no config holds (a script's own optimizer class)
    return request.model_copy(update={"config": config})


def own_values(request: ChildRequest, ran: ChildRequest) -> dict[str, Any]:
    """The knobs the program ran at its own values (``owned``; ``ran``: ``ran_config``'s
    request) where those differ from the config's (sweeper's defaults, never an ask), as a
    config holds them: what the trial records beside the config it was asked
    (``Measurement.own_values``), which stays the study's key of the config. A TRL script
    under ``knobs: env`` gives e.g. ``{"precision":
    "bf16", "gradient_checkpointing": True, "optim": "adamw_torch_fused"}``."""
    assert request.config is not None and ran.config is not None
    asked, values = request.config.model_dump(), ran.config.model_dump()
    own = owned(request)
    return {
        knob.name: values[knob.name]  # in the knobs' order, as a config lists them
        for knob in knobs.KNOBS
        if knob.name in own and values[knob.name] != asked.get(knob.name)
    }


def unreached(
    request: ChildRequest, effective: dict[str, Any], config_read: bool
) -> tuple[dict[str, Any], list[str]]:
    """``effective`` with what a program that never called ``sweeper.trial_config()`` did
    with the knobs that reach it only there, where the objects did not show it (a script's own
    cut of its samples, its own packing): its own values, not the config's; and those knobs'
    names (``Measurement.unreached``: the config's values for them did not run). A knob the
    space searches (``request.varied``) that never reached the program is a ``mismatch``: its
    trials would differ in a value nothing ran."""
    from sweeper.trial.engines.readback import Unobserved

    script, config = request.workload.script, request.config
    if config_read or script is None or config is None:
        return effective, []
    asked = config.model_dump()
    given = carried(asked, script)
    missed = [
        name
        for name, value in effective.items()
        if isinstance(value, Unobserved) and asked.get(name) is not None and name not in given
    ]
    searched = [name for name in missed if name in request.varied]
    if searched:
        raise TrialError(
            "mismatch",
            f"the space searches {', '.join(searched)}, which reach your script only through "
            "sweeper.trial_config(), and it never called it: every value would run the same. "
            "Read them there (config = sweeper.trial_config() or {}; "
            f"config.get({searched[0]!r})), or list one value in the space",
        )
    return effective | {
        name: Unobserved(
            f"the script's own: not among its {script.knobs}, and it never called "
            f"sweeper.trial_config() ({effective[name]})"
        )
        for name in missed
    }, missed


def not_shown(request: ChildRequest, effective: Mapping[str, Any]) -> list[str]:
    """The knobs the program owns (``owned``) whose value sweeper could not read back, since
    the program did not pass it the object that holds them (its DataLoader or optimizer to
    ``sweeper.step``): the config's value for them is sweeper's default, not what ran, and
    the recommendation marks them so. A knob the space lists that cannot be read back so
    fails the trial as ``mismatch``: its value would be recorded as asked whatever ran (a
    walk's loop ran prefetch 4 in both trials of a [2, 4] search, and its table showed a
    2.3x "effect" of the prefetch; listed once, its export said prefetch 2)."""
    from sweeper.trial.engines.readback import NotShown

    missing = [name for name, value in effective.items() if isinstance(value, NotShown)]
    listed = set(request.varied) | set(request.listed or ())
    asked = [name for name in missing if name in listed]
    if asked:
        shown = "your DataLoader" if any("loader=" in effective[n] for n in asked) else (
            "your optimizer"
        )  # fmt: skip
        one = len(asked) == 1
        raise TrialError(
            "mismatch",
            f"the space {'searches' if set(asked) & set(request.varied) else 'lists'} "
            f"{', '.join(asked)}, {NOT_SHOWN} {shown}, and your sweeper.step(...) was not "
            "given it: each trial would be recorded at the value asked, whatever ran. Pass "
            f"it: {LOOP_LINE}; or leave {'it' if one else 'them'} out of search: (your "
            "script's own value then runs, marked as unseen)",
        )
    own = owned(request)
    return [name for name in missing if name in own]


def form_hint(request: ChildRequest, args: Any) -> str:
    """What to add to a mismatch when the script's arguments are TRL's SFTConfig but the space
    passes its knobs as TrainingArguments flags (``knobs: flags``): SFTConfig's own defaults
    (bf16, gradient checkpointing, max_length 1024) then run where the flags say nothing, and
    max_seq_length never reaches it. Empty otherwise."""
    script = request.workload.script
    if script is None or script.knobs != "flags" or type(args).__name__ != "SFTConfig":
        return ""
    return (
        "; your script's arguments are TRL's SFTConfig, not TrainingArguments: set "
        "workload.script.knobs: sft_flags, so each trial gives it --max_length and --packing "
        "and the knobs your command leaves out run at SFTConfig's defaults, as your run has them"
    )


def launch_for_ranks(request: ChildRequest, port: int) -> dict[str, str]:
    """What the group's leader adds to each rank's environment: the launch line read once
    (its program and its launcher's environment), rather than by each rank (reading a torchrun
    or accelerate line imports torch: seconds of CPU a rank, at the group's start)."""
    command, env = launch_of(request, port)
    return {LAUNCH_ENV: json.dumps({"command": command, "env": env})}


def _one_rank_env() -> dict[str, str]:
    """What ``torchrun --nproc-per-node 1`` gives its one worker, for a torchrun launch on one
    device (on several, the group's leader gave each rank its own). Not OMP_NUM_THREADS:
    torchrun sets it on several processes only (``torchrun_threads``); a walk's 1-device trial
    ran with 1 thread, 19 steps/s, and its exported torchrun line with torch's default, 1.3."""
    from sweeper.trial.group import free_port, torchrun_threads

    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        **torchrun_threads(1, os.environ),
    }


def run_script(request: ChildRequest, request_path: Path) -> Any:
    """Run the user's command as this trial; return the measurement its hook wrote."""
    script = request.workload.script
    assert script is not None and request.config is not None
    problem = devices_problem(script.command, request.config.devices)
    if problem is not None:
        raise TrialError("unsupported", problem)
    given = os.environ.pop(LAUNCH_ENV, None)  # a rank: its leader read the line
    if given is None:
        command, launched = launch_of(request)
    else:
        read = json.loads(given)
        command, launched = list(read["command"]), dict(read["env"])
    rank = os.environ.get("RANK") if "SWEEPER_RANK" in os.environ else None
    result_path = request_path.with_name(
        "script-result.json" if rank is None else f"script-result-{rank}.json"
    )
    result_path.unlink(missing_ok=True)
    env = {
        **os.environ,
        **launched,
        REQUEST_ENV: str(request_path),
        RESULT_ENV: str(result_path),
        CONFIG_ENV: json.dumps(request.config.model_dump()),
    }
    cwd = Path(script.cwd).expanduser() if script.cwd else None
    where = "" if rank is None else f" as rank {rank} of {os.environ['WORLD_SIZE']}"
    if NOTE_ENV in env:  # said by each rank, beside what it runs
        print(env.pop(NOTE_ENV), file=sys.stderr, flush=True)
    print(f"sweeper: running {' '.join(command)}{where}", file=sys.stderr, flush=True)
    # a timeout before the hook marks its own phase says the program never reached the line
    progress.mark("script")
    parent = os.getpid()
    try:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stdout.fileno(),
            stderr=subprocess.PIPE,
            # the program dies with this process: a rank the group's leader stops takes its
            # program with it
            preexec_fn=lambda: die_with_parent(parent),
        )
    except OSError as e:
        raise TrialError(
            "error",
            f"workload.script.command could not start ({command[0]}: {e.strerror or e}); "
            "give the program as a list of words, e.g. [python, train.py], and check "
            "workload.script.cwd",
        ) from e
    assert process.stderr is not None
    tail: collections.deque[str] = collections.deque(maxlen=60)
    # relay the program's stderr to the trial's log line by line, keeping its end to classify
    for raw in process.stderr:
        sys.stderr.buffer.write(raw)
        sys.stderr.flush()
        tail.append(raw.decode("utf-8", "replace"))
    returncode = process.wait()
    result = ChildResult.model_validate_json(result_path.read_text()) if (
        result_path.exists()
    ) else None  # fmt: skip
    if result is not None and result.status != "ok":
        raise TrialError(result.failure_kind or "error", result.failure_message or "failed")
    # a measurement kept at the program's own end (its run ended inside the window) stands
    # only if the program then exited as a finished run does; sweeper's own end exits 0
    if result is not None and returncode == 0:
        return result.payload
    said = "".join(tail)
    if returncode == 0:
        reached = progress.read_progress(Path(env[progress.PROGRESS_ENV])) if (
            progress.PROGRESS_ENV in env
        ) else None  # fmt: skip
        ended = _ended_early(reached, request)
        if ended is not None:
            raise TrialError("error", f"{' '.join(script.command)} {ended}")
        raise TrialError(
            "error",
            f"{' '.join(script.command)} finished without measuring anything: it never "
            f"reached sweeper's recorder. {THE_LINE}",
        )
    kind, message = classify_output(said)
    raised = raised_at(said, str(cwd.resolve()) if cwd else os.getcwd())
    at = f" (raised at {raised})" if raised else ""
    # what went wrong first, the command last: a trial's line on the terminal is cut at its
    # width, and a message that began with a long command lost the error there
    raise TrialError(
        kind,
        f"your command exited {returncode}: {message}{at}"
        + _unparsed_hint(message, script.knobs, script.command)
        + f" (the command: {' '.join(script.command)})",
    )


_RUN_LONGER = (
    "let the run go on longer (more --num_train_epochs or --max_steps in "
    "workload.script.command: sweeper ends it once it has measured)"
)
_LONGER = f"{_RUN_LONGER}, or ask for fewer steps (trial.warmup.max_steps, trial.measure.min_steps)"


def _ended_early(reached: dict[str, Any] | None, request: ChildRequest) -> str | None:
    """Why a program that reached sweeper's line ended before the recorder was done: its own
    run (epochs, max_steps) was shorter than burn-in and the timed window. None when the line
    was never reached (the progress file's last phase is the script's own)."""
    phase = (reached or {}).get("phase")
    if phase not in ("script_hook", "burn_in", "window", "finishing"):
        return None
    from sweeper.space_trial import TrialSettings

    settings = request.settings or TrialSettings()
    warmup, measure = settings.warmup, settings.measure
    fix = _LONGER
    if phase == "script_hook":
        return (
            "ended after reaching sweeper's line but before its first optimizer step ended: "
            f"sweeper needs up to {warmup.max_steps} steps of burn-in and at least "
            f"{measure.min_steps} timed ones; {fix}"
        )
    if phase == "burn_in":
        done = int((reached or {}).get("step", 0))
        return (
            f"ended after {done} optimizer step{'' if done == 1 else 's'}, all of them burn-in "
            f"(up to {warmup.max_steps}, trial.warmup), before the timed window (at least "
            f"{measure.min_steps} steps, trial.measure): its own run was shorter than the "
            f"measurement; {fix}"
        )
    # the hook writes a window's end itself (kept, or failed with its counts) at the program's
    # exit; here it could not: the program left through os._exit or a signal
    burn_in = int((reached or {}).get("steps", 0))
    needed = max(measure.min_steps, math.ceil(measure.warmup_multiple * burn_in))
    return (
        f"ended inside the timed window (after {burn_in} steps of burn-in; the window needs at "
        f"least {needed}) without running Python's exit handlers (os._exit, or a signal), so "
        f"sweeper could not count or keep the steps it timed; end the program by returning "
        f"from it or sys.exit, or {fix}"
    )


def ended_in_window(
    command: str,
    measure: MeasureSettings,
    *,
    burn_in: int,
    timed: int,
    needed: int,
    seconds: float,
    interval: float,
) -> str:
    """Why a trial whose program ended inside the timed window is not kept, with the window's
    own counts (steps timed and needed, seconds, the interval reached), as its log shows them.

    >>> from sweeper.space_trial import MeasureSettings
    >>> ended_in_window("python train.py", MeasureSettings(min_steps=5), burn_in=6, timed=10,
    ...                 needed=24, seconds=0.3, interval=0.05)[16:98]
    'ended inside the timed window after 10 timed steps (0.3 s, interval reached ±5.0%)'
    """
    reached = f"±{interval:.1%}" if math.isfinite(interval) else "none yet"
    said = (
        f"{command} ended inside the timed window after {timed} timed "
        f"step{'' if timed == 1 else 's'} ({seconds:.3g} s, interval reached {reached})"
    )
    return (
        f"{said}: the window needs at least {needed} steps (trial.measure.min_steps "
        f"{measure.min_steps}, and warmup_multiple {measure.warmup_multiple:g} × the {burn_in} "
        f"burn-in step{'' if burn_in == 1 else 's'}); {_RUN_LONGER}, or ask for fewer steps "
        "(trial.warmup.max_steps, trial.measure.min_steps, trial.measure.warmup_multiple)"
    )


def kept_in_window(measure: MeasureSettings, *, timed: int, seconds: float, interval: float) -> str:
    """The note of a trial kept although its program ended inside the timed window: what the
    window had not reached yet (the interval, min_seconds), as a capped window reports it.

    >>> from sweeper.space_trial import MeasureSettings
    >>> kept_in_window(MeasureSettings(), timed=294, seconds=9.3, interval=0.034)[52:123]
    'after 294 timed steps (9.3 s), before the interval reached ±2.0% (trial'
    """
    short = []
    if not interval <= measure.target_ci:
        short.append(f"the interval reached ±{measure.target_ci:.1%} (trial.measure.target_ci)")
    if seconds < measure.min_seconds:
        short.append(f"{measure.min_seconds:g} s (trial.measure.min_seconds)")
    return (
        f"sweeper: your program ended inside the timed window after {timed} timed steps "
        f"({seconds:.3g} s), before {' and '.join(short) or 'the window closed'}; the "
        f"measurement is kept as a capped window's is, with the interval it reached: "
        f"±{interval:.1%}"
    )


_UNUSED = re.compile(r"arguments are not used by the HfArgumentParser: (\[.*?\])")


def _unparsed_hint(message: str, form: str, command: Sequence[str] = ()) -> str:
    """What to add when the program's HfArgumentParser refused the words it was given: flags
    of the user's own command (a misspelt ``--lora_alpah``) are named as such; under
    ``knobs: flags``/``sft_flags`` each trial appends the knobs as flags, which a script that
    takes its arguments from one JSON or YAML file (``python train.py config.json``, parsed
    with ``parse_json_file``) never parses. Empty otherwise.

    >>> said = "ValueError: Some specified arguments are not used by the HfArgumentParser: "
    >>> _unparsed_hint(said + "['--lora_alpah', '32']", "sft_flags",
    ...                ["python", "t.py", "--lora_alpah", "32"])[:66]
    '; --lora_alpah is a word of workload.script.command, not an argume'
    """
    if "arguments are not used by the HfArgumentParser" not in message:
        return ""
    found = _UNUSED.search(message)
    try:
        unused = [str(w) for w in ast.literal_eval(found.group(1))] if found else []
    except (ValueError, SyntaxError):
        unused = []
    yours = [w for w in unused if w.startswith("--") and w in command]
    if yours and all(w in command for w in unused):
        return (
            f"; {', '.join(yours)} {'is a word' if len(yours) == 1 else 'are words'} of "
            "workload.script.command, not an argument your script's parser takes: check the "
            "spelling against its dataclasses (python your_script.py --help lists them)"
        )
    if form == "env":
        return ""
    return (
        f"; with workload.script.knobs: {form} each trial appends the knobs to your command as "
        "flags (--per_device_train_batch_size 4 ...), and your script's parser did not take "
        "them beside its own arguments (a script that reads its arguments from one JSON or "
        "YAML file, HfArgumentParser's parse_json_file, parses no flags). Give your arguments "
        "as flags in workload.script.command, or set workload.script.knobs: env and set each "
        "knob in your script from sweeper.trial_config()"
    )
