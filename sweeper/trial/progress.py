"""Where a child is, for the parent that may have to kill it: the last phase it reached.

The launcher gives each child a file (``SWEEPER_PROGRESS_FILE``); the child rewrites it at each
phase boundary (a build phase closed, burn-in started, a burn-in step, the window opened, the
checkpoint save). A timeout then says which phase the trial reached and for how long it had
been in it, instead of only "no result". Nothing is written inside the timed window: the file
is touched when the window opens and when it closes, so the window's steps pay nothing.

This module imports nothing heavy: the launcher reads the file with ``read_progress``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

PROGRESS_ENV = "SWEEPER_PROGRESS_FILE"

# what the child was doing after each mark: build marks close a phase, so the words name the
# phase that had finished and say that the next one was under way
_PHASE_WORDS = {
    "started": "start-up (importing torch and the engine)",
    "tokenizer": "start-up (tokenizer loaded; building data, model and optimizer)",
    "data": "start-up (data built; next build step under way)",
    "dataset": "start-up (the engine's dataset tokenized and packed; next step under way)",
    "model": "start-up (model built; next build step under way)",
    "optimizer": "start-up (optimizer built; the first step under way)",
    "trainer_setup": "start-up (trainer set up; the first step under way)",
    "script": (
        "your command, which never reached sweeper's line (no Trainer with "
        "callbacks=[sweeper.callback()] began training, no sweeper.step ran: without the line "
        "a script trains to its end unmeasured; add it, or if it is there, the script's own "
        "start-up is this slow)"
    ),
    "script_hook": "your command's start-up (sweeper's line reached; its first step under way)",
    "burn_in": "burn-in",
    "window": "the timed window",
    "finishing": "the end of the timed window (the engine winding down)",
    "checkpoint": "the checkpoint save",
    "done": "writing the result",
}


_current: dict[str, Any] = {}  # the phase this process is in and when it began


def mark(phase: str, **detail: Any) -> None:
    """Record that the child reached ``phase`` now; a no-op without a progress file.

    Written to a temporary file and renamed, so a reader never sees half a record.
    """
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    now = time.time()
    if _current.get("phase") != phase:  # a repeated mark (another burn-in step) keeps its start
        _current.update(phase=phase, since=now)
    record = {"phase": phase, "at": now, "since": _current["since"], **detail}
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:  # progress is a courtesy to the parent; never fail a trial over it
        pass


def read_progress(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "phase" in record else None


def describe(record: dict[str, Any] | None, *, now: float | None = None) -> str:
    """One line for a timeout message: the phase reached and how long the child had been in it.

    >>> describe({"phase": "burn_in", "at": 100.0, "step": 7}, now=130.0)
    'it was in burn-in (after step 7) for 30 s when it was stopped'
    >>> describe(None)
    'it never reported a phase (stuck before its imports finished?)'
    """
    if record is None:
        return "it never reported a phase (stuck before its imports finished?)"
    phase = str(record["phase"])
    words = _PHASE_WORDS.get(phase, phase)
    if record.get("step") == 0:
        words += " (its first step under way)"
    elif "step" in record:
        words += f" (after step {record['step']})"
    if "steps" in record:
        words += f" (after {record['steps']} burn-in steps)"
    now = time.time() if now is None else now
    ago = max(0.0, now - float(record.get("since", record.get("at", now))))
    return f"it was in {words} for {ago:.0f} s when it was stopped"
