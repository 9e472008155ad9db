"""Classify an exception raised in a trial into one of ``sweeper.errors.FAILURE_KINDS``.

Checks walk the whole chain (``__cause__`` / ``__context__``): torch.compile wraps the real error
(``BackendCompilerFailed``), DataLoader re-raises worker errors, transformers wraps import errors.
Matching is by class name and message so that this module needs no torch import.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Iterator

from sweeper.errors import TrialError

_UNSUPPORTED_MARKERS = (
    "flash_attn",
    "flashattention",
    "flash attention",
    "flexattention does not support",
    "does not support an attention implementation",
    "does not support flex",
    "not supported on cpu",
    "cuda requested but",
    "bf16 is not supported",
)


def chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and every cause/context behind it, each once."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def classify(exc: BaseException) -> tuple[str, str]:
    """Return (kind, message) for a trial failure; ``message`` is the most telling line."""
    links = list(chain(exc))
    for link in links:
        if isinstance(link, TrialError):
            return link.kind, link.message
    for link in links:
        if (message := _out_of_memory(link)) is not None:
            return "oom", message
    for link in links:
        text = str(link).lower()
        if any(marker in text for marker in _UNSUPPORTED_MARKERS):
            return "unsupported", _first_line(link)
    for link in links:
        if _collective(link):
            return "collective", f"{type(link).__name__}: {_first_line(link)}"
    for link in links:
        name = type(link).__name__
        if name in ("BackendCompilerFailed", "InductorError", "TorchRuntimeError", "Unsupported"):
            return "compile", f"{name}: {_first_line(link)}"
    for link in links:
        text = str(link)
        if "DataLoader worker" in text:
            return "dataloader", _first_line(link)
        # a worker killed while its batch's shared memory was being handed over: the reader
        # sees the dead worker's socket reset before torch's own worker check says so
        if isinstance(link, ConnectionResetError | EOFError | BrokenPipeError):
            frames = "".join(str(f.filename) for f in traceback.extract_tb(link.__traceback__))
            if "torch/utils/data" in frames or "resource_sharer" in frames:
                return "dataloader", f"a DataLoader worker died: {type(link).__name__}: {text}"
    return "error", f"{type(exc).__name__}: {_first_line(exc)}"


def _out_of_memory(exc: BaseException) -> str | None:
    """The message of an out-of-memory error: the device's, or the host's (Python's own
    allocation, torch's CPU allocator); None for anything else."""
    name, text = type(exc).__name__, str(exc).lower()
    if name == "OutOfMemoryError" or "out of memory" in text:
        return _first_line(exc)
    if name == "MemoryError" or "can't allocate memory" in text:
        return f"host memory: {name}: {_first_line(exc)}"
    return None


# what gloo and NCCL say when a collective waited too long or a peer rank vanished
_COLLECTIVE_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "timed out",
    "timeout",
    "watchdog",
)


# gloo's TCP transport's own words, which name no backend: a collective that waited past the
# group's timeout closes its pair ("Application timeout caused pair closure", without the
# file prefix the other messages carry: a loaded CI's rank 0 failed so, classified "error")
_GLOO_OWN = ("pair closure",)


def _collective(exc: BaseException) -> bool:
    text = str(exc).lower()
    name = type(exc).__name__
    distributed = (
        name == "DistBackendError"
        or "gloo" in text
        or "nccl" in text
        or any(words in text for words in _GLOO_OWN)
    )
    return distributed and any(marker in text for marker in _COLLECTIVE_MARKERS)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    return lines[0][:2000]


_RAISED = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failed|Unsupported))"
                     r"(?::\s*(.*))?$")  # fmt: skip


def classify_output(text: str) -> tuple[str, str]:
    """(kind, message) from what a program printed before it died: the exceptions of its
    Python traceback(s), innermost last, classified as if raised here (a user's script that
    ran out of CUDA memory is ``oom``); otherwise its last line.

    >>> classify_output("Traceback (most recent call last):\\n  ...\\n"
    ...                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB")
    ('oom', 'CUDA out of memory. Tried to allocate 2 GiB')
    >>> classify_output("Segmentation fault\\n")
    ('error', 'Segmentation fault')
    >>> classify_output("")
    ('error', 'it printed nothing')
    """
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    raised: BaseException | None = None
    for line in lines:
        match = _RAISED.match(line)
        if match is None:
            continue
        kind = type(match.group(1).rsplit(".", 1)[-1], (Exception,), {})
        current = kind(match.group(2) or "")
        current.__context__ = raised  # the chain, as Python printed it (outermost first)
        raised = current
    if raised is not None:
        return classify(raised)
    return "error", lines[-1][:2000] if lines else "it printed nothing"


_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
# the interpreter's own library and installed packages: not the program's own code
_NOT_OWN = re.compile(r"site-packages|dist-packages|/lib/python\d+\.\d+/|^<")


def raised_at(text: str, cwd: str | None = None) -> str | None:
    """Where the last traceback in ``text`` was raised in the program's own code: its innermost
    frame outside the interpreter's library and installed packages (else its innermost frame)
    as ``path:line`` (1-based, as Python prints it; relative to ``cwd`` when under it) with the
    source line Python showed; None when ``text`` holds no traceback.

    >>> raised_at(
    ...     "Traceback (most recent call last):\\n"
    ...     '  File "/w/train.py", line 18, in <module>\\n'
    ...     "    import nothere\\n"
    ...     '  File "/venv/lib/python3.11/site-packages/x.py", line 3, in f\\n'
    ...     "    raise ValueError\\n"
    ...     "ValueError: no", cwd="/w")
    'train.py:18 (import nothere)'
    >>> raised_at("Segmentation fault") is None
    True
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    frames: list[tuple[str, str, str]] = []
    for index in range(starts[-1] if starts else 0, len(lines)):
        match = _FRAME.match(lines[index])
        if match is None:
            continue
        # the frame's source line, indented under it (not the next frame, the exception or
        # 3.11's ^^^ markers)
        source = lines[index + 1] if index + 1 < len(lines) else ""
        if not source.startswith("    ") or _FRAME.match(source) or set(source) <= set("^~ "):
            source = ""
        source = source.strip()
        frames.append((match.group(1), match.group(2), source))
    if not frames:
        return None
    own = [frame for frame in frames if not _NOT_OWN.search(frame[0])]
    path, line, source = (own or frames)[-1]
    if cwd is not None and path.startswith(cwd.rstrip("/") + "/"):
        path = path[len(cwd.rstrip("/")) + 1 :]
    return f"{path}:{line}" + (f" ({source[:200]})" if source else "")
