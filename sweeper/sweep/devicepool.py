"""The devices one machine's workers share: each trial holds the devices it trains on.

``launch --workers N`` and ``worker --devices 0,1,...`` give every worker of the machine the
same pool (``SWEEPER_DEVICE_POOL``, GPU indexes or UUIDs as CUDA_VISIBLE_DEVICES takes them).
Before a trial starts, its worker takes ``devices`` of them (the trial's knob) and the trial's
child sees only those (CUDA_VISIBLE_DEVICES); after it, they are free again. A device is held
by an exclusive ``flock`` on its lock file in one directory per machine
(``SWEEPER_DEVICE_LOCKS``, default the system's temp dir), so no two trials of any worker
using that directory hold the same device, and a worker that dies (even by SIGKILL) frees its
devices with it. Taking them is planned under one more lock, ``plan.lock``: a trial waiting for
two devices keeps them as they free, and trials of one device cannot take them from under it
(no trial waits forever behind smaller ones). Waiting blocks in the kernel, never a poll.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sweeper.errors import SweeperError

POOL_ENV = "SWEEPER_DEVICE_POOL"
LOCKS_ENV = "SWEEPER_DEVICE_LOCKS"


class DevicePoolError(SweeperError):
    """A trial needs more devices than the pool has, or the locks cannot be taken."""


@dataclass(frozen=True)
class Held:
    """The devices a trial held, and when (epoch seconds): taken at ``since``, given back at
    ``until`` (None while held)."""

    devices: tuple[str, ...]
    since: float
    waited_s: float
    until: float | None = None

    @property
    def visible(self) -> str:
        """As CUDA_VISIBLE_DEVICES takes them: '0,1'."""
        return ",".join(self.devices)


def default_directory() -> Path:
    """``SWEEPER_DEVICE_LOCKS``, else one directory per machine in its temp dir."""
    folder = os.environ.get(LOCKS_ENV)
    return Path(folder) if folder else Path(tempfile.gettempdir()) / "sweeper-devices"


class DevicePool:
    """The machine's devices ``devices``, their locks in ``directory``."""

    def __init__(self, devices: list[str], directory: Path | None = None) -> None:
        if not devices or len(set(devices)) != len(devices):
            raise DevicePoolError(f"a device pool needs distinct devices, not {devices}")
        self.devices = list(devices)
        self.directory = directory or default_directory()

    @classmethod
    def from_env(cls) -> DevicePool | None:
        """The pool this worker's fleet shares, or None (this worker owns what it sees)."""
        listed = os.environ.get(POOL_ENV, "")
        devices = [d.strip() for d in listed.split(",") if d.strip()]
        if not devices:
            return None
        return cls(devices)

    def env(self) -> dict[str, str]:
        """What a worker of this pool is started with."""
        return {
            POOL_ENV: ",".join(self.devices),
            LOCKS_ENV: str(self.directory),
            "CUDA_VISIBLE_DEVICES": ",".join(self.devices),
        }

    def _open(self, name: str) -> int:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(OSError):  # shared by the machine's users
                self.directory.chmod(0o1777)
            fd = os.open(self.directory / name, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise DevicePoolError(
                f"the device locks in {self.directory} cannot be used ({e}): set {LOCKS_ENV} "
                "to a directory this user can write"
            ) from None
        return fd

    @contextlib.contextmanager
    def hold(self, count: int) -> Iterator[Held]:
        """Take ``count`` devices of the pool (waiting for them to be free), hold them for
        the block. Raises DevicePoolError when the pool has fewer."""
        if count > len(self.devices):
            raise DevicePoolError(
                f"devices {count}: this worker's pool has {len(self.devices)} "
                f"({','.join(self.devices)}); give the workers more GPUs (--devices) or "
                f"leave {count} out of search.devices"
            )
        started = time.time()
        held: dict[str, int] = {}
        try:
            plan = self._open("plan.lock")
            try:
                fcntl.flock(plan, fcntl.LOCK_EX)
                self._take(count, held)
            finally:
                os.close(plan)  # closing drops the planning lock; the devices stay held
            since = time.time()
            yield Held(tuple(sorted(held, key=self.devices.index)), since, since - started)
        finally:
            for fd in held.values():
                os.close(fd)

    def _take(self, count: int, held: dict[str, int]) -> None:
        """Take free devices first; while short, wait for the first one still busy."""
        while len(held) < count:
            for device in self.devices:
                if device in held or len(held) == count:
                    continue
                fd = self._open(_lock_name(device))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                held[device] = fd
            if len(held) == count:
                return
            busy = next(d for d in self.devices if d not in held)
            fd = self._open(_lock_name(busy))
            fcntl.flock(fd, fcntl.LOCK_EX)  # its trial ends; nobody else plans meanwhile
            held[busy] = fd


def _lock_name(device: str) -> str:
    """'device-0.lock'; a UUID's odd characters become '_'."""
    return "device-" + re.sub(r"[^A-Za-z0-9._-]", "_", device) + ".lock"


def workers_for(pool: int, sizes: list[int]) -> int:
    """How many workers keep a pool of ``pool`` devices busy: as many as trials of the
    smallest size fit side by side (at least one).

    >>> workers_for(4, [1, 2]), workers_for(4, [2, 4]), workers_for(1, [2])
    (4, 2, 1)
    """
    return max(1, pool // max(1, min(sizes, default=1)))
