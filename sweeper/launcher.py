"""Run one child (prepare or trial) in its own process group and wait, with a hard timeout.

The wait blocks in the kernel (``Popen.wait``), no polling loop. On timeout or interrupt the
whole group — the child and its DataLoader workers — gets SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from sweeper.trial.protocol import ChildRequest, ChildResult

_TERM_GRACE_S = 5.0
_LOG_TAIL_CHARS = 4000


@dataclass(frozen=True, kw_only=True)
class ChildRun:
    result: ChildResult
    wall_s: float
    log_tail: str
    pid: int  # also the process group id of the child and its DataLoader workers


def run_child(request: ChildRequest, *, timeout_s: float, workdir: Path | None = None) -> ChildRun:
    """Start ``python -m sweeper.trial``; return its result, or a classified failure."""
    with tempfile.TemporaryDirectory(prefix="sweeper-trial-", dir=workdir) as tmp:
        tmp_path = Path(tmp)
        request_path, result_path = tmp_path / "request.json", tmp_path / "result.json"
        log_path = tmp_path / "child.log"
        env = dict(os.environ)
        env.update(
            SWEEPER_PARENT_PID=str(os.getpid()),
            PYTHONUNBUFFERED="1",
            TOKENIZERS_PARALLELISM="false",
            # per-trial Inductor cache: otherwise compile times become warm-cache numbers
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
            TRITON_CACHE_DIR=str(tmp_path / "triton"),
            HF_DATASETS_CACHE=str(Path(request.cache_dir) / "hf-datasets"),
        )
        request = request.model_copy(update={"spawned_at": time.time()})
        request_path.write_text(request.model_dump_json())
        started = time.perf_counter()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "sweeper.trial", str(request_path), str(result_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: one killpg reaches the workers
            )
            try:
                returncode = process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                kill_group(process)
                return ChildRun(
                    result=ChildResult(
                        status="failed",
                        failure_kind="timeout",
                        failure_message=f"no result after {timeout_s:g} s; the trial's process "
                        "group was killed (raise trial.timeout_s if this config is just slow)",
                    ),
                    wall_s=time.perf_counter() - started,
                    log_tail=_tail(log_path),
                    pid=process.pid,
                )
            except BaseException:
                kill_group(process)
                raise
        wall_s = time.perf_counter() - started
        log_tail = _tail(log_path)
        # the child is gone; sweep up any DataLoader worker it left behind
        _signal_group(process.pid, signal.SIGKILL)
        return ChildRun(
            result=_read_result(result_path, returncode, log_tail),
            wall_s=wall_s,
            log_tail=log_tail,
            pid=process.pid,
        )


def _read_result(path: Path, returncode: int, log_tail: str) -> ChildResult:
    if path.is_file():
        try:
            return ChildResult.model_validate_json(path.read_text())
        except ValidationError as e:
            return ChildResult(
                status="failed",
                failure_kind="error",
                failure_message=f"unreadable trial result: {e}",
            )
    if returncode < 0:
        sig = signal.Signals(-returncode).name
        hint = " (SIGKILL from outside: often the host's OOM killer)" if sig == "SIGKILL" else ""
        return ChildResult(
            status="failed",
            failure_kind="killed",
            failure_message=f"trial process died by {sig}{hint}",
            traceback=log_tail,
        )
    last = next((ln for ln in reversed(log_tail.splitlines()) if ln.strip()), "no output")
    return ChildResult(
        status="failed",
        failure_kind="error",
        failure_message=f"trial process exited {returncode} without a result: {last}",
        traceback=log_tail,
    )


def kill_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's process group, wait a grace period, then SIGKILL it."""
    _signal_group(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=_TERM_GRACE_S)
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-_LOG_TAIL_CHARS:].decode("utf-8", errors="replace")
