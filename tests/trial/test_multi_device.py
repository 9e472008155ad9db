"""A trial on several devices: two gloo ranks on the CPU through the plain loop.

Each test runs a real trial child that starts two real rank processes (torchrun's
environment, one process group), trains the tiny Llama and reads back what ran: the world
size, and the wrapper the model trained in (DDP, or FSDP2 with every parameter a DTensor
shard: about half of the elements on each rank). A rank killed from outside mid-trial takes
its group down, classified, with no process left; a rank that stops answering fails the
trial as a collective that timed out.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from sweeper.launcher import ChildRun, run_child
from sweeper.space import Space
from sweeper.trial.protocol import ChildRequest, PreparedData
from tests.helpers import SessionForkServer, tiny_config, trial_request

pytestmark = pytest.mark.torch


def _request(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    *,
    measure: dict[str, object] | None = None,
    collective_timeout_s: float = 120,
    engine: str = "loop",
    checkpoint: bool = False,
    **config: Any,
) -> ChildRequest:
    # no checkpoint unless asked: the tests stay short
    saves = space.workload.checkpoint.model_copy(
        update={"save_steps": space.workload.checkpoint.save_steps if checkpoint else None}
    )
    workload = space.workload.model_copy(update={"checkpoint": saves, "engine": engine})
    space = space.model_copy(
        update={
            "workload": workload,
            "trial": space.trial.model_copy(update={"collective_timeout_s": collective_timeout_s}),
        }
    )
    return trial_request(
        space,
        prepared,
        cache_dir,
        tiny_config(devices=2, **config),
        warmup={"min_steps": 1, "max_steps": 2},
        measure=measure or {"min_steps": 3, "max_steps": 3},
    )


def _run(
    run_forked: SessionForkServer,
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    **knobs: Any,
) -> ChildRun:
    """A two-rank trial of ``_request(...)`` run to its end: 5 minutes at most on a calm
    machine, more under load (two DeepSpeed ranks were still starting at 300 s at load 12 on
    2 cores); a trial that works ends when it is done, whatever the bound."""
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    timeout_s = min(900.0, 300.0 * max(1.0, load))
    return run_forked(_request(space, prepared, cache_dir, **knobs), timeout_s=timeout_s)


def _ok(run: ChildRun) -> dict[str, Any]:
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail[-3000:])
    assert run.result.payload is not None
    return run.result.payload


def _group_figures(payload: dict[str, Any], batch: int, accumulation: int) -> None:
    """The group's throughput is both ranks' rows over the slowest rank's window."""
    ranks = payload["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    steps = payload["measured_steps"]
    for rank in ranks:  # each rank trained its own batches, every step
        assert rank["rows"] == steps * batch * accumulation
    # from its own share of the data
    assert ranks[0]["first_batch"] and ranks[0]["first_batch"] != ranks[1]["first_batch"]
    assert payload["devices"] == 2
    assert payload["effective_batch"] == batch * accumulation * 2
    rows = sum(r["rows"] for r in ranks)
    assert payload["rows_per_s"] == pytest.approx(rows / payload["window_s"], rel=1e-9)
    assert payload["window_s"] >= max(r["window_s"] for r in ranks) * 0.999
    assert payload["peak_memory_bytes"] == max(r["peak_memory_bytes"] for r in ranks)


def test_two_ranks_train_with_ddp(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    run = _run(
        run_forked,
        tiny_space,
        tiny_prepared,
        cache_dir,
        data_parallel="ddp",
        per_device_batch_size=2,
        gradient_accumulation_steps=2,
    )
    payload = _ok(run)
    assert payload["effective"]["devices"] == 2
    assert payload["effective"]["data_parallel"] == "ddp"
    assert [r["parameter_share"] for r in payload["ranks"]] == [1.0, 1.0]  # whole on each
    _group_figures(payload, batch=2, accumulation=2)
    # DDP's own stats: what each rank's backward waited on the all-reduce after its compute
    waits = [r["communication_s"] for r in payload["ranks"]]
    assert all(
        w is not None and 0 <= w < r["step_time_mean_s"]
        for w, r in zip(waits, payload["ranks"], strict=True)
    )
    assert 0 <= payload["communication_share"] < 1


def test_two_ranks_shard_the_parameters_with_fsdp2(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    run = _run(
        run_forked,
        tiny_space,
        tiny_prepared,
        cache_dir,
        data_parallel="fsdp2",
        per_device_batch_size=2,
        gradient_accumulation_steps=1,
        packing=True,  # a packed stream: each rank packs its own share
        checkpoint=True,
    )
    payload = _ok(run)
    assert payload["effective"]["data_parallel"] == "fsdp2"  # every parameter a DTensor shard
    # a sharded save (each rank its shards) of the fp32 weights and AdamW's two moments
    assert payload["checkpoint_source"] == "measured" and payload["checkpoint_save_s"] > 0
    assert payload["checkpoint_bytes"] >= 0.9 * 3 * 4 * payload["n_params"]
    assert payload["communication_share"] is None  # not told for FSDP2
    shares = [r["parameter_share"] for r in payload["ranks"]]
    # dim-0 shards of odd-sized parameters differ by a row: about half each, all of it in all
    assert shares == [pytest.approx(0.5, abs=0.05)] * 2
    assert sum(shares) == pytest.approx(1.0, abs=1e-9)
    _group_figures(payload, batch=2, accumulation=1)


@pytest.mark.parametrize("engine", ["trainer", "sft"])
def test_the_trainer_engines_train_two_ranks_with_ddp(
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    engine: str,
) -> None:
    """TrainingArguments (SFTConfig) under torchrun's environment: accelerate wraps the model
    in DDP and gives each rank its share of the batches; the read-back finds the wrapper."""
    run = _run(
        run_forked,
        tiny_space,
        tiny_prepared,
        cache_dir,
        engine=engine,
        data_parallel="ddp",
        per_device_batch_size=2,
        gradient_accumulation_steps=2,
    )
    payload = _ok(run)
    assert payload["engine"] == engine
    assert payload["effective"]["devices"] == 2
    assert payload["effective"]["data_parallel"] == "ddp"
    _group_figures(payload, batch=2, accumulation=2)
    assert 0 <= payload["communication_share"] < 1  # DDP's stats, as the loop's


def test_the_trainer_asked_for_fsdp2_on_a_cpu_fails_as_a_mismatch(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """TrainingArguments(fsdp=...) on a CPU: accelerate wraps the model in DDP without a word.
    The read-back finds DDP, so the trial fails rather than record FSDP2 for what ran."""
    run = _run(
        run_forked, tiny_space, tiny_prepared, cache_dir, engine="trainer", data_parallel="fsdp2"
    )
    assert run.result.status == "failed" and run.result.failure_kind == "mismatch"
    assert "data_parallel: asked 'fsdp2', ran 'ddp'" in (run.result.failure_message or "")


def _trial_in_thread(request: ChildRequest, workdir: Path) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(
        target=lambda: out.append(run_child(request, timeout_s=300, workdir=workdir))
    )
    thread.start()
    return thread, out


def _ranks_when_timing(
    workdir: Path, thread: threading.Thread, phases: tuple[str, ...] = ("window",)
) -> dict[int, psutil.Process]:
    """The rank processes, once rank 0 says the trial is in one of ``phases``."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and thread.is_alive():
        for progress in workdir.glob("sweeper-trial-*/progress.json"):
            text = progress.read_text(errors="replace")
            if any(f'"{phase}"' in text for phase in phases):
                ranks = {}
                for process in psutil.process_iter(["cmdline"]):
                    words = process.info["cmdline"] or []
                    if "sweeper.trial.rank" in words and str(progress.parent) in " ".join(words):
                        ranks[int(words[-1].rsplit("rank-", 1)[1].split(".")[0])] = process
                if len(ranks) == 2:
                    return ranks
        time.sleep(0.2)
    raise AssertionError(f"the trial never reached {phases} with two ranks")


def _all_gone(processes: list[psutil.Process]) -> None:
    """Every process has exited within seconds (a rank SIGTERM'd with its group may still be
    unmapping its memory when the launcher returns; none may keep running)."""
    deadline = time.monotonic() + 30
    for process in processes:
        while time.monotonic() < deadline:
            try:
                if process.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"{process} still runs 30 s after its trial ended")


@pytest.mark.parametrize(
    ("sig", "kind", "named"),
    [
        # killed from outside (the OOM killer's way): that rank is the cause
        (signal.SIGKILL, "killed", "rank 1 of 2 died by SIGKILL"),
        # stopped: rank 0 waits in the gradient all-reduce until the collective timeout
        (signal.SIGSTOP, "collective", "(rank 1 had not failed, so it is where the group"),
    ],
    ids=["killed", "stopped"],
)
def test_a_rank_that_fails_takes_its_group_down(
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
    sig: signal.Signals,
    kind: str,
    named: str,
) -> None:
    request = _request(
        tiny_space,
        tiny_prepared,
        cache_dir,
        data_parallel="ddp",
        # a window that lasts until the signal
        measure={"min_steps": 3, "max_steps": 100000, "min_seconds": 120, "max_seconds": 200},
        collective_timeout_s=5,
    )
    thread, out = _trial_in_thread(request, tmp_path)
    ranks = _ranks_when_timing(tmp_path, thread)
    leader = ranks[0].parent()
    assert leader is not None and ranks[1].parent() == leader
    os.kill(ranks[1].pid, sig)
    started = time.monotonic()
    thread.join(timeout=240)
    assert not thread.is_alive()
    (run,) = out
    assert run.result.status == "failed"
    assert run.result.failure_kind == kind, run.result.failure_message
    assert named in (run.result.failure_message or ""), run.result.failure_message
    assert "the group was stopped" in (run.result.failure_message or "")
    _all_gone([*ranks.values(), leader])
    # the group went down at once, not at the trial's timeout (300 s)
    assert time.monotonic() - started < 120


def test_the_exports_carry_the_launch_and_the_sharding() -> None:
    """What a user pastes for a winner on two devices: the torchrun launch it was measured
    with, TrainingArguments that build with FSDP2's fields, and a loop that shards the same
    way (a snippet that parses)."""
    import ast
    import warnings

    from transformers import TrainingArguments

    from sweeper.export import render, trainer_kwargs
    from sweeper.recommendation import Recommendation
    from tests.helpers import TINY_SPACE

    space_yaml = TINY_SPACE.read_text()
    rec = Recommendation(
        study="tiny", trial_number=3, completed_trials=4,
        config=tiny_config(devices=2, data_parallel="fsdp2").model_dump(),
        it_per_s=1.0, samples_per_s=1.0, tokens_per_s=1.0, cost_per_run_usd=1.0,
        hours_per_run=1.0, peak_memory_bytes=None, usd_per_hour=1.0, hardware_name="CPU",
    )  # fmt: skip
    launch = "torchrun --standalone --nproc-per-node 2"
    for form in ("trainer", "sft", "dataloader"):
        assert launch in render(rec, form, space_yaml), form
    with warnings.catch_warnings():  # newer transformers prefer fsdp=True (5.17 takes this)
        warnings.simplefilter("ignore")
        args = TrainingArguments(**trainer_kwargs(rec, space_yaml), use_cpu=True)
    assert args.fsdp and args.fsdp_config["version"] == 2
    loop = render(rec, "dataloader", space_yaml)
    ast.parse(loop)
    assert "fully_shard(layer)" in loop and "fully_shard(model)" in loop


def test_a_rank_out_of_memory_names_itself_and_stops_the_group(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """Rank 1 runs out of host memory mid-window (its address space capped where it stands:
    torch's CPU allocator fails the next allocation): the trial fails as oom, naming rank 1,
    and rank 0, left waiting in the all-reduce, is stopped at once."""
    request = _request(
        tiny_space,
        tiny_prepared,
        cache_dir,
        data_parallel="ddp",
        measure={"min_steps": 3, "max_steps": 100000, "min_seconds": 120, "max_seconds": 200},
    )
    thread, out = _trial_in_thread(request, tmp_path)
    ranks = _ranks_when_timing(tmp_path, thread)
    used = ranks[1].memory_info().vms
    ranks[1].rlimit(psutil.RLIMIT_AS, (used, used))
    thread.join(timeout=240)
    assert not thread.is_alive()
    (run,) = out
    assert run.result.failure_kind == "oom", (run.result.failure_message, run.log_tail[-2000:])
    assert (run.result.failure_message or "").startswith("rank 1 of 2: host memory")
    _all_gone(list(ranks.values()))


def test_the_trials_timeout_reaches_every_rank(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """Why the ranks are not torchrun's: the launcher's kill of the trial's process group at
    its timeout reaches every rank (torchrun's agent would have put each in its own session)."""
    request = _request(
        tiny_space,
        tiny_prepared,
        cache_dir,
        data_parallel="ddp",
        measure={"min_steps": 3, "max_steps": 100000, "min_seconds": 200, "max_seconds": 300},
    )
    out: list[Any] = []
    # long enough for two ranks to reach burn-in on a loaded machine (at load 12 on 2 cores
    # they had not in 30 s), short of the window's 200 s, which never ends on its own
    timeout_s = min(180.0, 30.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1)))
    thread = threading.Thread(
        target=lambda: out.append(run_child(request, timeout_s=timeout_s, workdir=tmp_path))
    )
    thread.start()
    ranks = _ranks_when_timing(tmp_path, thread, phases=("burn_in", "window"))
    leader = ranks[0].parent()
    assert leader is not None and os.getpgid(ranks[1].pid) == os.getpgid(leader.pid)
    thread.join(timeout=timeout_s + 210)
    (run,) = out
    assert run.result.failure_kind == "timeout", run.result.failure_message
    _all_gone([*ranks.values(), leader])
