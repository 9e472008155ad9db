"""The environment variables that change how torch, CUDA and NCCL run, as a trial was started
with them: the allocator's configuration (PYTORCH_CUDA_ALLOC_CONF changes peak memory), the
visible devices, NCCL's transport, the CPU threads. Cache and install paths are left out: they
differ per trial and change nothing measured.

The trial's start is what counts, not its end: packages set some of these for themselves as
they are imported (deepspeed sets PYTORCH_NVML_BASED_CUDA_CHECK), in the trial as in the user's
run. ``snapshot`` is called by the trial's entry (``runner.execute``) before anything else; a
process that never took one (a user's script, whose recorder runs in its own process) reads
its environment when the measurement is written."""

from __future__ import annotations

import os

PREFIXES = ("PYTORCH_", "TORCH_", "CUDA_", "NCCL_")
NAMES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
_started_with: dict[str, str] | None = None


def _read() -> dict[str, str]:
    return {
        name: value
        for name, value in sorted(os.environ.items())
        if (name.startswith(PREFIXES) or name in NAMES)
        and not name.endswith(("_DIR", "_PATH", "_HOME", "_FILE", "_ROOT"))
    }


def snapshot() -> None:
    """Keep the environment this process was started with (its trial's start)."""
    global _started_with
    _started_with = _read()


def runtime_env() -> dict[str, str]:
    """The variables as the trial was started with them (as they are now, if no snapshot)."""
    return dict(_started_with) if _started_with is not None else _read()
