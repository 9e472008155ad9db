"""The GPUs a machine's workers share (``sweeper.sweep.devicepool``, ``launch --workers``,
``worker --devices``): each trial holds the devices its ``devices`` knob asks for and sees only
those; no two trials hold one device at once; a trial waiting for two is not starved by
trials of one; too small a pool is refused up front. The fleet test runs real workers and
real 1- and 2-rank trials (gloo on the CPU, where the "devices" are the pool's names)."""

from __future__ import annotations

import itertools
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest

from sweeper.search import REPEAT_ATTR
from sweeper.store import Store
from sweeper.sweep.devicepool import DevicePool, DevicePoolError, Held
from sweeper.sweep.fleet import FleetError, check_pool, parse_devices
from tests.helpers import REPO, tiny_space_without_baseline
from tests.test_cli import env  # noqa: F401 (a fixture)


def _overlapping_share_no_device(holds: list[Held]) -> None:
    for a, b in itertools.combinations(holds, 2):
        assert a.until is not None and b.until is not None
        if a.since < b.until and b.since < a.until:  # held at the same time
            assert not set(a.devices) & set(b.devices), (a, b)


def test_concurrent_holds_of_mixed_sizes_never_share_a_device(tmp_path: Path) -> None:
    """Eight holders of 1 or 2 of three devices, each a thread with its own lock files
    (flock locks of separate opens exclude each other as between processes)."""
    pool = DevicePool(["0", "1", "2"], tmp_path)
    holds: list[Held] = []
    lock = threading.Lock()

    def one(size: int) -> None:
        with pool.hold(size) as held:
            time.sleep(0.15)
            until = time.time()  # before the devices are given back, not after
        with lock:
            holds.append(Held(held.devices, held.since, held.waited_s, until))

    threads = [threading.Thread(target=one, args=(1 + i % 2,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(holds) == 8
    assert sorted(len(h.devices) for h in holds) == [1] * 4 + [2] * 4
    _overlapping_share_no_device(holds)


def test_a_trial_waiting_for_two_devices_is_not_starved_by_trials_of_one(tmp_path: Path) -> None:
    pool = DevicePool(["0", "1"], tmp_path)
    got: dict[str, Held] = {}
    first_holds, release = threading.Event(), threading.Event()

    def small(name: str, wait: threading.Event | None) -> None:
        with pool.hold(1) as held:
            got[name] = held
            first_holds.set()
            if wait is not None:
                wait.wait(30)

    def big() -> None:
        with pool.hold(2) as held:
            got["big"] = held

    first = threading.Thread(target=small, args=("first", release))
    first.start()
    assert first_holds.wait(30)
    waiting = threading.Thread(target=big)
    waiting.start()
    time.sleep(1.0)  # the big one is waiting for device 0, with device 1 taken for it
    late = threading.Thread(target=small, args=("late", None))
    late.start()
    time.sleep(1.0)
    assert "big" not in got and "late" not in got  # the late one queues behind the big one
    release.set()
    for t in (first, waiting, late):
        t.join(timeout=30)
    assert got["first"].devices == ("0",)
    assert sorted(got["big"].devices) == ["0", "1"]
    assert got["late"].since >= got["big"].since


def test_a_trial_larger_than_the_pool_is_refused_saying_how_to_fix_it(tmp_path: Path) -> None:
    refused = r"devices 3: this worker's pool has 2 \(0,1\)"
    with pytest.raises(DevicePoolError, match=refused), DevicePool(["0", "1"], tmp_path).hold(3):
        pass
    with pytest.raises(FleetError, match="search.devices lists 4, but the workers share 2") as e:
        check_pool(["0", "1"], [1, 4], None)
    assert e.value.code == 2
    with pytest.raises(FleetError, match=r"--workers 3: 4 GPU\(s\) \(0,1,2,3\) hold 2 trial"):
        check_pool(["0", "1", "2", "3"], [2, 4], 3)
    assert check_pool(["0", "1", "2", "3"], [1, 2], None) == 4
    assert check_pool(["0", "1", "2", "3"], [2], None) == 2
    # a pool that is not GPUs is refused before anything runs (it started a worker on "abc")
    worker = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "worker", "--study", "any", "--devices", "0,abc"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert worker.returncode == 2 and "Traceback" not in worker.stderr
    assert "'abc' is not a GPU index (0, 1, ...) or UUID (GPU-..., MIG-...)" in worker.stderr
    assert parse_devices("GPU-5a1b, MIG-77c0/1/2 ,3") == ["GPU-5a1b", "MIG-77c0/1/2", "3"]


@pytest.mark.torch
def test_workers_sharing_two_devices_run_trials_of_one_and_two_without_overlap(
    tmp_path: Path,
    env: dict[str, str],  # noqa: F811
) -> None:
    """`launch --workers 2` with two visible devices and search.devices [1, 2]: the 2-device
    trial holds both, the 1-device one one; each trial's devices and the time it held them
    are recorded (Optuna user attributes); no two trials held a device at once. Priced per
    device: a 2-device trial costs hours × 2 × the device's $/h. One trial of each size (the
    space has just those two configs): the two workers start them together, so one of them
    waits for the other's device."""
    space = tmp_path / "pool.yaml"
    text = tiny_space_without_baseline()
    text = text.replace(
        "  per_device_batch_size: [2, 4]", "  per_device_batch_size: [2]\n  devices: [1, 2]"
    )
    text = text.replace("gradient_accumulation_steps: [1, 2]", "gradient_accumulation_steps: [1]")
    text = text.replace("[sdpa, eager]", "[sdpa]")
    space.write_text(text)
    url = f"sqlite:///{tmp_path / 'pool.db'}"
    locks = tmp_path / "locks"
    run_env = dict(env, CUDA_VISIBLE_DEVICES="0,1", SWEEPER_DEVICE_LOCKS=str(locks))
    done = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "launch", "--space", str(space)]
        + ["--storage", url, "--workers", "2", "--n-trials", "2"],
        env=run_env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    logs = Path(env["SWEEPER_CACHE_DIR"]) / "workers"
    worker_logs = "\n".join(p.read_text() for p in sorted(logs.glob("tiny-*.log")))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + worker_logs[-4000:]
    assert "the workers share GPU(s) 0,1" in done.stdout
    assert "ran on CUDA_VISIBLE_DEVICES=0,1" in worker_logs
    store = Store(url)
    try:
        rows = {t.number: t for t in store.list_trials("tiny")}
    finally:
        store.dispose()
    storage = optuna.storages.RDBStorage(url)
    try:
        trials = optuna.load_study(study_name="tiny", storage=storage).trials
    finally:
        storage.engine.dispose()
    # a proposal the loop did not run takes an Optuna number and is told without a trial: two
    # workers asking at once can be proposed the same config (the second finds it claimed)
    not_run = {"skipped", "claimed_by", REPEAT_ATTR}
    ran = [t for t in trials if not not_run & t.user_attrs.keys()]
    said = (
        [r.failure_message for r in rows.values()],
        [(t.number, t.state.name, t.user_attrs) for t in trials if t not in ran],
    )
    assert [rows[t.number].state if t.number in rows else None for t in ran] == ["complete"] * 2, (
        said
    )
    trials = ran
    assert sorted(rows[t.number].config["devices"] for t in trials) == [1, 2]
    holds = []
    for t in trials:
        row = rows[t.number]
        ids, (since, until, waited) = t.user_attrs["device_ids"], t.user_attrs["device_hold"]
        assert len(ids) == row.config["devices"] and set(ids) <= {"0", "1"}
        assert since <= until and waited >= 0
        holds.append(Held(tuple(ids), since, waited, until))
        assert row.cost_per_run_usd == pytest.approx(
            row.hours_per_run * row.config["devices"] * 0.10
        )
    _overlapping_share_no_device(holds)
    assert len({r.worker_id for r in rows.values()}) == 2
