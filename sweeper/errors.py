"""One exception root for sweeper; foreign errors are mapped to these at one boundary.

    SweeperError
    ├── SpaceError            a space file is missing, not YAML, or fails validation (exit 2)
    ├── CatalogError          a GPU catalog file, or a GPU type asked of it, is wrong (exit 2)
    ├── SettingsError         a SWEEPER_* environment variable is wrong (exit 2)
    ├── StorageError          the database cannot be reached or its schema is wrong
    │   ├── DatabaseLostError     a sweep's database stayed away past its retry window
    │   └── DiskFullError         the disk under the database is full
    ├── StudyNotFoundError    no study of that name in the storage
    ├── NoResultError         a study has no completed trial to recommend
    │   ├── TruncatesOnlyError    every completed trial truncates: the fix, and the best of them
    │   └── NothingMeetsError     no study of a workload, nor a GPU offer, meets the constraints
    ├── ConflictError         a request does not fit the study's state (stop a finished study)
    ├── PrepareError          the workload's dataset or tokenizer could not be prepared
    └── TrialError            a trial failed; ``kind`` says how (one of FAILURE_KINDS)

A failed trial is data: the launcher returns a ``TrialFailure`` record rather than raising, and
``TrialError`` is only raised inside the child, where it is caught and classified.
"""

from __future__ import annotations

import re
from typing import Any

# Kinds a failed trial is classified into; stored as text and shown in the dashboard.
FAILURE_KINDS = (
    "oom",  # device or host out of memory
    "unsupported",  # an attention implementation / compile mode / dtype that cannot run here
    "compile",  # torch.compile raised
    "mismatch",  # a knob's value read back from what ran differs from the config's
    "dataloader",  # a DataLoader worker died
    "collective",  # a multi-device trial's collective timed out, or a peer rank vanished
    "nonfinite",  # loss became NaN or inf
    "timeout",  # the trial ran past its timeout and was killed
    "killed",  # the child died by a signal it did not send itself (e.g. host OOM-killer)
    "interrupted",  # the user stopped the sweep during this trial
    "lost",  # its worker died (kill -9, a lost machine): no heartbeat within the grace period
    "error",  # anything else: the message says what
)


# in a ``mismatch`` failure that every config of the space meets alike: a searched knob is read
# back from an object the program did not show sweeper (sweeper.trial.script.not_shown)
NOT_SHOWN = "which sweeper reads back from"
# in a ``mismatch`` failure of a loop whose sweeper.step block held one micro-batch where the
# config accumulates (sweeper.trial.engines.readback._script_fix)
BLOCK_FIX = "A `with sweeper.step(...)` block is one optimizer step"

# "per_device_batch_size: asked 8, ran 1" in a mismatch's message (``asked_ran`` writes it):
# the values as Python writes them (8, 0.5, 1e-05, True, 'sdpa'), a sentence's full stop not one
_VALUE = r"('(?:[^'\\]|\\.)*'|[-+\w]+(?:\.\w+)*)"
_ASKED_RAN = re.compile(rf"(\w+): asked {_VALUE}, ran {_VALUE}")


def asked_ran(knob: str, asked: Any, ran: Any) -> str:
    """One knob of a ``mismatch`` failure's message, as ``asked_and_ran`` reads it back.

    >>> asked_ran("attn_implementation", "sdpa", "eager")
    "attn_implementation: asked 'sdpa', ran 'eager'"
    """
    return f"{knob}: asked {asked!r}, ran {ran!r}"


def asked_and_ran(message: str) -> list[tuple[str, str, str]]:
    """(knob, asked, ran) of each ``asked_ran`` in a mismatch's message, the values as
    written.

    >>> asked_and_ran("did not run it as asked: per_device_batch_size: asked 8, ran 1; "
    ...               "learning_rate: asked 0.5, ran 1e-05; attn_implementation: asked 'sdpa', "
    ...               "ran 'eager'. Make your script read them")
    [('per_device_batch_size', '8', '1'), ('learning_rate', '0.5', '1e-05'), \
('attn_implementation', "'sdpa'", "'eager'")]
    >>> asked_and_ran("devices: asked 2, ran 1: rank 0 reached its first step alone")
    [('devices', '2', '1')]
    """
    return _ASKED_RAN.findall(message)


def mismatched_knobs(message: str) -> list[str]:
    """The knobs a mismatch's message names: those ``asked_ran`` wrote, and a max_seq_length
    whose batches were wider than asked ("max_seq_length: asked 256, a batch was 300 ...").

    >>> mismatched_knobs("max_seq_length: asked 256, a batch was 300 tokens wide; "
    ...                  "num_workers: asked 2, ran 0")
    ['max_seq_length', 'num_workers']
    """
    return re.findall(r"(\w+): asked ", message)


class SweeperError(Exception):
    """Root of every error sweeper raises on purpose."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived (``docker stop``, Kubernetes, systemd): stopped as Ctrl-C stops, so the
    running trial's process group is killed and the trial is marked interrupted; the exit
    code is 143 (128 + SIGTERM) instead of 130."""


class SpaceError(SweeperError):
    """A space file cannot be used; the message names the file, the field and the line."""


class CatalogError(SweeperError):
    """A GPU catalog cannot be used (``sweeper.catalog``), or names no GPU type asked for; the
    message names the file, the line and the field, or the keys the catalog has."""


class SettingsError(SweeperError):
    """A ``SWEEPER_*`` environment variable cannot be used; the message names each variable
    and what to write, never its value (a token is a secret)."""


class StorageError(SweeperError):
    """The storage URL is invalid or the database cannot be reached."""


class DatabaseLostError(StorageError):
    """A running sweep lost its database for longer than it waits (``database_retry_s``): it
    stops, and its worker is left for the reaper, which marks the trial in flight lost and
    queues its config again once the database answers."""


class DiskFullError(StorageError):
    """The database could not write: its disk is full. Said at once, with where and how much
    is free; waiting would not help."""


class StudyNotFoundError(SweeperError):
    """No study of that name exists in the storage."""


class NoResultError(SweeperError):
    """The study has no completed trial yet, so nothing can be recommended."""


class TruncatesOnlyError(NoResultError):
    """Every completed trial that meets the constraints truncates the data. ``fix`` is the one
    change to the space that gives an answer; ``fallback`` the recommendation if truncation
    were allowed (a ``Recommendation``), with its cut."""

    def __init__(self, message: str, *, fix: str, fallback: object | None = None) -> None:
        super().__init__(message)
        self.fix, self.fallback = fix, fallback


class NothingMeetsError(NoResultError):
    """No study of the workload has a config that meets the constraints, and no GPU offer
    (measured or estimated) would. ``offers`` is the table that says so (an ``OfferTable``,
    each row marked; None when the table was not asked for)."""

    def __init__(self, message: str, *, offers: object | None = None) -> None:
        super().__init__(message)
        self.offers = offers


class ConflictError(SweeperError):
    """The request does not fit the study's current state, e.g. deleting a running study."""


class PrepareError(SweeperError):
    """The dataset or tokenizer could not be prepared, so no trial can run."""


class TrialError(SweeperError):
    """A trial failed in a way the child recognised; ``kind`` is one of FAILURE_KINDS."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message


def json_line_error(line: bytes | str, error: ValueError) -> str:
    """Why one line of a .jsonl file is not JSON, placed on that line: ``json`` counts the
    line's own newline as a second line ("line 2 column 1" for a missing brace at the end),
    which beside the file's 1-based line number named two lines.

    >>> import json
    >>> line = b'{"messages": [{"role": "user", "content": "hi"}]\\n'
    >>> try:
    ...     json.loads(line)
    ... except ValueError as e:
    ...     json_line_error(line, e)
    "Expecting ',' delimiter at the end of the line (a bracket or brace left open?)"
    >>> try:
    ...     json.loads('{"a": 1, b}')
    ... except ValueError as e:
    ...     json_line_error('{"a": 1, b}', e)
    'Expecting property name enclosed in double quotes at column 10'
    >>> try:
    ...     json.loads('{"text": "cut off\\n')
    ... except ValueError as e:
    ...     json_line_error('{"text": "cut off\\n', e)
    'Invalid control character at the end of the line (a quote left open?)'
    """
    import json

    if not isinstance(error, json.JSONDecodeError):
        return str(error)
    text = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
    message = error.msg.removesuffix(" at")  # "Invalid control character at"
    if error.pos >= len(text.rstrip("\r\n")):
        quote = "control character" in message or "Unterminated string" in message
        likely = "a quote left open" if quote else "a bracket or brace left open"
        return f"{message} at the end of the line ({likely}?)"
    return f"{message} at column {error.pos + 1}"
