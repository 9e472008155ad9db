"""Fork server: import torch & co. once, preload the sweep's data, fork one child per trial.

``python -m sweeper.trial.zygote REPLY_FD`` reads JSON lines on stdin and answers on REPLY_FD:

    {"op": "preload", "request": PATH}              → {"op": "preloaded", "s": 1.2}
                                                      or {"op": "preload_failed", "error": "..."}
    {"op": "run", "request": P, "result": P, "log": P, "env": {...}}
                                                    → {"op": "started", "pid": 123}
    (later)                                         → {"op": "exited", "pid": 123, "code": 0}

``code`` is the exit status, or minus the signal that killed the child. Each child gets its own
session (so one ``killpg`` reaches its DataLoader workers), dies with the zygote, and the zygote
dies with the sweeper. The zygote stays single-threaded and never runs a tensor op or touches
CUDA: forking after either is unsafe.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from pathlib import Path
from typing import Any


def _reply(fd: int, message: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _child(message: dict[str, Any], zygote_pid: int, inherited_fds: tuple[int, ...]) -> None:
    """In the forked child: detach, redirect output, run the request, never return."""
    started_at = time.time()
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited_fds:  # the zygote's pipes are not the trial's business
            os.close(fd)
        from sweeper.trial.lifeline import die_with_parent

        die_with_parent(zygote_pid)
        log = os.open(message["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for unwatch in _unwatch:  # the trial runs torch as the user's run does
            unwatch()
        if os.environ.pop("SWEEPER_ZYGOTE_SET_NVML_CHECK", None):
            os.environ.pop(NVML_CHECK, None)  # the trial sees the environment its run will have
        os.environ.update(message.get("env", {}))
        import tempfile

        tempfile.tempdir = None  # the trial's TMPDIR, not the one the zygote cached
        from sweeper.trial.runner import execute

        execute(Path(message["request"]), Path(message["result"]), started_at)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except BaseException:
        import traceback

        traceback.print_exc()
        os._exit(70)


def _preload(request_path: str) -> None:
    from sweeper.trial.protocol import ChildRequest
    from sweeper.trial.workload import preload

    request = ChildRequest.model_validate_json(Path(request_path).read_text())
    assert request.prepared is not None
    preload(request.workload, request.prepared, Path(request.cache_dir))


# torch.cuda.is_available() asks the CUDA runtime (cudaGetDeviceCount, which runs cuInit) unless
# this is set, and that call alone "poisons fork": torch marks every child forked afterwards,
# whose first CUDA call then fails as if the parent had opened the context, though
# torch.cuda.is_initialized() still says False here. Packages ask at import (transformers' checks
# for bitsandbytes and flash-attn, deepspeed's accelerator). With it set, torch counts the devices
# through NVML, which forks safely; the zygote sets it for itself only, never for the trials.
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
# who called the CUDA runtime's device count in this process (file:line of the caller), if anyone:
# where NVML cannot answer, torch falls back to it, and the fork is poisoned all the same
_runtime_counted: list[str] = []
_unwatch: list[Any] = []  # puts torch's own function back (in a forked child)


def watch_device_count() -> None:
    """Record each call of the CUDA runtime's device count made in this process (a CUDA build
    only: a CPU build has no such call, and nothing to poison)."""
    import traceback

    import torch

    counted = getattr(torch._C, "_cuda_getDeviceCount", None)
    if counted is None or getattr(counted, "_sweeper_watched", False):
        return
    me = os.getpid()

    def watched() -> int:
        if os.getpid() == me and not _runtime_counted:
            callers = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename]
            caller = callers[-1] if callers else None
            _runtime_counted.append(f"{caller.filename}:{caller.lineno}" if caller else "?")
        return int(counted())

    watched._sweeper_watched = True  # type: ignore[attr-defined]
    torch._C._cuda_getDeviceCount = watched
    _unwatch.append(lambda: setattr(torch._C, "_cuda_getDeviceCount", counted))


def cuda_touched(during: str) -> str | None:
    """Why this process can no longer fork trials, if ``during`` initialized CUDA or asked the
    CUDA runtime for its devices: a child forked after either fails at its first CUDA call
    ("Cannot re-initialize CUDA in forked subprocess"). Packages do this at import: torchao
    (which transformers' model code imports whenever it is installed) asks triton whether the
    device can run it, and that call opens the CUDA context."""
    import torch

    suspects = [name for name in ("torchao", "liger_kernel", "deepspeed", "bitsandbytes")
                if name in sys.modules]  # fmt: skip
    imported = f" (imported by then: {', '.join(suspects)})" if suspects else ""
    if torch.cuda.is_initialized():
        return f"{during} initialized CUDA in the fork server{imported}"
    if _runtime_counted:
        return (
            f"{during} asked the CUDA runtime for its devices in the fork server (from "
            f"{_runtime_counted[0]}){imported}, which makes CUDA unusable in a forked child"
        )
    return None


def _preload_and_reply(request_path: str, reply_fd: int) -> bool:
    """Preload and say how it went; False when the preload opened CUDA (``cuda_touched``)."""
    started = time.perf_counter()
    try:
        _preload(request_path)
    except Exception as exc:  # the trials will fail and say why
        _reply(reply_fd, {"op": "preload_failed", "error": repr(exc)})
        return True
    unfit = cuda_touched("loading the model's code and the data")
    if unfit is not None:
        _reply(reply_fd, {"op": "preload_failed", "unfit": unfit})
        return False
    _reply(reply_fd, {"op": "preloaded", "s": time.perf_counter() - started})
    return True


def _import_for_trials() -> None:
    """The imports every trial needs (a forked child finds them done), with the device count
    asked of NVML and any call to the CUDA runtime's count recorded (``cuda_touched``)."""
    if NVML_CHECK not in os.environ:
        os.environ[NVML_CHECK] = "1"
        os.environ["SWEEPER_ZYGOTE_SET_NVML_CHECK"] = "1"  # the children drop both again
    import torch  # noqa: F401

    watch_device_count()
    import datasets  # noqa: F401
    import tokenizers  # noqa: F401
    import transformers  # noqa: F401

    import sweeper.trial.measure  # noqa: F401
    import sweeper.trial.probe  # noqa: F401

    _import_model_code()


def _import_model_code() -> None:
    """transformers' model-independent model code (modeling_utils, and with it activations,
    the loading code, torch.distributed.tensor, accelerate's and DeepSpeed's integrations):
    ``import transformers`` is lazy, so without this every trial forked from a zygote that was
    not preloaded with its model's code (run_child's fork server in the tests, a model given by
    its directory) imported it itself: 4-5 CPU-s of each child's ~6 on a tiny model. Skipped
    where torchao is installed, as the preload skips the model's code (workload.preload): that
    code imports torchao, which opens CUDA at import, and the zygote could fork nothing. A
    trial that cannot import it says why itself (a script trial never needs it)."""
    import contextlib
    import importlib.util

    if importlib.util.find_spec("torchao") is not None:
        return
    with contextlib.suppress(Exception):
        import transformers.modeling_utils  # noqa: F401


def main(reply_fd: int) -> None:
    started = time.perf_counter()
    parent = os.environ.get("SWEEPER_PARENT_PID")
    from sweeper.trial.lifeline import die_with_parent

    die_with_parent(int(parent) if parent else None)
    _import_for_trials()
    # SIGCHLD wakes the select loop through a self-pipe; no thread is ever started.
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    # a real run pays these imports at start-up; forked trials inherit them
    ready: dict[str, Any] = {"op": "ready", "imports_s": time.perf_counter() - started}
    unfit = cuda_touched("importing torch, transformers and sweeper's trial code")
    if unfit is not None:
        ready["unfit"] = unfit
    _reply(reply_fd, ready)
    buffer = b""
    while True:
        try:
            readable, _, _ = select.select([0, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            os.read(wake_r, 4096)
            while True:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                _reply(
                    reply_fd,
                    {"op": "exited", "pid": pid, "code": os.waitstatus_to_exitcode(status)},
                )
        if 0 in readable:
            chunk = os.read(0, 65536)
            if not chunk:
                return  # the sweeper closed our stdin: done
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if message["op"] == "preload":
                    if not _preload_and_reply(message["request"], reply_fd):
                        return  # CUDA is open here: no child may be forked any more
                elif message["op"] == "run":
                    pid = os.fork()
                    if pid == 0:
                        _child(message, os.getppid(), (wake_r, wake_w, reply_fd))
                    _reply(reply_fd, {"op": "started", "pid": pid})


if __name__ == "__main__":
    main(int(sys.argv[1]))
