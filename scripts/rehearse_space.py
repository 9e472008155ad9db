"""Rehearse a GPU space on this CPU before a GPU lease: the same search grid, named configs,
preflight and search loop, with a tiny model, little data and short trials.

    .venv/bin/python scripts/rehearse_space.py spaces/h200-llama-1b.yaml [--minutes 4]

writes the CPU twin of the space next to a SQLite study in a temporary folder (``--keep DIR``
to choose it) and runs ``sweeper launch`` on it for ``--minutes``. What it changes:
``hardware.device: cpu``; a model given by ``arch`` becomes that arch's ``tiny`` preset with a
512-token vocabulary; ``dataset.generate`` at most 800 samples; the trials' windows a few
seconds; ``trial.slow_precision_factor`` 1000, so bf16 is run (slowly), not refused. What it
keeps: every search list, the baseline and ``also_try``, the budget's sampler, so the grid the
loop meets is the one the GPU sweep meets. The H200 lease of 2026-11-27 was lost to a loop that
hung on its grid's size after preflight; this shows such a hang at once (exit 3 with no trial
is still a pass here if the note says why: the twin's data may truncate differently).

What it cannot show: anything of CUDA's own (a package opening CUDA in the fork server, kernels,
memory). Exit status: launch's.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml


def cpu_twin(space: dict[str, Any]) -> dict[str, Any]:
    """The space's CPU twin (a new dict; the search lists and named configs untouched)."""
    twin = copy.deepcopy(space)
    twin["study"] = f"{space.get('study', 'space')}-cpu-rehearsal"
    twin.setdefault("hardware", {})["device"] = "cpu"
    workload = twin.setdefault("workload", {})
    model = workload.get("model") or {}
    if model.get("arch") is not None:
        model["size"] = "tiny"
        workload.setdefault("tokenizer", {})["vocab_size"] = 512
    generate = (workload.get("dataset") or {}).get("generate")
    if isinstance(generate, dict):
        generate["samples"] = min(int(generate.get("samples", 800)), 800)
    trial = twin.setdefault("trial", {})
    trial["warmup"] = {**(trial.get("warmup") or {}), "max_steps": 10, "max_seconds": 60}
    trial["measure"] = {"min_steps": 3, "min_seconds": 1, "max_seconds": 3}
    trial["timeout_s"] = 300
    trial["slow_precision_factor"] = 1000
    return twin


def gpu_twin(space: dict[str, Any], gpu: str, study: str) -> dict[str, Any]:
    """The space as recorded on another GPU of the catalog (``gpu``: its key in
    sweeper/gpus.yaml), under the study name ``study``: the catalog's name and price, every
    other line as it is. A lease draws the GPU kind; ``scripts/gpu-record.sh --gpu`` records
    the H100's levers space on an H200 so, priced as what ran."""
    from sweeper.catalog import load_catalog

    gpus = load_catalog().gpus
    if gpu not in gpus:
        raise SystemExit(f"error: --gpu {gpu!r} is not in the catalog; one of: {', '.join(gpus)}")
    twin = copy.deepcopy(space)
    twin["study"] = study
    hardware = twin.setdefault("hardware", {})
    hardware["name"] = gpus[gpu].name
    hardware["usd_per_hour"] = gpus[gpu].price.usd_per_hour
    return twin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("space", type=Path, help="the GPU space file")
    parser.add_argument("--minutes", type=float, default=4.0, help="launch's --max-minutes")
    parser.add_argument("--keep", type=Path, help="folder for the twin and its study")
    parser.add_argument(
        "--gpu-twin",
        nargs=3,
        metavar=("GPU", "STUDY", "OUT"),
        help="write the space as recorded on catalog GPU GPU under study STUDY to OUT, and stop "
        "(no rehearsal): what scripts/gpu-record.sh --gpu runs",
    )
    args = parser.parse_args()
    try:
        space = yaml.safe_load(args.space.read_text())
    except (OSError, yaml.YAMLError) as e:
        print(f"error: {args.space}: {e}", file=sys.stderr)
        return 2
    if args.gpu_twin:
        gpu, study, out = args.gpu_twin
        Path(out).write_text(yaml.safe_dump(gpu_twin(space, gpu, study), sort_keys=False))
        print(f"{out}: {args.space} on {gpu}, study {study}")
        return 0
    folder = args.keep or Path(tempfile.mkdtemp(prefix="rehearsal-"))
    folder.mkdir(parents=True, exist_ok=True)
    twin_path = folder / f"{args.space.stem}-cpu.yaml"
    twin_path.write_text(yaml.safe_dump(cpu_twin(space), sort_keys=False))
    print(f"rehearsal: {twin_path} (study in {folder / 'study.db'})", flush=True)
    sweeper = Path(sys.executable).with_name("sweeper")
    command = [str(sweeper)] if sweeper.exists() else [sys.executable, "-m", "sweeper.cli"]
    env = {k: v for k, v in os.environ.items() if k != "SWEEPER_STORAGE"}
    return subprocess.call(
        [*command, "launch", "--space", str(twin_path), "--storage",
         f"sqlite:///{folder / 'study.db'}", "--max-minutes", str(args.minutes)],
        env=env,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
