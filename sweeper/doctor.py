"""``sweeper doctor``: what this machine can do, said before any sweep spends money.

    sweeper doctor                         # devices, versions, precisions, attention, compile, ...
    sweeper doctor --space spaces/h100.yaml   # and whether this space can run here (exit 1 if not)

Three sources, each measured here rather than looked up:

- a facts child (``sweeper.trial.facts``): devices, driver, CUDA, torch/transformers and the
  optional packages, which precisions run, free device memory, CPU cores, the model's size;
- the sweep's own preflight (``sweeper.preflight.run_preflight`` with ``collect=True``): each
  attention implementation and compile mode trains a one-layer model of the workload, and the
  workload's precision is timed against fp32;
- a write of ``write_mb`` MiB, fsynced, where checkpoints go.

``findings`` turns them into verdicts: a *problem* is something the space asks for that this
machine cannot do (the exit status is 1, and each problem names its fix); a *warning* is
something that runs but will mislead or waste (a GPU price on a CPU, more workers than cores).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sweeper import duration
from sweeper.errors import SweeperError
from sweeper.hardware import peak_flops
from sweeper.launcher import ForkServer, run_child
from sweeper.preflight import PreflightReport, ProbeCache, run_preflight, short_run_of
from sweeper.recommendation import param_count
from sweeper.space import Space, TrialConfig, parse_space
from sweeper.trial.protocol import ChildRequest, PreparedData

if TYPE_CHECKING:
    from sweeper.store import TrialRow

# Without a space, doctor probes every attention implementation and the default compile mode
# on a two-layer Llama; the precision is the device's best (bf16 on a CPU is timed, not assumed).
_DEFAULT_SPACE = """\
study: doctor
hardware: {{name: this machine, usd_per_hour: 1.0, device: auto}}
workload:
  model: {{arch: llama, size: tiny}}
  tokenizer: {{vocab_size: 1024}}
  dataset: {{generate: {{samples: 64, median_chars: 400}}}}
  precision: {precision}
  samples: 1000
  epochs: 1
search:
  per_device_batch_size: [4]
  gradient_accumulation_steps: [1]
  num_workers: [0]
  prefetch_factor: [2]
  max_seq_length: [128]
  compile_mode: [none, default]
  attn_implementation: [eager, sdpa, flash_attention_2, flex_attention]
trial:
  timeout_s: 900
  slow_precision_factor: 1000   # reported, not refused: there is no workload to refuse
budget: {{n_trials: 1}}
"""
# Training state per parameter with AdamW in fp32: weights 4 + gradients 4 + two moments 8.
_TRAIN_BYTES_PER_PARAM = 16
# A frozen base parameter of a LoRA run (no gradient, no optimizer state), as trials load it:
# fp32 when not quantized (mixed precision is autocast), NF4 in 4-bit, int8 in 8-bit.
_FROZEN_BYTES_PER_PARAM = {"none": 4.0, "8bit": 1.0, "4bit": 0.5}
_FROZEN_WIDTH = {"none": "fp32, 4 bytes", "8bit": "8-bit, 1 byte", "4bit": "4-bit NF4, 0.5 byte"}
_GIB = 1024**3

Level = Literal["problem", "warning", "ok"]
_TOPICS = {"attn_implementation": "attention", "compile_mode": "compile", "precision": "precision"}


class DoctorError(SweeperError):
    """doctor could not examine the machine at all (e.g. the workload cannot be prepared)."""


@dataclass(frozen=True, kw_only=True)
class Finding:
    level: Level
    topic: str
    text: str
    fix: str | None = None


@dataclass(kw_only=True)
class DoctorReport:
    space: str | None  # the space file examined, None for the machine alone
    facts: dict[str, Any]
    preflight: PreflightReport
    disk: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    phases_s: dict[str, float] = field(default_factory=dict)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "problem"]

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def to_json(self) -> dict[str, Any]:
        return {
            "space": self.space,
            "exit_code": self.exit_code,
            "facts": self.facts,
            "preflight": self.preflight.to_json(),
            "disk": self.disk,
            "findings": [asdict(f) for f in self.findings],
            "phases_s": self.phases_s,
        }


def _size(n_bytes: float) -> str:
    """1.5 GiB, 310 MiB."""
    return f"{n_bytes / _GIB:,.1f} GiB" if n_bytes >= _GIB else f"{n_bytes / 2**20:,.0f} MiB"


def default_space(precision: str) -> Space:
    return parse_space(_DEFAULT_SPACE.format(precision=precision), "<doctor's probe space>")


def diagnose(
    space: Space | None,
    cache_dir: Path,
    *,
    space_path: str | None = None,
    write_mb: int = 256,
    progress: Callable[[str], None] = lambda _message: None,
) -> DoctorReport:
    """Examine this machine (for ``space``, if given). Raises DoctorError only when nothing
    can be examined; everything else is a finding."""
    from sweeper.errors import PrepareError
    from sweeper.sweep.prepare import prepare_workload, resolve_lengths, workload_server

    phases: dict[str, float] = {}
    started = time.perf_counter()
    progress("preparing the workload's data and tokenizer")
    # one fork server: the preparation, the facts and the probes are forked from it (its
    # imports done once, as a sweep's)
    with ForkServer(str(cache_dir)) as server:
        subject = space or default_space("fp32")
        try:
            prepared = prepare_workload(subject, cache_dir, server=server)
        except PrepareError as e:
            raise DoctorError(str(e)) from e
        # max_seq_length: auto, as a sweep; and what it says of the space as it reads it (the
        # lengths it chose, the knobs a script's command gives), as launch says it
        notes = _Notes()
        subject = resolve_lengths(subject, prepared.stats, notes)
        phases["prepare"] = time.perf_counter() - started

        started = time.perf_counter()
        progress("reading devices, versions and precisions")
        facts = _facts(subject, prepared, cache_dir, server)
        phases["facts"] = time.perf_counter() - started
        if space is None:
            subject = default_space(_best_precision(facts))

        started = time.perf_counter()
        if subject.hardware.device == "cuda" and not facts["cuda_available"]:
            # every probe would fail alike; the device finding says why
            preflight = PreflightReport()
        else:
            progress("probing attention implementations, compile modes and precision")
            with workload_server(subject, prepared, cache_dir, progress, server):
                preflight = run_preflight(
                    subject, prepared, cache_dir, note=progress, server=server, collect=True,
                    probe_cache=ProbeCache(cache_dir),
                )  # fmt: skip
        phases["preflight"] = time.perf_counter() - started

    started = time.perf_counter()
    progress("timing a write where checkpoints go")
    checkpoint_dir = subject.workload.checkpoint.dir
    target = Path(checkpoint_dir).expanduser() if checkpoint_dir else cache_dir / "checkpoints"
    disk = write_speed(target, write_mb)
    phases["disk"] = time.perf_counter() - started
    report = DoctorReport(
        space=space_path, facts=facts, preflight=preflight, disk=disk, phases_s=phases
    )
    report.findings = findings(space, facts, preflight, disk)
    if space is not None:
        report.findings += space_findings(subject, notes.said)
    if space is not None:  # the space as the sweep will search it (auto: the data's lengths)
        report.findings.append(_duration_finding(subject, facts, disk, phases))
    return report


def space_findings(space: Space, said: list[str]) -> list[Finding]:
    """What the sweep's preparation said of the space, as doctor's findings: a command whose
    own run may end before a long burn-in is measured is a warning (one that must end so is a
    preflight problem); the rest say what is."""
    short = short_run_of(space)
    return [
        Finding(
            level="warning" if short is not None and text == short[0] else "ok",
            topic="space",
            text=text,
        )
        for text in said
    ]


class _Notes:
    """What a sweep's preparation says of the space (``resolve_lengths``' notes), kept; a
    ``SweepObserver`` that hears nothing else (doctor runs no trial)."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def note(self, message: str) -> None:
        self.said.append(message)

    def prepare_started(self) -> None:
        pass

    def prepare_done(self, prepared: PreparedData, wall_s: float) -> None:
        pass

    def trial_started(self, number: int, config: TrialConfig) -> None:
        pass

    def planned(self, trials: int) -> None:
        pass

    def trial_done(self, row: TrialRow) -> None:
        pass

    def remeasuring(self, number: int | None) -> None:
        pass


def _duration_finding(
    space: Space, facts: dict[str, Any], disk: dict[str, Any], phases: dict[str, float]
) -> Finding:
    """How long each trial and the sweep will take: a range from the trial settings
    (``sweeper.duration``), the checkpoint priced at the disk speed measured here."""
    speed = disk.get("write_mb_per_s")
    e = duration.estimate(
        space,
        params=(facts.get("model") or {}).get("params"),
        write_bytes_per_s=None if not speed else speed * 2**20,
        overhead_s=phases.get("prepare", 0.0) + phases.get("preflight", 0.0),
    )
    return Finding(level="ok", topic="duration", text=duration.describe(space, e))


def _facts(
    space: Space, prepared: PreparedData, cache_dir: Path, server: ForkServer | None = None
) -> dict[str, Any]:
    run = run_child(
        ChildRequest.for_space("facts", space, cache_dir, prepared=prepared),
        timeout_s=300,
        server=server,
    )
    if run.result.status != "ok" or run.result.payload is None:
        raise DoctorError(
            f"reading this machine's facts failed ({run.result.failure_kind}): "
            f"{run.result.failure_message}\n{run.log_tail[-1500:]}"
        )
    return run.result.payload


def _best_precision(facts: dict[str, Any]) -> str:
    """The precision a user would train in here: bf16 where it runs, else fp16 on a GPU.
    On a CPU bf16 is probed too, so the report says how much slower it is than fp32."""
    precisions = facts["precisions"]
    if precisions["bf16"]["runs"]:
        return "bf16"
    if facts["device_type"] == "cuda" and precisions["fp16"]["runs"]:
        return "fp16"
    return "fp32"


def write_speed(directory: Path, size_mb: int) -> dict[str, Any]:
    """Write ``size_mb`` MiB to a file in ``directory``, fsync it, and time it (then delete)."""
    result: dict[str, Any] = {"path": str(directory), "write_mb_per_s": None, "error": None}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        result["free_bytes"] = shutil.disk_usage(directory).free
        size_mb = max(1, min(size_mb, int(result["free_bytes"] * 0.5) // 2**20))
        block = os.urandom(2**20)  # incompressible, so a compressing filesystem cannot flatter
        with tempfile.NamedTemporaryFile(dir=directory, prefix="sweeper-doctor-") as f:
            started = time.perf_counter()
            for _ in range(size_mb):
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
            elapsed = time.perf_counter() - started
    except OSError as e:
        result["error"] = f"{e.strerror or e}"
        return result
    result.update(written_mb=size_mb, write_s=elapsed, write_mb_per_s=size_mb / elapsed)
    return result


# ---------------------------------------------------------------- verdicts


def findings(
    space: Space | None,
    facts: dict[str, Any],
    preflight: PreflightReport,
    disk: dict[str, Any],
) -> list[Finding]:
    """Verdicts from what was measured; with a space, every problem names its fix."""
    found: list[Finding] = []
    found += _device_findings(space, facts)
    found += _probe_findings(space, facts, preflight)
    found += _memory_findings(space, facts)
    found += _cpu_findings(space, facts)
    found += _disk_findings(space, facts, disk)
    return found


def _device_findings(space: Space | None, facts: dict[str, Any]) -> list[Finding]:
    devices = facts["devices"]
    if devices:
        names = ", ".join(d["name"] for d in devices)
        found = [Finding(level="ok", topic="device", text=f"CUDA: {names}")]
    else:
        cpu_name = facts["cpu"]["name"]
        found = [Finding(level="ok", topic="device", text=f"no CUDA device; CPU {cpu_name}")]
    if space is None:
        return found
    wanted = space.hardware
    if wanted.device == "cuda" and not facts["cuda_available"]:
        found.append(
            Finding(
                level="problem",
                topic="device",
                text="hardware.device is cuda, but torch sees no CUDA device "
                f"(torch {facts['torch']}, built for CUDA {facts['torch_cuda'] or 'none'})",
                fix="run on a machine with a CUDA GPU and a CUDA build of torch, or set "
                "hardware.device: cpu to price this machine",
            )
        )
        return found
    expected = peak_flops(wanted.name)
    if devices:
        actual = peak_flops(devices[0]["name"])
        if expected is not None and actual is not None and expected.name != actual.name:
            found.append(
                Finding(
                    level="warning",
                    topic="device",
                    text=f"hardware.name says {wanted.name!r} ({expected.name}) but this "
                    f"GPU is {devices[0]['name']} ({actual.name}); $/run uses the space's price "
                    f"${wanted.usd_per_hour:.2f}/h",
                    fix="set hardware.name and usd_per_hour to what this machine is and costs",
                )
            )
    elif expected is not None:
        found.append(
            Finding(
                level="warning",
                topic="device",
                text=f"hardware.name says {wanted.name!r}, a GPU, but trials would run on this "
                "CPU: hours and $/run would be the CPU's, priced as the GPU",
                fix="run the space on that GPU, or rename hardware and set its price for a CPU",
            )
        )
    return found


def _probe_findings(
    space: Space | None, facts: dict[str, Any], preflight: PreflightReport
) -> list[Finding]:
    found = _precision_findings(space, facts, preflight)
    # a precision too slow here is said by _precision_findings, with its fix
    judged = {j.message for j in preflight.precision_judgements}
    for knob, value in preflight.fallbacks.items():
        reasons = "; ".join(f"{v}: {r}" for v, r in preflight.dropped.get(knob, {}).items())
        found.append(
            Finding(
                level="warning",
                topic="knobs",
                text=f"search.{knob}: no listed value can run here ({reasons}); trials would run "
                f"{knob}={value!r}",
            )
        )
    found += _outcome_findings(space, facts, preflight)
    # values dropped unprobed for what the machine lacks (a lever's CUDA, package or compute
    # capability): the sweep skips them, and the user wants to know before it does
    probed = {(o.knob, str(o.value)) for o in preflight.outcomes}
    for knob, values in preflight.dropped.items():
        if knob in preflight.fallbacks:
            continue  # said above, with what runs instead
        for value, reason in values.items():
            if (knob, value) not in probed and reason not in judged:
                found.append(
                    Finding(
                        level="warning",
                        topic="knobs",
                        text=f"search.{knob}: {value} cannot run here, the sweep skips it: "
                        f"{reason}",
                    )
                )
    for message in preflight.problems:
        if message in judged:
            continue
        found.append(
            Finding(
                level="problem" if space is not None else "warning",
                topic="preflight",
                text=message,
                fix=None,  # each preflight message ends with its own fix
            )
        )
    found += [Finding(level="warning", topic="script", text=n) for n in preflight.script_notes]
    if space is not None:
        found += _known_config_findings(space, preflight)
    return found


def _precision_findings(
    space: Space | None, facts: dict[str, Any], preflight: PreflightReport
) -> list[Finding]:
    found: list[Finding] = []
    precisions = facts["precisions"]
    for name in ("bf16", "fp16", "tf32"):
        status = precisions[name]
        found.append(
            Finding(
                level="ok",
                topic="precision",
                text=f"{name}: " + ("runs" if status["runs"] else f"no ({status['error']})"),
            )
        )
    factor = preflight.precision_factor
    subject_precision = (
        next((p for p in space.search.values("precision") if p != "fp32"), None) if space else None
    ) or next((p for p in ("bf16", "fp16") if precisions[p]["runs"]), None)
    if factor is not None and subject_precision:
        verdict = "(faster)" if factor < 1 else "(slower: use fp32 here)" if factor > 1.5 else ""
        found.append(
            Finding(
                level="ok",
                topic="precision",
                text=f"{subject_precision} autocast step: {factor:.2f}x the fp32 step time "
                + verdict,
            )
        )
    for judgement in preflight.precision_judgements:
        # refused: the sweep stops (one precision) or skips it (several); otherwise said with
        # its spread, and its trials measure it
        alone = space is not None and len(space.search.values("precision")) == 1
        found.append(
            Finding(
                level="problem" if judgement.refused and alone else "warning",
                topic="precision",
                text=judgement.text,
                fix=judgement.fix,
            )
        )
    if space is not None:
        listed = space.search.values("precision")
        where = "workload.precision" if space.workload.precision else "search.precision"
        for wanted in listed:
            # fp8 is no autocast dtype the facts probe: preflight's machine check drops it
            # (compute capability, torchao), and its finding says why
            if wanted not in precisions or precisions[wanted]["runs"]:
                continue
            alternative = "fp16" if wanted == "bf16" and precisions["fp16"]["runs"] else "fp32"
            found.append(
                Finding(
                    level="problem" if len(listed) == 1 else "warning",
                    topic="precision",
                    text=f"{where} {wanted} does not run here: {precisions[wanted]['error']}",
                    fix=f"set {where}: {alternative}"
                    if len(listed) == 1
                    else f"remove {wanted} from search.precision (the sweep would skip it)",
                )
            )
    return found


def _outcome_findings(
    space: Space | None, facts: dict[str, Any], preflight: PreflightReport
) -> list[Finding]:
    """One finding per probe: how it trained, or why it cannot and what to change."""
    found: list[Finding] = []
    failing: dict[str, set[str]] = {}
    for outcome in preflight.outcomes:
        if not outcome.ok:
            failing.setdefault(outcome.knob, set()).add(outcome.value)
    for outcome in preflight.outcomes:
        label, topic = outcome.value, _TOPICS[outcome.knob]
        if outcome.ok:
            timing = f"trains, {outcome.reason}"
            if outcome.cached_at is not None:
                measured = time.strftime("%H:%M", time.localtime(outcome.cached_at))
                timing += f" (measured at {measured}, reused)"
            if outcome.knob == "compile_mode" and outcome.first_step_s is not None:
                timing += f"; first step (compiling) {outcome.first_step_s:.0f} s"
            found.append(Finding(level="ok", topic=topic, text=f"{label}: {timing}"))
            continue
        fix: str | None = None
        level: Level = "warning"
        if space is not None:
            # a value the sweep drops costs nothing while another of its knob trains; a knob
            # none of whose listed values trains leaves the sweep nothing to run
            listed = {str(v) for v in space.search.values(outcome.knob)}
            level = "problem" if listed and listed <= failing[outcome.knob] else "warning"
            if outcome.value in listed:
                fix = f"remove {outcome.value} from search.{outcome.knob} (the sweep skips it)"
            if level == "problem":
                fix = (
                    f"add a value of search.{outcome.knob} that trains here (none of "
                    f"{', '.join(sorted(listed))} does)"
                )
            if outcome.value == "flash_attention_2" and fix:
                fix += (
                    f", or install a flash-attn wheel built for torch {facts['torch']} and "
                    f"CUDA {facts['torch_cuda'] or '(none: it needs a CUDA GPU)'}"
                )
        found.append(
            Finding(
                level=level,
                topic=topic,
                text=f"{label}: cannot train here: {outcome.reason[:400]}",
                fix=fix,
            )
        )
    return found


def _known_config_findings(space: Space, preflight: PreflightReport) -> list[Finding]:
    found = []
    for where, known in space.named_known_configs():
        config, changed = preflight.nearest(known.as_config(space.search))
        if changed:
            found.append(
                Finding(
                    level="warning",
                    topic="baseline",
                    text=f"{where} runs here with {'; '.join(changed)}"[:400],
                    fix=None,
                )
            )
        reason = preflight.allows(config)
        if reason is not None:
            found.append(
                Finding(
                    level="problem",
                    topic="baseline",
                    text=f"{where} cannot run here: {reason[:300]}",
                    fix=f"change {where} to a value that trains here (the sweep would skip "
                    "it, with nothing to compare against)",
                )
            )
    return found


def _memory_findings(space: Space | None, facts: dict[str, Any]) -> list[Finding]:
    if facts["devices"]:
        device = facts["devices"][0]
        free, total, where = device["memory_free_bytes"], device["memory_bytes"], "GPU"
    else:
        cpu = facts["cpu"]
        free = cpu.get("memory_available_bytes") or cpu["memory_bytes"]
        total, where = cpu["memory_bytes"], "host"
    found = [
        Finding(
            level="ok",
            topic="memory",
            text=f"{where} memory: {free / _GIB:.1f} GiB free of {total / _GIB:.1f} GiB",
        )
    ]
    params = (facts.get("model") or {}).get("params")
    if space is None or params is None:
        if space is not None:
            found.append(
                Finding(
                    level="warning",
                    topic="memory",
                    text=f"the model's size is unknown: {facts['model'].get('error')}",
                )
            )
        return found
    needs, text = _training_state(space, facts["model"], cuda=bool(facts["devices"]))
    fix = "free the device, use a machine with more memory, or a smaller model"
    found.append(_fit("memory", text, min(needs.values()), free, f"{where} memory is free", fix))
    heavy = [q for q, need in needs.items() if need > free]
    if heavy and len(heavy) < len(needs):
        found.append(
            Finding(
                level="warning",
                topic="memory",
                text=f"quantization {', '.join(heavy)} needs more than the "
                f"{_size(free)} free: those trials will run out of memory",
                fix=f"remove {', '.join(heavy)} from search.quantization",
            )
        )
    return found


def _training_state(
    space: Space, model: dict[str, Any], cuda: bool
) -> tuple[dict[str, float], str]:
    """Bytes of training state before activations, per ``quantization`` value of the space,
    and the sentence that says so. Full training: 16 bytes per parameter. LoRA: the frozen
    base at its loaded width (unquantized without CUDA: bitsandbytes needs it), and 16 bytes
    per adapter parameter."""
    params, trainable = model["params"], model.get("trainable")
    full = f"model {param_count(params)} parameters: weights, gradients and AdamW state take "
    if space.workload.adapter is None or not trainable:
        missing = ""
        if space.workload.adapter is not None:
            missing = f"; the adapter could not be counted ({model.get('adapter_error')})"
        state = params * _TRAIN_BYTES_PER_PARAM
        text = f"{full}{_size(state)} before activations (an estimate: 16 bytes per parameter)"
        return {"none": state}, text + missing
    values = (space.search.values("quantization") if cuda else []) or ["none"]
    needs = {
        q: params * _FROZEN_BYTES_PER_PARAM[q] + trainable * _TRAIN_BYTES_PER_PARAM for q in values
    }
    widths = "; ".join(
        f"the base in {_FROZEN_WIDTH[q]} per parameter: {_size(needs[q])}" for q in values
    )
    text = (
        # counted as the sweep counts them (Recommendation.trainable_text): the adapter's
        # parameters among the adapted model's, not a share of the base's
        f"model {param_count(params)} parameters; with LoRA it trains "
        f"{param_count(trainable)} of {param_count(params + trainable)} "
        f"({trainable / (params + trainable):.2%}): the frozen base and the adapter's weights, "
        "gradients and "
        f"AdamW state take {_size(min(needs.values()))} before activations (an estimate: "
        f"{widths}; 16 bytes per adapter parameter)"
    )
    return needs, text


def _fit(topic: str, text: str, need: float, free: float, where: str, fix: str) -> Finding:
    """ok if ``need`` bytes fit in ``free``; else a problem saying how much is there."""
    if need <= free:
        return Finding(level="ok", topic=topic, text=text)
    return Finding(
        level="problem", topic=topic, text=f"{text}; only {_size(free)} {where}", fix=fix
    )


def _cpu_findings(space: Space | None, facts: dict[str, Any]) -> list[Finding]:
    cpu = facts["cpu"]
    usable = cpu["usable_cores"]
    found = [
        Finding(
            level="ok",
            topic="cpu",
            text=f"{usable:g} usable CPU cores ({cpu['logical_cores']} logical, "
            f"{cpu['capability']}); torch uses {cpu['torch_threads']} threads",
        )
    ]
    if space is not None and usable:
        most = max(space.search.num_workers)
        if most + 1 > usable:
            found.append(
                Finding(
                    level="warning",
                    topic="cpu",
                    text=f"search.num_workers goes up to {most}, but this machine has {usable:g} "
                    "usable cores for the workers and the training process together",
                    fix=f"keep num_workers at or below {max(0, int(usable) - 1)} here, or "
                    "measure on the machine the run will use",
                )
            )
    return found


def _disk_findings(
    space: Space | None, facts: dict[str, Any], disk: dict[str, Any]
) -> list[Finding]:
    where = disk["path"]
    if disk["error"] is not None:
        return [
            Finding(
                level="problem" if space is not None else "warning",
                topic="checkpoint",
                text=f"cannot write where checkpoints go ({where}): {disk['error']}",
                fix="set workload.checkpoint.dir (or SWEEPER_CACHE_DIR) to a writable directory "
                "on the disk the run saves to",
            )
        ]
    found = [
        Finding(
            level="ok",
            topic="checkpoint",
            text=f"{where}: wrote {disk['written_mb']} MiB at {disk['write_mb_per_s']:,.0f} MiB/s "
            f"(fsynced); {disk['free_bytes'] / _GIB:,.1f} GiB free",
        )
    ]
    model = facts.get("model") or {}
    params = model.get("params")
    spec = None if space is None else space.workload.checkpoint
    if spec is None or spec.save_steps is None or params is None or space is None:
        return found
    adapter = space.workload.adapter is not None and bool(model.get("trainable"))
    if adapter:  # a LoRA checkpoint holds the adapter (and its optimizer state) alone
        params = model["trainable"]
    size = params * (4 + (8 if spec.save_optimizer else 0))
    seconds = size / 2**20 / disk["write_mb_per_s"]
    text = (
        f"one checkpoint of this {'adapter' if adapter else 'model'} is about {_size(size)} "
        "(fp32 weights"
        + (" + AdamW state" if spec.save_optimizer else "")
        + f"): about {seconds:,.1f} s per save at this speed (an estimate; the sweep times a "
        "real save once per model state and disk, and its later trials reuse that figure, "
        "marked as reused)"
    )
    found.append(
        _fit(
            "checkpoint",
            text,
            size,
            disk["free_bytes"],
            "is free there",
            fix="point workload.checkpoint.dir at a disk with room for a checkpoint",
        )  # fmt: skip
    )
    return found
