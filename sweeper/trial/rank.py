"""One rank of a multi-device trial: ``python -m sweeper.trial.rank REQUEST RESULT``.

Started by the trial's leader (``sweeper.trial.group``) with torchrun's environment. Each rank
trains the config on its device in one ``torch.distributed`` group (gloo on the CPU, NCCL on
CUDA, every collective bounded by ``trial.collective_timeout_s``), reads its own share of the
data, and feeds its own recorder; the recorders decide together when burn-in and the window
end (``Ranks.agree``), so all ranks time the same steps. Rank 0 gathers every rank's steps and
figures and writes the trial's measurement. Exit status: 0 with a result, 1 with a failure.
"""

from __future__ import annotations

import time

PROCESS_STARTED_AT = time.time()

import os  # noqa: E402
import sys  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from sweeper.trial.lifeline import die_with_parent  # noqa: E402


@dataclass
class Ranks:
    """This process's place in the group, and the group's few host-side exchanges."""

    rank: int
    world: int
    local_rank: int
    # gloo: the exchanges of host values (verdicts, figures) never wait on a CUDA stream
    host_group: Any = None

    @classmethod
    def from_env(cls) -> Ranks | None:
        """The rank torchrun's environment names, or None outside a group."""
        from sweeper.trial.group import RANK_ENV

        if RANK_ENV not in os.environ:
            return None
        return cls(
            rank=int(os.environ["RANK"]),
            world=int(os.environ["WORLD_SIZE"]),
            local_rank=int(os.environ["LOCAL_RANK"]),
        )

    def join(self, device_type: str, timeout_s: float) -> Any:
        """Join the process group; this rank's device."""
        import torch
        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s)
        if device_type == "cuda":
            torch.cuda.set_device(self.local_rank)
            device = torch.device("cuda", self.local_rank)
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
            self.host_group = dist.new_group(backend="gloo", timeout=timeout)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo", timeout=timeout)
            self.host_group = dist.group.WORLD
        return device

    def adopt(self, timeout_s: float) -> str | None:
        """Take the process group a user's script made (``engine: script``): the hook's own
        host-side exchanges get a gloo group of their own, bounded by ``timeout_s``. What is
        wrong with the script's group, when it is not the launch's (None: nothing)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return (
                f"devices: asked {self.world}, ran 1: rank {self.rank} reached its first step "
                "without a torch.distributed process group, so each rank trained alone (the "
                f"script ignored the launch's WORLD_SIZE={self.world}); call "
                "torch.distributed.init_process_group() (it reads torchrun's environment) and "
                "wrap the model in DistributedDataParallel, or use Trainer/accelerate, which do "
                "both under torchrun"
            )
        if dist.get_world_size() != self.world:
            return (
                f"devices: asked {self.world}, ran {dist.get_world_size()}: the script's "
                f"process group has {dist.get_world_size()} ranks, the launch started {self.world}"
            )
        self.host_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
        return None

    def agree(self, verdict: bool) -> bool:
        """True when any rank's verdict is: the phase ends for all together."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor([int(verdict)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.host_group)
        return bool(flag.item())

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable), in rank order."""
        import torch.distributed as dist

        values: list[Any] = [None] * self.world
        dist.all_gather_object(values, value, group=self.host_group)
        return values

    def close(self) -> None:
        """The end of the hook's own exchanges (``engine: script``), once the last is done:
        its gloo group is destroyed and let go now, while the interpreter lives. Left to the
        program's exit, gloo's worker threads may still hold the last exchange's tensors when
        the interpreter is finalizing; the thread that lets go of them needs the GIL and the
        rank aborts ("terminate called without an active exception", exit -6, after a kept
        measurement: a CI run's rank 1; the mechanism as in pytorch/pytorch#179291)."""
        import torch.distributed as dist

        group, self.host_group = self.host_group, None
        if group is not None and dist.is_initialized() and group is not dist.group.WORLD:
            dist.destroy_process_group(group)

    def leave(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def wrap(model: Any, strategy: str | None, device: Any) -> Any:
    """The model as the user's launch wraps it: DDP around it, or FSDP2's ``fully_shard`` on
    each decoder layer and then the root (parameters, gradients and optimizer state sharded;
    the optimizer must be built after this, on the sharded parameters)."""
    import torch

    from sweeper.errors import TrialError

    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)
    if strategy == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        # the decoder layers: the first (outermost) ModuleList, model.model.layers in HF's
        # decoders; a list inside a layer (MoE experts) goes with its layer
        layers: Any = next((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), [])
        for layer in layers:
            fully_shard(layer)
        fully_shard(model)
        return model
    raise TrialError(
        "unsupported",
        f"data_parallel {strategy}: the plain loop wraps ddp and fsdp2 only (DeepSpeed ZeRO "
        "runs through engine trainer or sft)",
    )


class ExposedCommunication:
    """Seconds per step the backward waited on DDP's gradient all-reduce after its own
    compute ended, over the timed window, from DDP's own runtime stats (its reducer times each
    backward's compute and communication; ``avg_backward_comm_time`` minus the overlap with
    compute is what the step waits). On a CPU DDP is told to record every step (host clocks:
    nothing added to the step); on CUDA its timer synchronizes, so DDP keeps its own sampling
    (its first 10 steps, then every 100th) and a window without a sampled step says None.
    A rank's wait includes waiting for a slower peer. DDP records a step's stats at the next
    forward, so the steps counted are the window's shifted back by one."""

    def __init__(self, ddp: Any) -> None:
        self.ddp = ddp
        self._start: tuple[int, float] | None = None
        if next(ddp.parameters()).device.type == "cpu":
            ddp._set_ddp_runtime_logging_sample_rate(1)

    def _totals(self) -> tuple[int, float]:
        """Steps recorded so far, and the exposed seconds summed over them."""
        data = self.ddp._get_ddp_logging_data()
        steps = int(data.get("iteration", 0) or 0)
        exposed_ns = float(data.get("avg_backward_comm_time", 0) or 0) - float(
            data.get("avg_backward_compute_comm_overlap_time", 0) or 0
        )
        return steps, steps * exposed_ns / 1e9

    def window_started(self) -> None:
        if self._start is None:
            self._start = self._totals()

    def per_step_s(self) -> float | None:
        if self._start is None:
            return None
        steps, total = self._totals()
        if steps <= self._start[0]:
            return None
        return max(0.0, (total - self._start[1]) / (steps - self._start[0]))


def main(argv: list[str]) -> int:
    parent = os.environ.get("SWEEPER_PARENT_PID")
    die_with_parent(int(parent) if parent else None)
    from sweeper.trial.runner import execute

    result = execute(Path(argv[0]), Path(argv[1]), PROCESS_STARTED_AT)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if result.status == "ok" else 1)  # no teardown: see sweeper/trial/__main__.py


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
