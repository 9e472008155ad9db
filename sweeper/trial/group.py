"""A trial on N devices: the trial child leads a group of N rank processes.

Each rank is ``python -m sweeper.trial.rank REQUEST RESULT`` with the environment
``torchrun --standalone --nproc-per-node N`` gives its workers (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, OMP_NUM_THREADS=1 unless set), so the model, the
data and ``torch.distributed`` see what the user's launch gives them (a script trial's rank
runs the user's program with it: ``sweeper.trial.script``). The ranks are started here
rather than by torchrun because torchrun's agent starts each worker in a new session: out of
reach of the launcher's kill of the trial's process group, so a timed-out or interrupted trial
would leave ranks behind. Here every rank stays in the trial's process group and dies with this
process (its parent-death signal).

The leader blocks in ``os.wait`` (no polling). The first rank to fail ends the group: the others
get SIGTERM, then SIGKILL, and are reaped before the result is written. The trial's failure is
the rank that failed first for a reason of its own (an exception, out of memory, a signal from
outside), not a rank that only saw its peer vanish; a collective that waits past
``trial.collective_timeout_s`` fails as ``collective``. On success the result is rank 0's (it
gathers the others' figures).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sweeper.knobs import MULTI_DEVICE_ENGINES
from sweeper.trial.progress import PROGRESS_ENV
from sweeper.trial.protocol import ChildRequest, ChildResult

RANK_ENV = "SWEEPER_RANK"  # set in a rank's environment: it trains instead of leading
_TERM_GRACE_S = 5.0


@dataclass
class _Rank:
    index: int
    process: subprocess.Popen[bytes]
    result_path: Path
    returncode: int | None = None
    exited_at: float = 0.0
    stopped: bool = False  # by the leader, after another rank failed

    def result(self) -> ChildResult | None:
        try:
            return ChildResult.model_validate_json(self.result_path.read_text())
        except (OSError, ValueError):
            return None


def run_group(request: ChildRequest, request_path: Path, result_path: Path) -> ChildResult:
    """Run the trial ``request`` on ``request.config.devices`` ranks; the group's result."""
    assert request.config is not None
    world = request.config.devices
    if request.workload.engine not in MULTI_DEVICE_ENGINES:
        return ChildResult(
            status="failed",
            failure_kind="unsupported",
            failure_message=f"devices {world}: the {request.workload.engine} engine trains on "
            f"one device so far (several: engine {' or '.join(MULTI_DEVICE_ENGINES)})",
        )
    if request.workload.script is not None:
        from sweeper.trial.script import devices_problem

        problem = devices_problem(request.workload.script.command, world)
        if problem is not None:
            return ChildResult(status="failed", failure_kind="unsupported", failure_message=problem)
    folder = result_path.parent / "ranks"
    folder.mkdir(exist_ok=True)
    port = free_port()
    launch: dict[str, str] = {}
    if request.workload.script is not None:  # the user's launch line, read once for all ranks
        from sweeper.trial.script import launch_for_ranks

        launch = launch_for_ranks(request, port)
    ranks: list[_Rank] = []
    try:
        for index in range(world):
            ranks.append(_start(index, world, port, request_path, folder, launch))
        return _wait(ranks)
    except BaseException:
        _stop(ranks)  # the leader's SIGTERM or an error here: no rank outlives it
        raise


def torchrun_threads(world: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The OMP_NUM_THREADS torchrun adds to its workers' environment: 1 where it starts
    several processes and the variable is not set (torch/distributed/run.py), else nothing.

    >>> torchrun_threads(2, {}), torchrun_threads(1, {})
    ({'OMP_NUM_THREADS': '1'}, {})
    """
    return {"OMP_NUM_THREADS": "1"} if world > 1 and "OMP_NUM_THREADS" not in environ else {}


def free_port() -> int:
    """A port for the group's rendezvous (torchrun --standalone picks one the same way)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(
    index: int, world: int, port: int, request_path: Path, folder: Path, launch: dict[str, str]
) -> _Rank:
    env = dict(os.environ) | launch
    env.update(
        RANK=str(index),
        LOCAL_RANK=str(index),
        GROUP_RANK="0",
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        SWEEPER_PARENT_PID=str(os.getpid()),
        **{RANK_ENV: str(index)},
    )
    env |= torchrun_threads(world, env)
    if index != 0:
        env.pop(PROGRESS_ENV, None)  # rank 0 tells the parent where the trial is
    result_path = folder / f"rank-{index}.json"
    process = subprocess.Popen(
        [sys.executable, "-m", "sweeper.trial.rank", str(request_path), str(result_path)],
        stdin=subprocess.DEVNULL,
        env=env,
        # no new session: the launcher's kill of the trial's process group reaches every rank
    )
    return _Rank(index, process, result_path)


def _wait(ranks: list[_Rank]) -> ChildResult:
    """Wait for every rank; at the first failure stop the rest. The group's result."""
    by_pid = {rank.process.pid: rank for rank in ranks}
    while any(r.returncode is None for r in ranks):
        pid, status = os.wait()
        rank = by_pid.get(pid)
        if rank is None:
            continue  # not a rank (nothing else is started here)
        _reaped(rank, status)
        if rank.returncode != 0:
            break
    _stop(ranks)
    return _verdict(ranks)


def _reaped(rank: _Rank, status: int) -> None:
    rank.returncode = os.waitstatus_to_exitcode(status)
    rank.process.returncode = rank.returncode  # reaped here: Popen must not wait again
    rank.exited_at = time.monotonic()


def _stop(ranks: list[_Rank]) -> None:
    """SIGTERM every rank still running, SIGKILL it after a grace period, reap it. A rank
    that had already exited keeps its own exit; one stopped here is marked ``stopped``."""
    for rank in ranks:
        if rank.returncode is None:
            pid, status = os.waitpid(rank.process.pid, os.WNOHANG)
            if pid:
                _reaped(rank, status)
    alive = [r for r in ranks if r.returncode is None]
    for rank in alive:
        rank.stopped = True
        with contextlib.suppress(ProcessLookupError):
            rank.process.send_signal(signal.SIGTERM)
            rank.process.send_signal(signal.SIGCONT)  # a stopped rank takes its SIGTERM now
    deadline = time.monotonic() + _TERM_GRACE_S
    for rank in alive:
        try:
            rank.returncode = rank.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rank.process.kill()
            rank.returncode = rank.process.wait()


def _verdict(ranks: list[_Rank]) -> ChildResult:
    world = len(ranks)
    if all(r.returncode == 0 for r in ranks):
        result = ranks[0].result()
        if result is not None:
            return result
        return _failed("error", f"rank 0 of {world} exited without a result")
    # the rank that failed for a reason of its own, first; a rank that only saw a peer vanish
    # or a collective time out is the effect, not the cause
    failed = sorted(
        (r for r in ranks if r.returncode not in (0, None) and not r.stopped),
        key=lambda r: (_is_effect(r), r.exited_at),
    )
    rank = failed[0]
    result = rank.result()
    if result is not None and result.status == "failed":
        stopped = [r.index for r in ranks if r.stopped]
        hung = (
            f" (rank {', '.join(map(str, stopped))} had not failed, so it is where the group "
            "waited)"
            if result.failure_kind == "collective" and stopped
            else ""
        )
        return result.model_copy(
            update={
                "failure_message": f"rank {rank.index} of {world}: {result.failure_message}; "
                f"the group was stopped{hung}"
            }
        )
    code = rank.returncode or 0
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (SIGKILL from outside: often the host's OOM killer)" if name == "SIGKILL" else ""
        return _failed(
            "killed", f"rank {rank.index} of {world} died by {name}{hint}; the group was stopped"
        )
    return _failed(
        "error",
        f"rank {rank.index} of {world} exited {code} without a result; the group was stopped",
    )


def _is_effect(rank: _Rank) -> bool:
    if rank.returncode is not None and rank.returncode < 0:
        return False  # a signal from outside: a cause
    result = rank.result()
    return result is not None and result.failure_kind == "collective"


def _failed(kind: str, message: str) -> ChildResult:
    return ChildResult(status="failed", failure_kind=kind, failure_message=message)
