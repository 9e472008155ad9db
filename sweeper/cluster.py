"""Workers on the engines people already run (Kubernetes, SkyPilot, Slurm): the one worker
command every recipe runs, the SkyPilot task ``sweeper cluster skypilot`` writes from a space,
and the hours per run that feed SkyPilot's time estimate.

Every recipe under ``deploy/`` starts a worker the way ``docker-compose.yml`` does,
``sweeper launch --space FILE`` with ``SWEEPER_STORAGE`` in the environment, plus ``--join``:
a replacement pod (an Indexed Job's pod keeps its host name, ``JOB-INDEX``) or two Slurm array
tasks on one node (each sees its GPU as ``CUDA_VISIBLE_DEVICES=0``) look like the same host and
devices as a worker that may still be marked alive, and ``launch`` refuses that unless told.
``launch --workers N`` starts its workers with the same command.

Each worker runs its space's ``budget.n_trials``; a pool of N workers runs N times that,
every config at most once (workers claim configs in the database).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
import yaml

from sweeper.cli_common import HELP_CONTEXT
from sweeper.errors import SweeperError

if TYPE_CHECKING:
    from sweeper.store import Store

# argv of a worker, less the space file's path (docker-compose.yml runs it without --join:
# every container there has a host name of its own)
WORKER_COMMAND = ("sweeper", "launch", "--join", "--space")
# what a worker reads from its environment: the one database every worker shares
WORKER_ENV = ("SWEEPER_STORAGE",)


class ClusterError(SweeperError):
    """A recipe cannot be written from what was given (a --gpu that is not NAME=USD_PER_HOUR,
    an output directory outside the one SkyPilot syncs)."""


@dataclass(frozen=True, kw_only=True)
class GpuOffer:
    """One GPU type a worker may run on, as SkyPilot names it (``H100``, ``A100-80GB``), and
    what it costs per hour: the price its study is priced at."""

    accelerator: str
    usd_per_hour: float

    @property
    def slug(self) -> str:
        """The accelerator in a study or file name: ``A100-80GB`` → ``a100-80gb``."""
        return re.sub(r"[^a-z0-9]+", "-", self.accelerator.lower()).strip("-")

    @property
    def name_pattern(self) -> str:
        """A bash ``case`` pattern for the name nvidia-smi gives this GPU, upper-cased:
        ``A100-80GB`` → ``*A100*80GB*`` (matches ``NVIDIA A100-SXM4-80GB``)."""
        tokens = [t for t in re.split(r"[^A-Z0-9]+", self.accelerator.upper()) if t]
        return "*" + "*".join(tokens) + "*"


def parse_gpu(text: str) -> GpuOffer:
    """``--gpu H100=2.99`` (or ``H100:1=2.99``): a GPU type and its $/h; one GPU per worker.

    >>> parse_gpu("A100-80GB:1=1.79")
    GpuOffer(accelerator='A100-80GB', usd_per_hour=1.79)
    """
    name, sep, price = text.partition("=")
    accelerator, _, count = name.strip().partition(":")
    example = "e.g. --gpu H100=2.99 (SkyPilot's GPU name = its $ per hour)"
    if not sep or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", accelerator):
        raise ClusterError(f"--gpu {text!r}: give NAME=USD_PER_HOUR, {example}")
    if count not in ("", "1"):
        raise ClusterError(
            f"--gpu {text!r}: one GPU per worker (a worker measures one device); run more "
            f"workers instead, {example}"
        )
    try:
        usd_per_hour = float(price)
    except ValueError:
        usd_per_hour = -1.0
    if not usd_per_hour > 0 or usd_per_hour == float("inf"):
        raise ClusterError(f"--gpu {text!r}: the price must be a positive number, {example}")
    return GpuOffer(accelerator=accelerator, usd_per_hour=usd_per_hour)


def gpu_space(space_text: str, source: str, offer: GpuOffer) -> str:
    """The space of ``space_text`` as swept on ``offer``'s GPU: study ``STUDY-GPU``, hardware
    named and priced as the offer, on CUDA. One study per GPU type, so that ``sweeper best
    --across-hardware`` compares them. Raises SpaceError for a space that does not load."""
    from sweeper.space import parse_space

    space = parse_space(space_text, source)
    data = yaml.safe_load(space_text)
    data["study"] = f"{space.study}-{offer.slug}"
    data["hardware"] = {
        **data.get("hardware", {}),
        "name": offer.accelerator,
        "usd_per_hour": offer.usd_per_hour,
        "device": "cuda",
    }
    header = f"# {source} swept on {offer.accelerator} (written by `sweeper cluster skypilot`)\n"
    text = header + yaml.safe_dump(data, sort_keys=False)
    parse_space(text, f"{source} on {offer.accelerator}")  # what the worker will load
    return text


def _task_yaml(
    *,
    name: str,
    offers: Sequence[GpuOffer],
    spaces: Mapping[str, str],
    comment: str,
    resources: Mapping[str, Any] | None = None,
    run: bool = True,
    setup: bool = True,
    pool_workers: int | None = None,
) -> str:
    """One SkyPilot task YAML (``run`` False: a pool's, which only sets machines up)."""
    task: dict[str, Any] = {"name": name}
    if pool_workers is not None:
        task["pool"] = {"workers": pool_workers}
    task["resources"] = {
        "any_of": [{"accelerators": f"{o.accelerator}:1"} for o in offers],
        **(resources or {}),
    }
    # the checkout is the workdir: setup installs it as the Dockerfile does, and the spaces
    # are read from it by the same relative paths
    if setup:
        task["workdir"] = "."
        task["setup"] = 'pip install -c constraints.txt "torch==2.13.0" .\n'
    if run:
        # given at launch (--secret SWEEPER_STORAGE), never written into the file
        task["secrets"] = dict.fromkeys(WORKER_ENV)
        task["run"] = _run_script(offers, spaces)
    return comment + yaml.dump(task, Dumper=_BlockDumper, sort_keys=False, width=100)


class _BlockDumper(yaml.SafeDumper):
    """Writes a multi-line string (a script) as a ``|`` block, as people write task YAML."""


def _block(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    style = "|" if "\n" in text else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _block)


def _run_script(offers: Sequence[GpuOffer], spaces: Mapping[str, str]) -> str:
    """The worker: the study of the GPU SkyPilot gave it, then the one worker command."""
    # more specific names first: A100-80GB before A100, L40S before L40
    ordered = sorted(
        offers, key=lambda o: (-o.name_pattern.count("*"), -len(o.name_pattern), o.slug)
    )
    cases = "".join(
        f"  {o.name_pattern}) space={shlex.quote(spaces[o.accelerator])} ;;\n" for o in ordered
    )
    listed = ", ".join(o.accelerator for o in offers)
    command = shlex.join(WORKER_COMMAND)
    return (
        "set -euo pipefail\n"
        "gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)\n"
        'case "${gpu^^}" in\n'
        f"{cases}"
        f"  *) echo \"sweeper: no study for GPU '$gpu' (this task lists {listed})\" >&2; "
        "exit 2 ;;\n"
        "esac\n"
        f'exec {command} "$space"\n'
    )


def skypilot_files(
    space_path: Path, offers: Sequence[GpuOffer], workers: int, out_dir: Path
) -> dict[Path, str]:
    """The files ``sweeper cluster skypilot`` writes, by path (relative to the current
    directory, which SkyPilot syncs as the workdir): one space per GPU type, the task YAML
    (``sky jobs launch``, or ``sky launch``), and the pool variant (a pool YAML and the job
    launched on it). Raises SpaceError for a space that does not load, ClusterError for an
    ``out_dir`` outside the current directory or a GPU type listed twice."""
    from sweeper.space import load_space

    if not offers:
        raise ClusterError("give at least one --gpu NAME=USD_PER_HOUR, e.g. --gpu H100=2.99")
    seen = [o.slug for o in offers]
    if len(set(seen)) != len(seen):
        raise ClusterError(f"--gpu: a GPU type is listed twice ({', '.join(seen)})")
    out = Path(out_dir)
    if out.is_absolute() or ".." in out.parts:
        raise ClusterError(
            f"--out {out_dir}: give a directory under the current one (SkyPilot syncs the "
            "current directory, your sweeper checkout, as the task's workdir)"
        )
    study = load_space(space_path).study
    text = space_path.read_text(encoding="utf-8")
    files: dict[Path, str] = {}
    spaces: dict[str, str] = {}
    for offer in offers:
        path = out / "spaces" / f"{study}-{offer.slug}.yaml"
        files[path] = gpu_space(text, str(space_path), offer)
        spaces[offer.accelerator] = path.as_posix()
    regenerate = shlex.join(
        ["sweeper", "cluster", "skypilot", "--space", str(space_path)]
        + [f"--gpu={o.accelerator}={o.usd_per_hour:g}" for o in offers]
        + ["--workers", str(workers), "--out", out.as_posix()]
    )
    task = out / "sweeper-workers.yaml"
    files[task] = _task_yaml(
        name=f"sweeper-{study}",
        offers=offers,
        spaces=spaces,
        # SIGTERM (exit 143) is a preemption or a cancel: the worker marked its trial
        # interrupted and the replacement re-runs it; a config error (exit 2) is not retried
        # more than max_restarts_on_errors
        resources={"job_recovery": {"max_restarts_on_errors": 3, "recover_on_exit_codes": [143]}},
        comment=(
            f"# {workers} sweeper workers of study {study}, one GPU each, one study per GPU\n"
            f"# type. Written by: {regenerate}\n"
            f"#   sky jobs launch --num-jobs {workers} --secret SWEEPER_STORAGE {task.as_posix()}\n"
            "# Each worker runs the space's budget.n_trials; see deploy/README.md.\n"
        ),
    )
    pool = out / "sweeper-pool.yaml"
    files[pool] = _task_yaml(
        name=f"sweeper-{study}-pool",
        offers=offers,
        spaces=spaces,
        run=False,
        pool_workers=workers,
        comment=(
            f"# A pool of {workers} GPU machines set up once; the workers are jobs on it:\n"
            f"#   sky jobs pool apply -p sweeper {pool.as_posix()}\n"
            f"#   sky jobs launch --pool sweeper --num-jobs {workers} --secret SWEEPER_STORAGE "
            f"{(out / 'sweeper-pool-job.yaml').as_posix()}\n"
        ),
    )
    files[out / "sweeper-pool-job.yaml"] = _task_yaml(
        name=f"sweeper-{study}",
        offers=offers,
        spaces=spaces,
        setup=False,
        comment=f"# A sweeper worker as a job on the pool of {pool.as_posix()}.\n",
    )
    return files


def measured_hours(store: Store, studies: Sequence[str]) -> dict[str, float]:
    """Hours per run of each study's recommended config, by the accelerator the study was
    priced as (its ``hardware.name``: the SkyPilot name in a space ``sweeper cluster
    skypilot`` wrote). Raises SweeperError for a study without a recommendation."""
    from sweeper.recommend import best

    hours: dict[str, float] = {}
    for study in studies:
        recommendation = best(store, study)
        if recommendation.hours_per_run is None:
            raise ClusterError(f"study {study!r}: its recommendation has no hours per run")
        hours[recommendation.hardware_name] = recommendation.hours_per_run
    return hours


def time_estimator(hours_by_accelerator: Mapping[str, float]) -> Callable[[Any], int]:
    """A ``sky.Task.set_time_estimator`` function: seconds the training job takes on a
    candidate's accelerator, from sweeper's measured hours per run, so that SkyPilot ranks
    offers by $ per run instead of $ per hour. For the task that runs the training job
    sweeper priced, not for the sweep's workers (their length is the sweep's budget).

    >>> estimate = time_estimator({"H100": 2.0})
    >>> class Candidate:  # a sky.Resources has ``accelerators``: {name: count}
    ...     accelerators = {"H100": 1}
    >>> estimate(Candidate())
    7200
    """
    known = dict(hours_by_accelerator)

    def estimate(resources: Any) -> int:
        accelerators = getattr(resources, "accelerators", None) or {}
        for name in accelerators:
            if name in known:
                return round(known[name] * 3600)
        raise ClusterError(
            f"no measured hours for {dict(accelerators) or 'a CPU-only machine'}; sweeper "
            f"measured {', '.join(known) or 'nothing'}: restrict the task's resources to those"
        )

    return estimate


# `sweeper cluster ...`, registered by sweeper/cli.py
cluster_app = typer.Typer(
    help="Recipes that start sweeper workers on Kubernetes, SkyPilot and Slurm (deploy/).",
    no_args_is_help=True,
    context_settings=HELP_CONTEXT,
)


@cluster_app.command(
    "skypilot",
    short_help="Write a SkyPilot task (and a pool variant) running workers on a set of GPU "
    "types, one study per type.",
)
def skypilot_command(
    space: Annotated[
        Path, typer.Option("--space", help="the space to sweep, e.g. spaces/h100.yaml")
    ],
    gpus: Annotated[
        list[str],
        typer.Option(
            "--gpu",
            help="a GPU type as SkyPilot names it and its $ per hour, e.g. --gpu H100=2.99 "
            "--gpu A100-80GB=1.79 --gpu L40S=0.99: one study per type",
        ),
    ],
    workers: Annotated[int, typer.Option("--workers", min=1, help="worker jobs, one GPU each")] = 4,
    out: Annotated[
        Path, typer.Option("--out", help="directory under this one to write into")
    ] = Path("skypilot"),
    force: Annotated[bool, typer.Option("--force", help="replace files that exist")] = False,
) -> None:
    """Write a SkyPilot task (and a pool variant) that runs sweeper workers on a set of GPU
    types, one study per type (compare them with `sweeper best --across-hardware`). Run it
    from your sweeper checkout: SkyPilot syncs it as the workdir and installs it there."""
    from sweeper.cli_common import fail
    from sweeper.console import console
    from sweeper.errors import SpaceError

    try:
        offers = [parse_gpu(text) for text in gpus]
        files = skypilot_files(space, offers, workers, out)
    except SpaceError as e:
        raise fail(f"invalid space file\n{e}", code=2) from None
    except ClusterError as e:
        raise fail(str(e), code=2) from None
    taken = [str(path) for path in files if path.exists() and not force]
    if taken:
        raise fail(f"{', '.join(taken)} exist(s); pick another --out, or --force", code=2)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        console.print(f"wrote {path}", highlight=False)
