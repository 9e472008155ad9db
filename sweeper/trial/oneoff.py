"""One-off costs a study measures once and prices in every trial: the checkpoint save and the
cold ``torch.compile``.

A real run pays both, so $/run counts them, but neither depends on the knobs a sweep varies
most, and on a GPU they dominated a trial: a 1.1B model's checkpoint took 23-27 s of an 84 s
trial whose timed window was 23 s. So:

- **checkpoint**: the save's cost depends on the bytes written and the disk, not on the batch or
  the sequence length. The first trial of each *state signature* (what ``save_pretrained`` and
  the optimizer write: the model's class, config and parameter bytes per dtype, the adapter, the
  optimizer class, whether its state is saved, the directory and host) saves, fsyncs and times
  one checkpoint; later trials with the same signature reuse that figure and say so
  (``checkpoint_source: reused``). A different signature measures again.
- **compile**: Inductor and Triton cache what they compile on disk. Trials whose compiled graphs
  are the same (the config less its DataLoader knobs, the model, torch's version) share one
  cache directory, so a repeated shape compiles warm. What $/run counts stays the cold compile
  the user's run pays: the first trial of the signature compiles into an empty cache and its
  burn-in excess is kept beside the cache (``cold.json``); later trials record what they
  measured (``compile_measured_s``, warm) and price the cold figure.

Everything lives under the study's directory in the cache (``<cache_dir>/studies/<study>/``),
so a study shares with itself and with nothing else. Several workers on one host take turns
through file locks: a trial that finds another one compiling the same signature cold right now
compiles cold into a private cache instead (and records what it measured).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

# The knobs that only shape the DataLoader: they change no compiled graph.
LOADER_ONLY_KNOBS = (
    "num_workers",
    "prefetch_factor",
    "persistent_workers",
    "multiprocessing_context",
    "pin_memory",
)


def study_dir(cache_dir: Path, study: str | None) -> Path | None:
    """Where a study keeps what its trials share; None for a request of no study (doctor's
    probes, a bench's single trial), which then shares nothing."""
    if not study:
        return None
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", study)[:80]
    digest = hashlib.sha256(study.encode()).hexdigest()[:8]  # two names that sanitize alike
    return cache_dir / "studies" / f"{safe}-{digest}"


def signature(values: Mapping[str, Any]) -> str:
    """A short stable hash of ``values`` (JSON with sorted keys)."""
    text = json.dumps(values, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _write_json(path: Path, value: Any) -> None:
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(value, indent=1, sort_keys=True))
    partial.replace(path)


def _read_json(path: Path) -> Any:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    return None


class CheckpointCosts:
    """The study's measured checkpoint saves, by state signature (``checkpoints.json``)."""

    def __init__(self, root: Path) -> None:
        self.path = root / "checkpoints.json"
        self.lock = root / "checkpoints.lock"

    def get(self, state: str) -> dict[str, Any] | None:
        entry = (_read_json(self.path) or {}).get(state)
        return entry if isinstance(entry, dict) and "save_s" in entry else None

    def put(self, state: str, save_s: float, size: int) -> None:
        with _locked(self.lock):
            table = _read_json(self.path) or {}
            table.setdefault(
                state, {"save_s": save_s, "bytes": size, "measured_at": time.time()}
            )  # the first measurement stands: later trials were told it
            _write_json(self.path, table)


@dataclass
class CompileSlot:
    """Where this trial's compile caches are, and what the study knows of its shape."""

    signature: str
    directory: Path | None  # the shared cache; None: a private one (another trial compiles)
    cold_s: float | None  # the cold compile measured by an earlier trial; None: this one is cold
    _lock: IO[str] | None = None

    @property
    def warm(self) -> bool:
        return self.cold_s is not None

    def record_cold(self, seconds: float) -> None:
        """Keep this trial's cold compile beside the cache it filled, and let others in."""
        if self.directory is None or self.warm:
            return
        _write_json(
            self.directory / "cold.json", {"compile_s": seconds, "measured_at": time.time()}
        )
        self.release()

    def release(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None


def compile_slot(root: Path, graph: Mapping[str, Any]) -> CompileSlot:
    """Point Inductor and Triton at the study's cache for ``graph`` (what decides the compiled
    graphs) and say whether it is warm. Call before anything compiles: both read their
    directory from the environment when they first need it."""
    key = signature(graph)
    directory = root / "compile" / key
    directory.mkdir(parents=True, exist_ok=True)
    handle = (directory / "lock").open("a")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # another trial compiles this shape cold right now: a private cold cache, as before
        handle.close()
        return CompileSlot(key, None, None)
    cold = _read_json(directory / "cold.json")
    if isinstance(cold, dict) and isinstance(cold.get("compile_s"), (int, float)):
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()
        _use(directory)
        return CompileSlot(key, directory, float(cold["compile_s"]))
    # no cold figure: whatever a failed earlier trial left would make this compile warm
    for part in ("inductor", "triton"):
        shutil.rmtree(directory / part, ignore_errors=True)
    _use(directory)
    return CompileSlot(key, directory, None, handle)  # the lock is held until record_cold


def _use(directory: Path) -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(directory / "inductor")
    os.environ["TRITON_CACHE_DIR"] = str(directory / "triton")


def graph_signature(
    config: Mapping[str, Any], workload: Mapping[str, Any], torch_version: str
) -> dict[str, Any]:
    """What decides the graphs ``torch.compile`` builds for a trial: the config less its
    DataLoader knobs, the workload's model, tokenizer, adapter and engine, torch and the host.

    >>> a = graph_signature({"per_device_batch_size": 8, "num_workers": 0}, {}, "2.13")
    >>> b = graph_signature({"per_device_batch_size": 8, "num_workers": 4}, {}, "2.13")
    >>> signature(a) == signature(b)
    True
    """
    return {
        "config": {k: v for k, v in config.items() if k not in LOADER_ONLY_KNOBS},
        "workload": workload,
        "torch": torch_version,
        "host": socket.gethostname(),
    }


def timed_group_save(
    ranks: Any, folder: Path, write: Callable[[], None], what: str
) -> dict[str, Any]:
    """One checkpoint saved by every rank of a trial's group into ``folder`` (made by rank
    0), timed from a barrier to the last rank's end with each file fsync'd (on the disk, not
    just in the page cache), its size read by every rank, then deleted. ``write`` is the save
    each rank makes (distributed checkpoint's shards, the Trainer's DeepSpeed save); ``what``
    names it in the error a failed write gives."""
    import torch.distributed as dist

    from sweeper.errors import TrialError

    try:
        if ranks.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
        dist.barrier(group=ranks.host_group)
        started = time.perf_counter()
        write()
        for path in folder.rglob("*"):
            if path.is_file():
                with path.open("rb") as f:
                    os.fsync(f.fileno())
        dist.barrier(group=ranks.host_group)
        save_s = time.perf_counter() - started
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        dist.barrier(group=ranks.host_group)  # every rank has read the size
    except OSError as e:
        raise TrialError(
            "error", f"saving {what} under {folder.parent} failed: {e.strerror or e}"
        ) from e
    finally:
        if ranks.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    return {"checkpoint_save_s": save_s, "checkpoint_bytes": size, "checkpoint_source": "measured"}
