"""Preflight and DeepSpeed ZeRO: devices [1, 2] stays on a CPU (two gloo ranks); zero2/zero3
stay where deepspeed imports and the engine runs them (trainer, sft), and are dropped with the
reason where it does not import (the probe child really fails to import it: a folder first on
its PYTHONPATH holds a ``deepspeed`` that raises) or where the engine is the plain loop. A
probe of a space without ZeRO does not import deepspeed at all (seconds per probe child).

The spaces list one attention implementation (one probe per preflight: the ZeRO rules do not
depend on which kernels work), and the preflights that need no PYTHONPATH of their own fork
their probes from one warm fork server, as a sweep does."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweeper.launcher import ForkServer, run_child
from sweeper.preflight import PreflightReport, run_preflight
from sweeper.space import Space
from sweeper.sweep.prepare import workload_server
from sweeper.trial.protocol import ChildRequest, PreparedData, ProbeSpec
from tests.helpers import tiny_config

pytestmark = pytest.mark.torch

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def _zero_space(space: Space, engine: str) -> Space:
    return space.model_copy(
        update={
            "workload": space.workload.model_copy(update={"engine": engine}),
            "search": space.search.model_copy(
                update={
                    "devices": [1, 2],
                    "data_parallel": ["ddp", "fsdp2", "zero2", "zero3"],
                    "attn_implementation": ["sdpa"],
                }
            ),
        }
    )


@pytest.fixture(scope="module")
def server(tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path) -> Iterator[ForkServer]:
    with workload_server(_zero_space(tiny_space, "trainer"), tiny_prepared, cache_dir) as warm:
        yield warm


def _preflight(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    engine: str,
    server: ForkServer | None = None,
) -> tuple[PreflightReport, list[str]]:
    notes: list[str] = []
    zero = _zero_space(space, engine)
    return run_preflight(zero, prepared, cache_dir, note=notes.append, server=server), notes


def _refuses_zero(report: PreflightReport, notes: list[str]) -> dict[str, str]:
    assert "devices" not in report.dropped
    dropped = report.dropped["data_parallel"]
    assert set(dropped) == {"zero2", "zero3"}
    assert any("drops data_parallel=zero3" in note for note in notes)
    assert report.allows(tiny_config(devices=2, data_parallel="fsdp2")) is None
    assert "zero3 failed preflight" in (
        report.allows(tiny_config(devices=2, data_parallel="zero3")) or ""
    )
    return dropped


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed")
def test_the_trainer_engine_keeps_zero_where_deepspeed_imports(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, server: ForkServer
) -> None:
    report, _ = _preflight(tiny_space, tiny_prepared, cache_dir, "trainer", server)
    assert report.capabilities["deepspeed"] is None  # the probe child imported it
    assert "data_parallel" not in report.dropped and "devices" not in report.dropped
    assert report.allows(tiny_config(devices=2, data_parallel="zero3")) is None


def test_zero_is_dropped_where_deepspeed_does_not_import(
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hidden = tmp_path / "hide-deepspeed"
    (hidden / "deepspeed").mkdir(parents=True)
    (hidden / "deepspeed" / "__init__.py").write_text(
        "raise ImportError('deepspeed is hidden from this probe child')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(hidden))  # a cold probe child inherits it
    report, notes = _preflight(tiny_space, tiny_prepared, cache_dir, "trainer")
    assert "hidden from this probe child" in (report.capabilities["deepspeed"] or "")
    for reason in _refuses_zero(report, notes).values():
        assert reason.startswith("needs deepspeed and accelerate (deepspeed does not import"), (
            reason
        )
    # a probe for a space without ZeRO never imports deepspeed: the raising one stays unread
    # and the probe trains; its capabilities leave deepspeed out (not checked)
    spec = ProbeSpec(attn_implementation="sdpa", compile_mode="none", precision="fp32")
    request = ChildRequest.for_space("probe", tiny_space, cache_dir, prepared=tiny_prepared)
    run = run_child(request.model_copy(update={"probe": spec}), timeout_s=300)
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail[-2000:])
    assert run.result.payload is not None
    capabilities = run.result.payload["capabilities"]
    assert "deepspeed" not in capabilities and capabilities["engine:trainer"] is None


def test_the_loop_engine_drops_zero_saying_which_engines_run_it(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, server: ForkServer
) -> None:
    report, notes = _preflight(tiny_space, tiny_prepared, cache_dir, "loop", server)
    for reason in _refuses_zero(report, notes).values():
        if HAS_DEEPSPEED:
            assert "through the Trainer (engine trainer or sft)" in reason, reason
            assert "the loop engine does not run it" in reason, reason
        else:
            assert "deepspeed does not import" in reason, reason
