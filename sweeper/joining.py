"""Whether a new ``launch`` would run beside a live worker of its study on the same devices.

Two workers training on one GPU (or one CPU) at once slow each other down, and both record
the slowed figures as what their configs cost. A second ``sweeper launch`` of a running study
is more often a mistake (the first is still running in another terminal) than a plan, so it
is refused unless ``--join`` says it is meant; workers on other hosts or other GPUs are the
normal way to share a study and are never refused.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from pathlib import Path

from sweeper.errors import SweeperError
from sweeper.settings import Settings
from sweeper.store import Store
from sweeper.store.models import WorkerRow


def devices_here() -> str | None:
    """The devices a worker started here would use (its ``CUDA_VISIBLE_DEVICES``)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def gone_here(worker: WorkerRow, heartbeat_s: float) -> bool:
    """Whether ``worker`` ran on this host and its process is gone (killed, or stopped by a
    database it lost), so that it need not wait out the grace period to be reaped. Its beat
    must also have missed three heartbeats: a worker in another PID namespace under the same
    host name (containers on the host network) is invisible to ``kill(pid, 0)`` but beats."""
    if worker.host != socket.gethostname() or process_alive(worker.pid):
        return False
    return _beat_age_s(worker) > 3 * heartbeat_s


def _beat_age_s(worker: WorkerRow) -> float:
    """Seconds since ``worker``'s last heartbeat (SQLite hands back naive UTC)."""
    beat = worker.heartbeat_at
    if beat.tzinfo is None:
        beat = beat.replace(tzinfo=UTC)
    return max(0.0, (datetime.now(UTC) - beat).total_seconds())


def process_alive(pid: int | None) -> bool:
    """Whether process ``pid`` of this host exists and is not a zombie (killed, its exit not
    yet collected by its parent: a `kill -9`ed worker started by a script that never waits on
    it). None: unknown, taken as alive."""
    if pid is None:
        return True  # not known: as live as its heartbeat says
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process of that number
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # gone meanwhile
        return False
    except psutil.Error:  # not ours to read: as live as kill(0) said
        return True


def same_place_worker(url: str, study: str) -> str | None:
    """Why launching ``study`` here now would share its devices with a live worker of it, with
    the way out; None when no live worker of the study runs on this host and these devices."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    file = parsed.database if parsed.get_backend_name() == "sqlite" else None
    if file not in (None, "", ":memory:") and not Path(str(file)).exists():
        return None  # opening it would create it; a new file holds no worker
    try:
        store = Store(url)
    except SweeperError:
        return None  # the sweep itself says what is wrong with the storage
    try:
        settings = Settings()
        live = store.live_workers(study, settings.worker_grace_s)
    except SweeperError:
        return None  # no such study (or no tables yet): nobody works on it
    finally:
        store.dispose()
    host, devices = socket.gethostname(), devices_here()
    # a worker whose process is gone (killed, or stopped by a database it lost) is not live,
    # however recent its last heartbeat: its trial is the reaper's, and this launch may resume
    here = [
        w
        for w in live
        if w.host == host and w.devices == devices and not gone_here(w, settings.heartbeat_s)
    ]
    if not here:
        return None
    worker = here[0]
    ago = _beat_age_s(worker)
    where = "every visible device" if devices is None else f"CUDA_VISIBLE_DEVICES={devices}"
    if not process_alive(worker.pid):
        # just killed (kill -9, the OOM killer): "kill PID" would name a process that is gone
        left = max(1.0, 3 * settings.heartbeat_s - ago)
        return (
            f"study {study!r} already has a live worker on this host using {where} by its "
            f"heartbeat (pid {worker.pid}, last heartbeat {ago:.0f} s ago), but no process "
            f"{worker.pid} runs here: if it was killed, it counts as gone once it has missed "
            f"3 heartbeats (SWEEPER_HEARTBEAT_S={settings.heartbeat_s:g}), in about "
            f"{left:.0f} s: launch again then, and its running trial is marked lost and run "
            "again; if it runs in another container under this host name, wait for it, or "
            "run beside it on purpose with --join"
        )
    return (
        f"study {study!r} already has a live worker on this host using {where} (pid "
        f"{worker.pid}, last heartbeat {ago:.0f} s ago): a second worker on the same devices "
        "would slow both, and both would record the slowed figures. Wait for it to finish, "
        f"stop it (kill {worker.pid}: its running trial is marked interrupted), or run "
        "beside it on purpose with --join (on another GPU: CUDA_VISIBLE_DEVICES=N)"
    )
