"""``engine: script``: the user's own training program is the trial.

Outside ``sweeper/trial/engines`` on purpose: this side only starts the program, so a script
trial's child never imports torch (the engines package does, at import).

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
runs as it is on one device; on several it is refused (its launcher's settings are not read here).
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sweeper import knobs
from sweeper.errors import TrialError
from sweeper.trial.failures import classify_output
from sweeper.trial.lifeline import die_with_parent
from sweeper.trial.protocol import ChildRequest, ChildResult

REQUEST_ENV = "SWEEPER_SCRIPT_REQUEST"  # the trial's request (JSON file); the hook reads it
RESULT_ENV = "SWEEPER_SCRIPT_RESULT"  # where the hook writes its ChildResult
CONFIG_ENV = "SWEEPER_TRIAL_CONFIG"  # the config as JSON: sweeper.trial_config()

THE_LINE = (
    "add sweeper's one line to it: callbacks=[sweeper.callback()] in Trainer(...) or "
    "SFTTrainer(...), or `with sweeper.step(batch, model=model, optimizer=optimizer):` "
    "around each optimizer step of your own loop (import sweeper)"
)


def launcher(command: list[str]) -> str | None:
    """The launcher a command starts with: ``torchrun`` (or ``python -m torch.distributed.run``),
    ``accelerate`` (``accelerate launch``), or None for a program run as it is."""
    program = Path(command[0]).name
    if program == "torchrun" or command[1:3] == ["-m", "torch.distributed.run"]:
        return "torchrun"
    if program == "accelerate" and command[1:2] == ["launch"]:
        return "accelerate"
    return None


def devices_problem(command: list[str], devices: int) -> str | None:
    """Why ``command`` cannot run as ``devices`` ranks (None: it can)."""
    if devices > 1 and launcher(command) == "accelerate":
        return (
            f"devices {devices}: an accelerate launch line runs on one device here (sweeper starts "
            "a script's ranks itself and does not read accelerate's launch settings); give the "
            "command as [python, train.py, ...] or a torchrun line, and sweeper starts it on each "
            "device with torchrun's environment"
        )
    return None


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
    from sweeper.preflight import script_python

    python = (
        command[0]
        if Path(command[0]).name.startswith("python")
        else script_python(_Line(command)) or sys.executable
    )
    module = ["-m"] if args.module else []
    program = [python, "-u", *module, args.training_script, *args.training_script_args]
    return program, args.nproc_per_node


class _Line:
    """A command as ``sweeper.preflight.script_python`` reads it."""

    def __init__(self, command: list[str]) -> None:
        self.command, self.cwd = command, None


def command_of(request: ChildRequest) -> list[str]:
    """The words this trial runs (on each rank): the space's command, or the program of its
    torchrun line, with the knobs in the user's flag form."""
    script = request.workload.script
    assert script is not None and request.config is not None
    command = list(script.command)
    if launcher(command) == "torchrun":
        command, asked = _torchrun_program(command)
        if str(asked) != str(request.config.devices):
            print(
                f"sweeper: the torchrun line says --nproc-per-node {asked}; this trial runs "
                f"{request.config.devices} (its devices knob)",
                file=sys.stderr,
                flush=True,
            )
    try:
        flags = knobs.command_flags(request.config.model_dump(), script.knobs)
    except ValueError as e:  # a value the knobs form cannot say (knobs.flag_problems)
        raise TrialError("unsupported", f"workload.script.knobs {script.knobs}: {e}") from e
    return [*command, *flags]


def _one_rank_env(command: list[str]) -> dict[str, str]:
    """What ``torchrun --nproc-per-node 1`` gives its one worker, for a torchrun line on one
    device (on several, the group's leader gave each rank its own)."""
    from sweeper.trial.group import RANK_ENV, free_port

    if launcher(command) != "torchrun" or RANK_ENV in os.environ:
        return {}
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def run_script(request: ChildRequest, request_path: Path) -> Any:
    """Run the user's command as this trial; return the measurement its hook wrote."""
    script = request.workload.script
    assert script is not None and request.config is not None
    problem = devices_problem(script.command, request.config.devices)
    if problem is not None:
        raise TrialError("unsupported", problem)
    command = command_of(request)
    rank = os.environ.get("RANK") if "SWEEPER_RANK" in os.environ else None
    result_path = request_path.with_name(
        "script-result.json" if rank is None else f"script-result-{rank}.json"
    )
    result_path.unlink(missing_ok=True)
    env = {
        **os.environ,
        **_one_rank_env(script.command),
        REQUEST_ENV: str(request_path),
        RESULT_ENV: str(result_path),
        CONFIG_ENV: json.dumps(request.config.model_dump()),
    }
    cwd = Path(script.cwd).expanduser() if script.cwd else None
    where = "" if rank is None else f" as rank {rank} of {os.environ['WORLD_SIZE']}"
    print(f"sweeper: running {' '.join(command)}{where}", file=sys.stderr, flush=True)
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
    if result_path.exists():
        result = ChildResult.model_validate_json(result_path.read_text())
        if result.status == "ok":
            return result.payload
        raise TrialError(result.failure_kind or "error", result.failure_message or "failed")
    said = "".join(tail)
    if returncode == 0:
        raise TrialError(
            "error",
            f"{' '.join(script.command)} finished without measuring anything: it never "
            f"reached sweeper's recorder. {THE_LINE}",
        )
    kind, message = classify_output(said)
    raise TrialError(kind, f"{' '.join(script.command)} exited {returncode}: {message}")
