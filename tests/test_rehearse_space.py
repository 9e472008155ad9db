"""scripts/rehearse_space.py: a GPU space's CPU twin keeps the grid and named configs the GPU
sweep meets (the rehearsal's whole point) and runs on a CPU; the launch itself is the sweep's,
tested elsewhere."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import yaml

from sweeper.space import load_space
from tests.helpers import REPO

_script = runpy.run_path(str(REPO / "scripts" / "rehearse_space.py"))
cpu_twin, gpu_twin = _script["cpu_twin"], _script["gpu_twin"]


@pytest.mark.parametrize("name", ["h200-llama-1b.yaml", "seed-003-h100.yaml"])
def test_the_cpu_twin_keeps_the_grid_and_named_configs(name: str, tmp_path: Path) -> None:
    original_path = REPO / "spaces" / name
    original = load_space(original_path)
    twin_path = tmp_path / name
    twin_path.write_text(yaml.safe_dump(cpu_twin(yaml.safe_load(original_path.read_text()))))
    twin = load_space(twin_path)
    assert twin.hardware.device == "cpu" and original.hardware.device == "cuda"
    assert twin.workload.model.size == "tiny" and twin.trial.slow_precision_factor == 1000
    assert list(twin.search.grid()) == list(original.search.grid())
    assert twin.known_configs() == original.known_configs()
    assert twin.study != original.study  # never mixed into the GPU study


def test_the_gpu_twin_is_the_same_job_priced_as_the_gpu_that_ran_it(tmp_path: Path) -> None:
    """gpu-record.sh --gpu: spaces/h100.yaml (the levers) recorded on an H200 keeps the grid,
    the named configs and the workload (so `best --across-hardware` puts it beside the H100
    study), with the catalog's H200 name and price and the study name given."""
    original_path = REPO / "spaces" / "h100.yaml"
    original = load_space(original_path)
    twin_path = tmp_path / "h200-levers.yaml"
    document = gpu_twin(yaml.safe_load(original_path.read_text()), "h200-sxm", "h200-levers")
    twin_path.write_text(yaml.safe_dump(document))
    twin = load_space(twin_path)
    assert (twin.study, twin.hardware.name, twin.hardware.usd_per_hour) == (
        "h200-levers",
        "H200 SXM 141GB",
        3.5,
    )
    assert twin.hardware.device == "cuda"
    assert list(twin.search.grid()) == list(original.search.grid())
    assert twin.known_configs() == original.known_configs()
    assert twin.workload_hash() == original.workload_hash()
    with pytest.raises(SystemExit, match="'h300' is not in the catalog; one of: .*h200-sxm"):
        gpu_twin({}, "h300", "x")
