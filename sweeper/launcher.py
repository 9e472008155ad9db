"""Run one child (prepare, probe or trial) in its own process group, with a hard timeout.

Two ways to start it, one way to wait: a plain ``python -m sweeper.trial`` process, or a fork of
the sweep's ``ForkServer`` (torch and the data already loaded, so a trial starts in
milliseconds instead of seconds). Waiting blocks in the kernel (``Popen.wait`` or ``select`` on
the fork server's pipe), never a polling loop. On timeout or interrupt the whole group — the
child and its DataLoader workers — gets SIGTERM, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from sweeper.trial.progress import PROGRESS_ENV, describe, read_progress
from sweeper.trial.protocol import ChildRequest, ChildResult

_TERM_GRACE_S = 5.0
_LOG_TAIL_CHARS = 4000


@dataclass(frozen=True, kw_only=True)
class ChildRun:
    result: ChildResult
    wall_s: float
    log_tail: str
    pid: int  # also the process group id of the child and its DataLoader workers
    # start-up a forked child inherited from the zygote (imports, preloaded data): a real
    # run pays it, so it is added to the child's own start-up
    inherited_startup_s: float = 0.0


class _Handle(Protocol):
    pid: int

    def wait(self, timeout: float | None) -> int | None:
        """The exit code (minus the signal number if killed), or None on timeout."""
        ...


def child_env(cache_dir: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SWEEPER_PARENT_PID=str(os.getpid()),
        PYTHONUNBUFFERED="1",
        TOKENIZERS_PARALLELISM="false",
        HF_DATASETS_CACHE=str(Path(cache_dir) / "hf-datasets"),
    )
    return env


def run_child(
    request: ChildRequest,
    *,
    timeout_s: float,
    workdir: Path | None = None,
    server: ForkServer | None = None,
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> ChildRun:
    """Run ``request`` in a child; return its result, or a classified failure. ``python``:
    the interpreter to spawn it with instead of this one (a user's script's, whose torch and
    kernels are what its trials run on); the fork server is then not used. ``env``: set in
    the child's environment (the devices its worker holds for it: CUDA_VISIBLE_DEVICES)."""
    sweep_stale_trial_dirs(workdir)
    prefix = f"{TRIAL_DIR_PREFIX}{os.getpid()}-"  # the owner: see sweep_stale_trial_dirs
    with (
        tempfile.TemporaryDirectory(prefix=prefix, dir=workdir) as tmp,
        _owned(Path(tmp)),
    ):
        tmp_path = Path(tmp)
        request_path, result_path = tmp_path / "request.json", tmp_path / "result.json"
        log_path = tmp_path / "child.log"
        (tmp_path / "tmp").mkdir()
        per_child_env = {
            # per-trial Inductor/Triton caches: otherwise compile times become warm-cache numbers
            "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
            "TRITON_CACHE_DIR": str(tmp_path / "triton"),
            PROGRESS_ENV: str(tmp_path / "progress.json"),
            # the child's temporary files (DataLoader workers' pymp-* among them) go with it
            "TMPDIR": str(tmp_path / "tmp"),
            **(env or {}),
        }
        request = request.model_copy(update={"spawned_at": time.time()})
        request_path.write_text(request.model_dump_json())
        started = time.perf_counter()
        handle: _Handle | None = None
        inherited_startup_s = 0.0
        if server is not None and server.alive and python is None:
            with contextlib.suppress(RuntimeError, OSError):  # a dead zygote: spawn instead
                handle = server.start(request_path, result_path, log_path, per_child_env)
                inherited_startup_s = server.startup_s
        if handle is None:
            handle = _Spawned(
                request_path,
                result_path,
                log_path,
                {**child_env(request.cache_dir), **per_child_env},
                python=python or sys.executable,
            )
        try:
            returncode = handle.wait(timeout_s)
        except BaseException:
            _kill_group(handle)
            raise
        if returncode is None:
            _kill_group(handle)
            return ChildRun(
                result=ChildResult(
                    status="failed",
                    failure_kind="timeout",
                    failure_message=f"no result after {timeout_s:g} s; "
                    f"{describe(read_progress(tmp_path / 'progress.json'))}; the process "
                    "group was killed (raise trial.timeout_s if this config is just slow)",
                ),
                wall_s=time.perf_counter() - started,
                log_tail=_tail(log_path),
                pid=handle.pid,
                inherited_startup_s=inherited_startup_s,
            )
        wall_s = time.perf_counter() - started
        # the child is gone; sweep up any DataLoader worker it left behind
        _signal_group(handle.pid, signal.SIGKILL)
        log_tail = _tail(log_path)
        return ChildRun(
            result=read_result(result_path, returncode, log_tail),
            wall_s=wall_s,
            log_tail=log_tail,
            pid=handle.pid,
            inherited_startup_s=inherited_startup_s,
        )


TRIAL_DIR_PREFIX = "sweeper-trial-"
OWNER_LOCK = "owner.lock"
# a directory without its lock this young may be one whose owner has not taken it yet
_UNLOCKED_GRACE_S = 120.0
_swept: set[str] = set()


@contextlib.contextmanager
def _owned(directory: Path) -> Iterator[None]:
    """Hold an exclusive flock on the trial directory's lock file while the directory is in
    use: the kernel drops it when its holder dies, even by SIGKILL, and other processes see
    it whatever PID namespace they run in (the pid in the name does not tell them)."""
    # locked under another name, then renamed into place (the lock goes with the file): a
    # sweeper never sees the lock file unheld while its owner lives. It once saw one between
    # its creation and its flock, took the owner for dead, and removed a directory being made
    # (CI: two launches starting at once)
    making = directory / f".{OWNER_LOCK}.{os.getpid()}"
    with making.open("wb") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        making.replace(directory / OWNER_LOCK)
        yield


def _young(path: Path) -> bool:
    """Whether ``path`` was made (or last had an entry added) too recently to be abandoned;
    True if it is gone meanwhile (nothing to do)."""
    try:
        return time.time() - path.stat().st_mtime < _UNLOCKED_GRACE_S
    except FileNotFoundError:
        return True


def _owner_alive(path: Path) -> bool:
    """Whether the trial directory ``path`` is still in use. Its lock answers; a directory
    without one (being created, or from a sweeper before the lock) falls back to the pid in
    its name, and is only taken for stale once it is older than a fresh one can be."""
    try:
        handle = (path / OWNER_LOCK).open("rb")
    except FileNotFoundError:
        owner = path.name.removeprefix(TRIAL_DIR_PREFIX).split("-", 1)[0]
        if _young(path) or not owner.isdigit():
            return True
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True  # its owner runs (or another process took the number)
    except OSError:
        return True  # unreadable: not ours to judge
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def sweep_stale_trial_dirs(workdir: Path | None = None) -> list[Path]:
    """Remove trial directories whose owner process is gone (a launch killed with SIGKILL
    cannot remove its own); once per process and directory. Returns what was removed.
    Another launch's directory is left alone even when its owner runs in another PID
    namespace (a container sharing /tmp), where the pid in the name means nothing."""
    folder = Path(workdir or tempfile.gettempdir())
    if str(folder) in _swept:
        return []
    _swept.add(str(folder))
    removed = []
    mine = f"{TRIAL_DIR_PREFIX}{os.getpid()}-"
    for path in folder.glob(f"{TRIAL_DIR_PREFIX}*-*"):
        if path.name.startswith(mine) or not path.is_dir() or _owner_alive(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


class _Spawned:
    """A fresh interpreter: ``python -m sweeper.trial REQUEST RESULT``."""

    def __init__(
        self, request: Path, result: Path, log: Path, env: dict[str, str], python: str
    ) -> None:
        with log.open("wb") as log_file:
            self.process = subprocess.Popen(
                [python, "-m", "sweeper.trial", str(request), str(result)],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # own process group: one killpg reaches the workers
            )
        self.pid = self.process.pid

    def wait(self, timeout: float | None) -> int | None:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


class ForkServer:
    """A zygote process that forks trial children; use as a context manager for one sweep.

    If the zygote dies or fails to start, ``alive`` turns False and trials fall back to plain
    spawns: slower to start, same results. So too when its imports or its preload opened the
    CUDA context (a package that queries the device at import): ``unfit`` says why, and the
    zygote is stopped, since every child forked from it would fail at its first CUDA call.
    """

    def __init__(self, cache_dir: str, workdir: Path | None = None) -> None:
        self.cache_dir = cache_dir
        self.workdir = workdir  # where its directory goes (the system's temp dir if None)
        self._cleanup = contextlib.ExitStack()
        self.alive = False
        self._buffer = b""
        self._exits: dict[int, int] = {}
        self.startup_s = 0.0  # the zygote's imports + preload: what a forked child skips
        self.unfit: str | None = None  # why trials are spawned instead, if the zygote can't fork
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> ForkServer:
        # the zygote's own temporary files (multiprocessing's pymp-* among them, and the
        # preload's request) live in a directory owned as a trial's is: removed on exit, and
        # swept by the next start when this process is killed (sweep_stale_trial_dirs)
        sweep_stale_trial_dirs(self.workdir)
        try:
            return self._start()
        except BaseException:
            self._cleanup.close()
            raise

    def _start(self) -> ForkServer:
        self.directory = Path(
            self._cleanup.enter_context(
                tempfile.TemporaryDirectory(
                    prefix=f"{TRIAL_DIR_PREFIX}{os.getpid()}-zygote-", dir=self.workdir
                )
            )
        )
        self._cleanup.enter_context(_owned(self.directory))
        (self.directory / "tmp").mkdir()
        reply_r, reply_w = os.pipe()
        self._reply_fd = reply_r
        self._process = subprocess.Popen(
            [sys.executable, "-m", "sweeper.trial.zygote", str(reply_w)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**child_env(self.cache_dir), "TMPDIR": str(self.directory / "tmp")},
            pass_fds=(reply_w,),
            start_new_session=True,
        )
        os.close(reply_w)
        ready = self._next(timeout=120)
        self.alive = ready is not None and ready.get("op") == "ready"
        if ready is not None:
            self.startup_s = float(ready.get("imports_s", 0.0))
            if ready.get("unfit"):
                self._retire(ready["unfit"])
        return self

    def _retire(self, why: str) -> None:
        """Fork no more children: each would fail at its first CUDA call; trials spawn."""
        self.unfit = (
            f"{why}; a child forked from it would fail at its first CUDA call, so each trial "
            "starts as a fresh process (its imports paid in its start-up, as a real run pays "
            "them)"
        )
        self.alive = False
        if self._process is not None and self._process.stdin:
            with contextlib.suppress(OSError):
                self._process.stdin.close()

    def __exit__(self, *exc: object) -> None:
        self.alive = False
        if self._process is not None:
            if self._process.stdin:
                with contextlib.suppress(OSError):
                    self._process.stdin.close()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        os.close(self._reply_fd)
        self._cleanup.close()

    def preload(self, request: ChildRequest) -> float | None:
        """Load the sweep's tokenizer, data and model code in the zygote; seconds, or None
        (also when the zygote is gone or ``unfit``: trials are then spawned)."""
        if not self.alive:
            return None
        with tempfile.NamedTemporaryFile(
            "w", suffix=".json", dir=self.directory, delete=False
        ) as f:
            f.write(request.model_dump_json())
        try:
            self._send({"op": "preload", "request": f.name})
            reply = self._next(timeout=600)
        finally:
            os.unlink(f.name)
        if reply and reply["op"] == "preloaded":
            self.startup_s += reply["s"]
            return reply["s"]
        if reply and reply.get("unfit"):
            self._retire(reply["unfit"])
        return None

    def start(self, request: Path, result: Path, log: Path, env: dict[str, str]) -> _Forked:
        self._send(
            {
                "op": "run",
                "request": str(request),
                "result": str(result),
                "log": str(log),
                "env": env,
            }
        )
        reply = self._next(timeout=60)
        if reply is None or reply.get("op") != "started":
            self.alive = False
            raise RuntimeError(f"the fork server did not start a trial (reply: {reply})")
        return _Forked(self, reply["pid"])

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while pid not in self._exits:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if remaining == 0.0:
                return None
            if self._next(timeout=remaining, exits=True) is None and not self.alive:
                return -signal.SIGKILL  # the zygote died, and its children with it
        return self._exits.pop(pid)

    def _send(self, message: dict[str, Any]) -> None:
        assert self._process is not None and self._process.stdin is not None
        try:
            self._process.stdin.write((json.dumps(message) + "\n").encode())
            self._process.stdin.flush()
        except OSError:
            self.alive = False
            raise

    def _next(self, timeout: float | None, exits: bool = False) -> dict[str, Any] | None:
        """The next reply, or None on timeout. Exit notices are filed for ``wait_exit`` and
        returned only when ``exits`` is set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                message = json.loads(line)
                if message["op"] == "exited":
                    self._exits[message["pid"]] = message["code"]
                    if not exits:
                        continue
                return message
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self._reply_fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(self._reply_fd, 65536)
            if not chunk:
                self.alive = False
                return None
            self._buffer += chunk


@dataclass
class _Forked:
    server: ForkServer
    pid: int

    def wait(self, timeout: float | None) -> int | None:
        return self.server.wait_exit(self.pid, timeout)


def read_result(path: Path, returncode: int, log_tail: str) -> ChildResult:
    if path.is_file():
        try:
            return ChildResult.model_validate_json(path.read_text())
        except ValidationError as e:
            return ChildResult(
                status="failed", failure_kind="error", failure_message=f"unreadable result: {e}"
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
    if not log_tail.strip() and not path.parent.is_dir():  # its log went with it
        last = f"its directory {path.parent} was removed while it ran"
    # the traceback it printed, classified as a raised exception would be: a DataLoader's
    # SIGCHLD handler can raise "DataLoader worker (pid N) is killed by signal" while the
    # child writes its result, and that escapes it
    from sweeper.trial.failures import classify_output

    return ChildResult(
        status="failed",
        failure_kind=classify_output(log_tail)[0] if log_tail.strip() else "error",
        failure_message=f"trial process exited {returncode} without a result: {last}",
        traceback=log_tail,
    )


def _kill_group(handle: _Handle) -> None:
    """SIGTERM the child's process group, wait a grace period, then SIGKILL it and reap it."""
    _signal_group(handle.pid, signal.SIGTERM)
    if handle.wait(_TERM_GRACE_S) is None:
        _signal_group(handle.pid, signal.SIGKILL)
        handle.wait(30)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _tail(path: Path) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-_LOG_TAIL_CHARS:].decode("utf-8", errors="replace")
