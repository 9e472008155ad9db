"""Run one trial: its engine trains through the recipe's burn-in and timed window; this module
turns what the recorder saw into the trial's measurement (throughput, step times, the one-off
costs, a timed checkpoint save, MFU, peak memory and the environment).

The timing rules live in ``sweeper/trial/recipe.py``; the engines (plain loop, Trainer,
SFTTrainer) in ``sweeper/trial/engines/``.
"""

from __future__ import annotations

import contextlib
import math
import os
import platform
import re
import resource
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from sweeper.errors import TrialError
from sweeper.hardware import math_mode, peak_flops
from sweeper.job import Workload
from sweeper.measurement import parse_measurement
from sweeper.space import TrialConfig
from sweeper.trial import progress, runenv
from sweeper.trial.contention import HostWatch
from sweeper.trial.engines import EngineRun, TrialContext, engine, timer_for
from sweeper.trial.engines.readback import (
    float8_linears,
    has_generation_markers,
    parameter_share,
    sharded_share,
    tf32_matmul,
)
from sweeper.trial.oneoff import (
    CheckpointCosts,
    CompileSlot,
    compile_slot,
    graph_signature,
    signature,
    study_dir,
    timed_group_save,
)
from sweeper.trial.protocol import ChildRequest, PreparedData
from sweeper.trial.rank import Ranks
from sweeper.trial.recipe import Recorder, ci95_rel, is_steady, merge, percentile, t95
from sweeper.trial.workload import (
    HFModel,
    config_hash,
    cuda_index,
    load_tokenizer,
    resolve_device,
)

__all__ = ["ci95_rel", "is_steady", "percentile", "run_trial", "t95"]


def run_trial(request: ChildRequest, process_started_at: float) -> dict[str, Any]:
    """Train the trial's config with its engine through burn-in and a timed window; return
    the measurement."""
    assert request.config and request.settings and request.prepared
    imports_done_at = time.time()
    workload, config, settings = request.workload, request.config, request.settings
    device = resolve_device(request.device)
    ranks = Ranks.from_env()
    if ranks is not None:
        device = ranks.join(device.type, settings.collective_timeout_s)
    _configure_backends(device, config)
    tokenizer = load_tokenizer(request.prepared)
    ctx = TrialContext(
        request=request,
        device=device,
        tokenizer=tokenizer,
        recorder=Recorder(
            settings.warmup,
            settings.measure,
            timer_for(device),
            HostWatch(cuda_index(device)),
            on_phase=progress.mark,
            agree=None if ranks is None else ranks.agree,
        ),
        cache_dir=Path(request.cache_dir),
        last_phase_end=imports_done_at,
        loss_labels="replies" if request.prepared.completion_only else "all",
        ranks=ranks,
    )
    shared = study_dir(Path(request.cache_dir), request.study)
    slot = None
    if shared is not None and config.compile_mode != "none":
        slot = compile_slot(shared, _graph(request))
    ctx.phase_done("tokenizer")
    run = engine(workload.engine)(ctx)
    if ranks is None:
        return finish(ctx, run, slot, process_started_at, imports_done_at)
    window_end = time.time()
    sharded = None
    engine_save = run.notes.get("sharded_save")  # the engine's own (DeepSpeed's)
    if workload.checkpoint.save_steps is not None and engine_save is not None:
        sharded = engine_save()  # timed on every rank, as the FSDP2 save below
    elif sharded_share(run.model) is not None and workload.checkpoint.save_steps is not None:
        # every rank writes its own shards: timed on all of them, before the figures travel
        sharded = _sharded_checkpoint_cost(run.model, run.optimizer, workload, ctx, ranks)
    group = ranks.gather(_rank_figures(ctx, run))
    if ranks.rank != 0:
        return {"rank": ranks.rank}  # rank 0 writes the trial's measurement
    ctx.recorder.recording = merge([figures.pop("recording") for figures in group])
    return finish(
        ctx,
        run,
        slot,
        process_started_at,
        imports_done_at,
        group=group,
        checkpoint=None if sharded is None else (sharded, time.time() - window_end),
    )


def _communication_share(group: list[dict[str, Any]]) -> float | None:
    """The share of its step the slowest rank waited on communication: the group's step is
    that rank's, and its wait is the all-reduce itself, not a slower peer (None: not told)."""
    slowest = max(group, key=lambda figures: figures["step_time_mean_s"])
    waited = slowest.get("communication_s")
    if waited is None or slowest["step_time_mean_s"] <= 0:
        return None
    return min(1.0, waited / slowest["step_time_mean_s"])


def _sharded_checkpoint_cost(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    workload: Workload,
    ctx: TrialContext,
    ranks: Ranks,
) -> dict[str, Any]:
    """One sharded checkpoint save as a plain loop with FSDP2 saves one: torch's distributed
    checkpoint (each rank writes its shards of the weights and optimizer state, rank 0 the
    metadata), fsync'd, timed from a barrier to the last rank's end, then deleted."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    target = _checkpoint_target(workload, Path(ctx.request.cache_dir))

    def write() -> None:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state: dict[str, Any] = {"model": model_state}
        if workload.checkpoint.save_optimizer:
            state["optimizer"] = optimizer_state
        dcp.save(state, checkpoint_id=str(folder))

    # one folder for the group: named by the ranks' leader (a built-in rank's parent; a
    # script's program is its rank's child, and has the leader's pid in its environment)
    leader = os.environ.get("SWEEPER_PARENT_PID") or os.getppid()
    folder = target / f"sweeper-checkpoint-{leader}-sharded"
    _sync(ctx.device)  # the steps before it are not the save's
    return timed_group_save(ranks, folder, write, "a sharded checkpoint")


def _rank_figures(ctx: TrialContext, run: EngineRun) -> dict[str, Any]:
    """What rank 0 needs of each rank: its recording (device values read now, after the
    window's closing sync) and its own figures."""
    recording = ctx.recorder.recording
    for step in [*recording.burn_in, *recording.window]:
        step.real_tokens = int(step.real_tokens)
        step.rows = int(step.rows)
        step.loss = None if step.loss is None else float(step.loss)
    times = recording.window_times
    share = parameter_share(run.model)  # FSDP2's shards, ZeRO-3's partitions
    return {
        "recording": recording,
        "rank": ctx.ranks.rank,
        "step_time_mean_s": sum(times) / len(times),
        "window_s": recording.window_s,
        "rows": sum(step.rows for step in recording.window),
        "peak_memory_bytes": _peak_memory(ctx.device)["peak_memory_bytes"],
        "parameter_share": share,
        "first_batch": run.notes.get("first_batch"),
        "communication_s": run.notes.get("communication_s"),
    }


def finish(
    ctx: TrialContext,
    run: EngineRun,
    slot: CompileSlot | None,
    process_started_at: float,
    imports_done_at: float,
    group: list[dict[str, Any]] | None = None,
    checkpoint: tuple[dict[str, Any], float] | None = None,
) -> dict[str, Any]:
    """The measurement of a trial whose recorder is done: the window's figures, the one-off
    costs (compile, a checkpoint save), MFU, memory and the environment. Shared by the
    built-in engines and a user's script (``sweeper.trial.hook``). On several devices rank 0
    finishes with every rank's figures (``group``) and the group's merged recording, and a
    sharded checkpoint's figures and phase seconds where the ranks timed one (``checkpoint``)."""
    request, device = ctx.request, ctx.device
    assert request.config and request.prepared
    workload, config = request.workload, request.config
    shared = study_dir(Path(request.cache_dir), request.study)
    recording = ctx.recorder.recording
    _check_finite(ctx.recorder.losses())
    window_end = time.time()
    progress.mark("checkpoint")
    devices = 1 if group is None else len(group)
    if checkpoint is None:
        saved = _checkpoint_cost(
            run.model, run.optimizer, workload, Path(request.cache_dir), device, shared
        )
        checkpoint_phase_s = time.time() - window_end
    else:
        saved, checkpoint_phase_s = checkpoint
    progress.mark("done")

    summary = recording.summary()
    tokens_per_s = summary["tokens_per_s"]
    losses = [float(loss) for loss in ctx.recorder.losses()]
    model = run.model
    n_params = sum(_numel(p) for p in model.parameters())
    trainable = sum(_numel(p) for p in model.parameters() if p.requires_grad)
    return measurement(
        {
            **summary,
            # packed rows hold several samples (and parts of them): count samples by their tokens
            "samples_per_s": tokens_per_s / (request.prepared.tokens_per_sample or math.nan)
            if config.packing
            else summary["rows_per_s"],
            **_compile_cost(config, summary["warmup_excess_s"], slot),
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "losses": losses,
            "loader_epochs": run.loader_epochs,
            "n_params": n_params,
            "trainable_params": trainable,
            "engine": workload.engine,
            # what ran, read back from torch: the optimizer class (fused kernel?), TF32 matmuls
            "optimizer": run.optimizer_name,
            "tf32_matmul": device.type == "cuda" and tf32_matmul(),
            "effective_batch": config.per_device_batch_size
            * config.gradient_accumulation_steps
            * devices,
            "devices": devices,
            "ranks": None
            if group is None
            else [{k: v for k, v in figures.items() if k != "recording"} for figures in group],
            "communication_share": None if group is None else _communication_share(group),
            "packing": config.packing,
            "cross_sample_attention": run.notes.get("cross_sample_attention"),
            "float8_share": _float8_share(model) if config.precision == "fp8" else None,
            "effective": run.effective,
            "own_values": run.notes.get("own_values") or None,
            "program_run": run.notes.get("program_run"),
            "unreached": run.notes.get("unreached") or None,
            "ended_in_window": run.notes.get("ended_in_window"),
            "loss_labels": ctx.loss_labels,
            "reply_markers": None
            if request.prepared.chat_template is None
            else has_generation_markers(request.prepared.chat_template),
            "startup_s": ctx.startup_s
            if ctx.startup_s is not None
            else ctx.last_phase_end - process_started_at,
            **saved,
            **_mfu(
                device,
                config,
                model.config,
                _matmul_params(model),
                trainable,
                summary["tokens_per_s"],
                summary["mean_sample_tokens"],
                devices,
            ),
            **_peak_memory(device),
            # on several devices: the largest rank's (what each device must hold)
            **(
                {}
                if group is None
                else {"peak_memory_bytes": max(f["peak_memory_bytes"] for f in group)}
            ),
            "phases_s": {
                "spawn_to_start": max(0.0, process_started_at - request.spawned_at)
                if request.spawned_at
                else None,
                "imports": imports_done_at - process_started_at,
                **ctx.phases,
                "warmup": summary["warmup_s"],
                "window": recording.window_s,
                "checkpoint": checkpoint_phase_s,
            },
            "env": environment(device, config_hash(model.config), request.prepared),
        }
    )


def measurement(values: dict[str, Any]) -> dict[str, Any]:
    """The trial's ``Measurement``, validated here in the child (a key this module misspells
    fails the trial, naming it) and sent as its payload."""
    return parse_measurement(values).model_dump()


def _graph(request: ChildRequest) -> dict[str, Any]:
    assert request.config is not None and request.prepared is not None
    workload = request.workload
    return graph_signature(
        request.config.model_dump(),
        {
            "model": workload.model.model_dump(mode="json"),
            "adapter": None
            if workload.adapter is None
            else workload.adapter.model_dump(mode="json"),
            "engine": workload.engine,
            "tokenizer": request.prepared.tokenizer_path,
        },
        torch.__version__,
    )


def _compile_cost(
    config: TrialConfig, warmup_excess_s: float, slot: CompileSlot | None
) -> dict[str, Any]:
    """What compile costs a run (cold), and what this trial measured."""
    if config.compile_mode == "none":
        return {"compile_s": 0.0}
    measured = {"compile_measured_s": warmup_excess_s}
    if slot is None:  # no study: a private cache, cold
        return {"compile_s": warmup_excess_s, "compile_cache": "cold", **measured}
    if slot.cold_s is not None:
        return {
            "compile_s": slot.cold_s,
            "compile_cache": "warm",
            "compile_signature": slot.signature,
            **measured,
        }
    slot.record_cold(warmup_excess_s)
    return {
        "compile_s": warmup_excess_s,
        "compile_cache": "cold",
        "compile_signature": slot.signature,
        **measured,
    }


def _state_signature(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    workload: Workload,
    target: Path,
) -> str:
    """What a checkpoint save writes and where, read from the objects that trained."""
    dtype_bytes: dict[str, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        key = str(tensor.dtype)
        dtype_bytes[key] = dtype_bytes.get(key, 0) + tensor.numel() * tensor.element_size()
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps it
    return signature(
        {
            "model": type(model).__name__,
            "config": config_hash(model.config),
            "bytes": dtype_bytes,
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "adapter": None
            if workload.adapter is None
            else workload.adapter.model_dump(mode="json"),
            "optimizer": type(inner).__name__,
            "save_optimizer": workload.checkpoint.save_optimizer,
            "dir": str(target.resolve()),
            "host": socket.gethostname(),
        }
    )


def _checkpoint_cost(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    workload: Workload,
    cache_dir: Path,
    device: torch.device,
    shared: Path | None,
) -> dict[str, Any]:
    """The cost of one checkpoint save: the study's figure for this state where it has one,
    otherwise saved and timed here (and kept for the study's later trials)."""
    if workload.checkpoint.save_steps is None:
        return {"checkpoint_save_s": None, "checkpoint_bytes": None}
    target = _checkpoint_target(workload, cache_dir)
    if shared is None:
        return {**_time_checkpoint(model, optimizer, workload, target, device),
                "checkpoint_source": "measured"}  # fmt: skip
    state = _state_signature(model, optimizer, workload, target)
    costs = CheckpointCosts(shared)
    known = costs.get(state)
    if known is not None:
        return {
            "checkpoint_save_s": float(known["save_s"]),
            "checkpoint_bytes": int(known["bytes"]),
            "checkpoint_source": "reused",
            "checkpoint_signature": state,
        }
    figures = _time_checkpoint(model, optimizer, workload, target, device)
    costs.put(state, figures["checkpoint_save_s"], figures["checkpoint_bytes"])
    return {**figures, "checkpoint_source": "measured", "checkpoint_signature": state}


def _checkpoint_target(workload: Workload, cache_dir: Path) -> Path:
    spec = workload.checkpoint
    return Path(spec.dir).expanduser() if spec.dir else cache_dir / "checkpoints"


def _time_checkpoint(
    model: HFModel,
    optimizer: torch.optim.Optimizer,
    workload: Workload,
    target: Path,
    device: torch.device,
) -> dict[str, Any]:
    """Save one checkpoint as Trainer does (safetensors weights, optimizer state), fsync it,
    time it, delete it. The real run pays this every ``checkpoint.save_steps`` steps."""
    spec = workload.checkpoint
    try:
        target.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="sweeper-checkpoint-", dir=target))
    except OSError as e:
        raise TrialError(
            "error",
            f"workload.checkpoint.dir: cannot write a checkpoint under {target}: {e.strerror}; "
            "point it at a writable directory on the disk the run saves to",
        ) from e
    try:
        _sync(device)
        started = time.perf_counter()
        model.save_pretrained(str(folder), safe_serialization=True)
        if spec.save_optimizer:
            torch.save(optimizer.state_dict(), folder / "optimizer.pt")
        written = [f for f in folder.iterdir() if f.is_file()]
        for path in written:  # on the disk, not just in the page cache
            with path.open("rb") as f:
                os.fsync(f.fileno())
        save_s = time.perf_counter() - started
        size = sum(f.stat().st_size for f in written)
    except OSError as e:
        raise TrialError(
            "error", f"saving a checkpoint under {target} failed: {e.strerror or e}"
        ) from e
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {"checkpoint_save_s": save_s, "checkpoint_bytes": size}


def _check_finite(losses: list[Any]) -> None:
    for index, loss in enumerate(losses):
        value = float(loss)
        if not math.isfinite(value):
            raise TrialError("nonfinite", f"loss became {value} at optimizer step {index + 1}")


def _configure_backends(device: torch.device, config: TrialConfig) -> None:
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = config.tf32
        torch.backends.cudnn.allow_tf32 = config.tf32
        if config.precision == "bf16" and not torch.cuda.is_bf16_supported():
            raise TrialError("unsupported", "bf16 is not supported on this GPU; use fp16 or fp32")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _numel(parameter: torch.Tensor) -> int:
    """Elements of a parameter as the model uses it: a 4-bit bitsandbytes weight is stored
    packed, two values a byte; its quant_state holds the real shape."""
    state = getattr(parameter, "quant_state", None)
    shape = getattr(state, "shape", None)
    whole = getattr(parameter, "ds_numel", None)  # DeepSpeed ZeRO-3: partitioned, empty here
    if whole is not None:
        return int(whole)
    return math.prod(shape) if shape is not None else parameter.numel()


def _matmul_params(model: HFModel) -> int:
    """Parameters that do matmuls per token: all but embedding lookups; a tied LM head counts."""
    total = sum(_numel(p) for p in model.parameters())
    embeddings = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embeddings
    lookups = 0 if tied else _numel(embeddings)
    position = getattr(
        getattr(model, "transformer", None), "wpe", None
    )  # GPT-2's learned positions
    if position is not None:
        lookups += _numel(position.weight)
    return total - lookups


def _float8_share(model: torch.nn.Module) -> float:
    converted, total = float8_linears(model)
    return converted / total if total else 0.0


def _mfu(
    device: torch.device,
    config: TrialConfig,
    model_config: Any,
    matmul_params: int,
    trainable_params: int,
    real_tokens_per_s: float,
    mean_context: float,
    devices: int = 1,
) -> dict[str, Any]:
    """Model FLOPs utilisation (PaLM appendix B: 6N + 12·L·d·T per token, fwd + bwd) over the
    REAL tokens only: padding is computed but is not work (Megatron's accounting), so a config
    that pads half its rows cannot look efficient. T is the real tokens a token attends over
    (a sample's, or a packed row's). It counts what trains: the forward (2N) and the gradients
    of activations (2N) pass every weight, the gradients of weights (2N) only the trainable
    ones: 4N + 2·N_trainable (a LoRA adapter's few). Recomputed activations (gradient
    checkpointing) are not useful work and not counted. fp8 is measured against the bf16 peak
    (as torchtitan reports it), so its MFU compares with bf16's."""
    weight_grads = min(trainable_params, matmul_params)
    flops_per_token = (
        4 * matmul_params
        + 2 * weight_grads
        + 12 * model_config.num_hidden_layers * (model_config.hidden_size * mean_context)
    )
    achieved = flops_per_token * real_tokens_per_s
    result: dict[str, Any] = {
        "flops_per_token": flops_per_token,
        "achieved_tflops": achieved / 1e12,
        "mfu": None,
        "peak_tflops": None,
    }
    if device.type == "cuda":
        peak = peak_flops(torch.cuda.get_device_name(device))
        if peak is not None:
            precision = "bf16" if config.precision == "fp8" else config.precision
            tflops = peak.tflops(math_mode(precision, config.tf32))
            # the group's tokens over the group's peak
            result.update(
                mfu=achieved / (devices * tflops * 1e12), peak_tflops=tflops, peak_name=peak.name
            )
    return result


def _peak_memory(device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        return {
            "peak_memory_bytes": torch.cuda.max_memory_allocated(device),
            "peak_memory_reserved_bytes": torch.cuda.max_memory_reserved(device),
            "device_memory_bytes": torch.cuda.get_device_properties(device).total_memory,
            "memory_kind": "cuda_max_allocated",
        }
    # ru_maxrss is KiB on Linux; it covers this process, not DataLoader workers
    return {
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "device_memory_bytes": host_memory_bytes(),
        "memory_kind": "cpu_peak_rss",
    }


def host_memory_bytes() -> int:
    """Physical memory, or the cgroup's limit when it is lower (a container)."""
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            return min(physical, int(limit))
    return physical


def environment(device: torch.device, model_hash: str, prepared: PreparedData) -> dict[str, Any]:
    """What the numbers were measured on: enough to refuse comparing apples with pears."""
    import transformers

    cuda = device.type == "cuda"
    return {
        "device_type": device.type,
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu_name(),
        "driver": nvidia_driver() if cuda else None,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cpu_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "model_config_hash": model_hash,
        "dataset_hash": prepared.dataset_hash,
        "runtime_env": runenv.runtime_env(),
    }


def nvidia_driver() -> str | None:
    with contextlib.suppress(OSError):
        text = Path("/proc/driver/nvidia/version").read_text()
        match = re.search(r"Kernel Module(?: for x86_64)?\s+([\d.]+)", text)
        if match:
            return match.group(1)
    return None


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "cpu"
