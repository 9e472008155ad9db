"""Preflight and DeepSpeed ZeRO: devices [1, 2] stays on a CPU (two gloo ranks); zero2/zero3
stay where deepspeed imports and the engine runs them (trainer, sft), and are dropped with the
reason where it does not import (the probe child really fails to import it: a folder first on
its PYTHONPATH holds a ``deepspeed`` that raises) or where the engine is the plain loop."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sweeper.preflight import PreflightReport, run_preflight
from sweeper.space import Space
from sweeper.trial.protocol import PreparedData
from tests.helpers import tiny_config

pytestmark = pytest.mark.torch

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def _preflight(
    space: Space, prepared: PreparedData, cache_dir: Path, engine: str
) -> tuple[PreflightReport, list[str]]:
    space = space.model_copy(
        update={
            "workload": space.workload.model_copy(update={"engine": engine}),
            "search": space.search.model_copy(
                update={"devices": [1, 2], "data_parallel": ["ddp", "fsdp2", "zero2", "zero3"]}
            ),
        }
    )
    notes: list[str] = []
    return run_preflight(space, prepared, cache_dir, note=notes.append), notes


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
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    report, _ = _preflight(tiny_space, tiny_prepared, cache_dir, "trainer")
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
    monkeypatch.setenv("PYTHONPATH", str(hidden))  # the probe child inherits it
    report, notes = _preflight(tiny_space, tiny_prepared, cache_dir, "trainer")
    assert "hidden from this probe child" in (report.capabilities["deepspeed"] or "")
    for reason in _refuses_zero(report, notes).values():
        assert reason.startswith("needs deepspeed and accelerate (deepspeed does not import"), (
            reason
        )


def test_the_loop_engine_drops_zero_saying_which_engines_run_it(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    report, notes = _preflight(tiny_space, tiny_prepared, cache_dir, "loop")
    for reason in _refuses_zero(report, notes).values():
        if HAS_DEEPSPEED:
            assert "through the Trainer (engine trainer or sft)" in reason, reason
            assert "the loop engine does not run it" in reason, reason
        else:
            assert "deepspeed does not import" in reason, reason
