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
from sweeper.trial.protocol import ChildRequest, ChildResult

REQUEST_ENV = "SWEEPER_SCRIPT_REQUEST"  # the trial's request (JSON file); the hook reads it
RESULT_ENV = "SWEEPER_SCRIPT_RESULT"  # where the hook writes its ChildResult
CONFIG_ENV = "SWEEPER_TRIAL_CONFIG"  # the config as JSON: sweeper.trial_config()

THE_LINE = (
    "add sweeper's one line to it: callbacks=[sweeper.callback()] in Trainer(...) or "
    "SFTTrainer(...), or `with sweeper.step(batch, model=model, optimizer=optimizer):` "
    "around each optimizer step of your own loop (import sweeper)"
)


def command_of(request: ChildRequest) -> list[str]:
    script = request.workload.script
    assert script is not None and request.config is not None
    return [*script.command, *knobs.command_flags(request.config.model_dump(), script.knobs)]


def run_script(request: ChildRequest, request_path: Path) -> Any:
    """Run the user's command as this trial; return the measurement its hook wrote."""
    script = request.workload.script
    assert script is not None and request.config is not None
    command = command_of(request)
    result_path = request_path.with_name("script-result.json")
    result_path.unlink(missing_ok=True)
    env = {
        **os.environ,
        REQUEST_ENV: str(request_path),
        RESULT_ENV: str(result_path),
        CONFIG_ENV: json.dumps(request.config.model_dump()),
    }
    cwd = Path(script.cwd).expanduser() if script.cwd else None
    print(f"sweeper: running {' '.join(command)}", file=sys.stderr, flush=True)
    try:
        process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stdout.fileno(),
            stderr=subprocess.PIPE,
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
