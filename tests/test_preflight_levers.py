"""The levers of issue 36 on a CPU: Liger (Triton on CUDA), fp8 (compute capability 8.9 and
torchao) and reduce-overhead (CUDA graphs) are dropped by preflight, unprobed, each with its
reason; padding-free runs here (transformers' packed-sequence mask), so it stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.preflight import run_preflight
from sweeper.space import Space
from sweeper.trial.protocol import PreparedData
from tests.helpers import SessionForkServer, tiny_config


@pytest.mark.torch
def test_the_cuda_levers_are_dropped_with_their_reasons_and_padding_free_stays(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    space = tiny_space.model_copy(
        update={
            "search": tiny_space.search.model_copy(
                update={
                    "precision": ["fp32", "fp8"],
                    "compile_mode": ["none", "reduce-overhead"],
                    "liger_kernel": [False, True],
                    "padding_free": [False, True],
                }
            )
        }
    )
    notes: list[str] = []
    report = run_preflight(
        space, tiny_prepared, cache_dir, note=notes.append, server=run_forked.server_now()
    )
    assert report.dropped["precision"] == {
        "fp8": "needs torchao and a CUDA device of compute capability 8.9 or newer (Ada, "
        "Hopper) (the trial device is the CPU)"
    }
    assert report.dropped["liger_kernel"] == {
        "True": "needs liger-kernel and Triton on a CUDA device (the trial device is the CPU)"
    }
    assert "CUDA graphs" in report.dropped["compile_mode"]["reduce-overhead"]
    assert "padding_free" not in report.dropped and not report.fallbacks and not report.problems
    # what was dropped was not probed (a probe of fp8 or reduce-overhead would say nothing here)
    assert {o.knob for o in report.outcomes} == {"attn_implementation"}
    assert any("drops liger_kernel=True" in note for note in notes)
    assert report.allows(tiny_config(padding_free=True)) is None
    for config in (
        tiny_config(precision="fp8"),
        tiny_config(liger_kernel=True),
        tiny_config(compile_mode="reduce-overhead"),
    ):
        assert "failed preflight" in (report.allows(config) or "")


@pytest.mark.torch
def test_a_lever_listed_alone_falls_back_to_what_runs_anywhere(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    space = tiny_space.model_copy(
        update={
            "search": tiny_space.search.model_copy(
                update={"precision": ["fp8"], "compile_mode": ["reduce-overhead"]}
            )
        }
    )
    notes: list[str] = []
    report = run_preflight(
        space, tiny_prepared, cache_dir, note=notes.append, server=run_forked.server_now()
    )
    assert report.fallbacks == {"precision": "fp32", "compile_mode": "none"}
    adapted = report.adapt(tiny_config(precision="fp8", compile_mode="reduce-overhead"))
    assert (adapted.precision, adapted.compile_mode) == ("fp32", "none")
    assert any("trials run precision='fp32' instead" in note for note in notes)
