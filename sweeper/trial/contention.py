"""Was the machine shared while the window was timed? What the child reads around its window.

- **Other processes' CPU time**: the host's busy CPU time (``/proc/stat``) less that of this
  trial's own process tree (the child and its DataLoader workers, from ``/proc/<pid>/stat``),
  as CPUs' worth over the window. A trial's own workers are not contention; a second sweep,
  a compile job or ``stress-ng`` is.
- **Steal**: the share of CPU time the hypervisor gave to other guests (``/proc/stat``).
- **Other processes on the GPU**: compute processes NVML (``nvidia-ml-py``, when it imports)
  or ``nvidia-smi`` lists on the trial's GPU besides the child, at either edge of the window.

``sweeper.noise.contention`` decides from these whether the measurement counts as contended.
Nothing here imports torch; a reading that fails (no /proc, no NVML) is None, never a guess.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.noise import contention

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class _Reading:
    at: float  # time.monotonic()
    busy_ticks: int | None  # every CPU's non-idle ticks since boot
    total_ticks: int | None
    steal_ticks: int | None
    own_ticks: int | None  # this process tree's user + system ticks
    gpu_others: int | None


def proc_stat() -> tuple[int, int, int] | None:
    """(busy, total, steal) ticks of all CPUs since boot."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        if fields[0] != "cpu":
            return None
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, fields[1:9])
        # guest time is already counted in user and nice
        busy = user + nice + system + irq + softirq + steal
        return busy, busy + idle + iowait, steal
    return None


def tree_ticks(root: int) -> int | None:
    """User + system ticks of ``root`` and its descendants alive now (their threads included)."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(f"/proc/{entry}/stat").read_text()
            # the command name may hold spaces and parentheses: fields follow the last ")"
            rest = text[text.rindex(")") + 2 :].split()
            pid = int(entry)
            parents[pid] = int(rest[1])
            ticks[pid] = int(rest[11]) + int(rest[12])
    if root not in ticks:
        return None
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo += children.get(pid, [])
    return total


def _gpu_others(device_index: int | None) -> int | None:
    """Compute processes on the GPU other than this one, or None when it cannot be read."""
    if device_index is None:
        return None
    with contextlib.suppress(Exception):  # NVML raises its own error types
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            return _others(len(processes))
        finally:
            pynvml.nvmlShutdown()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
        out = subprocess.run(
            [smi, f"--id={device_index}", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return _others(sum(1 for line in out.split() if line.strip().isdigit()))
    return None


def _others(listed: int) -> int:
    """Compute processes on the GPU besides the trial. The trial holds a context on it while
    its window runs, so it is always one of those listed; inside a container NVML lists host
    PIDs, which never equal ours, so it is discounted by count, not by PID.

    >>> _others(1), _others(3), _others(0)
    (0, 2, 0)
    """
    return max(0, listed - 1)


class HostWatch:
    """Readings at the two edges of the timed window; ``stop()`` returns the measurement's
    contention fields. ``device_index``: the CUDA device the trial runs on (None on a CPU)."""

    def __init__(self, device_index: int | None = None) -> None:
        self.device_index = device_index
        self._start: _Reading | None = None

    def _read(self) -> _Reading:
        stat = proc_stat()
        return _Reading(
            at=time.monotonic(),
            busy_ticks=None if stat is None else stat[0],
            total_ticks=None if stat is None else stat[1],
            steal_ticks=None if stat is None else stat[2],
            own_ticks=tree_ticks(os.getpid()),
            gpu_others=_gpu_others(self.device_index),
        )

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> dict[str, Any]:
        if self._start is None:
            raise RuntimeError("HostWatch.stop() before start()")
        a, b = self._start, self._read()
        seconds = b.at - a.at
        others_cpu = steal_share = None
        if seconds > 0 and None not in (a.busy_ticks, b.busy_ticks, a.own_ticks, b.own_ticks):
            busy = (b.busy_ticks or 0) - (a.busy_ticks or 0)
            own = (b.own_ticks or 0) - (a.own_ticks or 0)
            # a worker that exited in the window takes its ticks with it: never below zero
            others_cpu = max(0.0, (busy - own) / _TICKS / seconds)
        if None not in (a.total_ticks, b.total_ticks, a.steal_ticks, b.steal_ticks):
            total = (b.total_ticks or 0) - (a.total_ticks or 0)
            if total > 0:
                steal_share = ((b.steal_ticks or 0) - (a.steal_ticks or 0)) / total
        gpu = [n for n in (a.gpu_others, b.gpu_others) if n is not None]
        gpu_others = max(gpu) if gpu else None
        cpu_count = os.cpu_count()
        reason = contention(
            others_cpu=others_cpu,
            cpu_count=cpu_count,
            steal_share=steal_share,
            gpu_other_processes=gpu_others,
        )
        return {
            "host_others_cpu": others_cpu,
            "cpu_steal_share": steal_share,
            "gpu_other_processes": gpu_others,
            "contended": reason is not None,
            "contention": reason,
        }
