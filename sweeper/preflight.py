"""Preflight: before any trial spends budget, learn what can run on this device.

Each attention implementation, each compile mode and each precision is probed in its own child
(a one-layer model of the workload, a few steps); a sweep leaves the autotuning compile modes to
their trials when another compile mode compiles here. What fails is dropped from the sweep with its
reason. A precision that trains pathologically slowly (bf16 autocast on a CPU without AMX:
~10x slower than fp32) is dropped too when the space searches several; when it is the only one,
it stops the sweep with the fix. It is timed step against step with fp32 and refused only when
it is beyond the limit by every figure of that timing, the fastest steps' and the medians'
(``sweeper.preflight_precision``); slower by some figures only (a shared machine), it is said, not
refused, and a timing taken on a shared machine is not kept in the probe cache. Knob values
that need what the machine lacks (TF32 or a fused optimizer without CUDA, 8-bit AdamW without
bitsandbytes, Liger without Triton and CUDA, fp8 below compute capability 8.9 or without
torchao, reduce-overhead's CUDA graphs on a CPU; ``sweeper.knobs``) are dropped with the
reason, unprobed; where that leaves a knob nothing, its fallback runs (tf32=false) and the
report says so.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sweeper import knobs
from sweeper.errors import SweeperError
from sweeper.knobs import AttnImplementation, CompileMode, Precision
from sweeper.launcher import ForkServer, run_child
from sweeper.preflight_precision import PrecisionJudgement, precision_judgement, precision_slowdown
from sweeper.preflight_script import (
    absent_inputs,
    reads_training_arguments,
    script_imports,
    script_parses,
    script_problems,
    script_python,
)
from sweeper.space import Space, TrialConfig
from sweeper.trial.protocol import ChildRequest, ChildResult, PreparedData, ProbeSpec

# Compile modes that autotune kernels: minutes of compiling on a GPU. A sweep leaves them to
# their trials where another inductor mode compiles; ``sweeper doctor`` probes them too.
AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")
# Knobs preflight probes by training, as TrialConfig field names.
PROBED_KNOBS = ("attn_implementation", "compile_mode", "precision")
# Knobs whose values need something of the machine (CUDA, bitsandbytes).
MACHINE_KNOBS = tuple(k.name for k in knobs.KNOBS if k.needs)


class PreflightError(SweeperError):
    """Nothing of a knob can run here, or the precision is pathologically slow."""


@dataclass(frozen=True, kw_only=True)
class ProbeOutcome:
    knob: str
    value: str
    ok: bool
    reason: str  # the failure kind and message, or the timing
    step_s: float | None = None
    first_step_s: float | None = None  # includes torch.compile's compilation
    fp32_step_s: float | None = None  # set on the probe that judged the precision
    wall_s: float = 0.0
    cached_at: float | None = None  # time.time() of the measurement, if it was reused


@dataclass(frozen=True, kw_only=True)
class PreflightReport:
    outcomes: tuple[ProbeOutcome, ...] = ()
    dropped: dict[str, dict[str, str]] = field(default_factory=dict)  # knob → value → reason
    # the workload precision's step time over fp32's (None: fp32, or no probe could train)
    precision_factor: float | None = None
    # what stops a sweep, each with its fix (only with collect=True; otherwise raised)
    problems: tuple[str, ...] = ()
    # knob → the value trials run instead, where the machine can run none of the listed ones
    fallbacks: dict[str, Any] = field(default_factory=dict)
    # what the probe child found the machine has (None) or lacks (why), by capability
    capabilities: dict[str, str | None] = field(default_factory=dict)
    # each precision found slower than trial.slow_precision_factor: refused, or (slower by
    # some figures of its timing, not all) only said; with where it came from and its fix
    precision_judgements: tuple[PrecisionJudgement, ...] = ()
    # what the checks of a script's program said that stops nothing (an import inside a
    # function, a flag its parser may not read): doctor shows them with its findings
    script_notes: tuple[str, ...] = ()

    def allows(self, config: TrialConfig) -> str | None:
        """None if every knob value of ``config`` passed; otherwise why it cannot run."""
        for knob, values in self.dropped.items():
            if knob in self.fallbacks:
                continue  # trials run the fallback instead (``adapt``)
            value = str(getattr(config, knob))
            if value in values:
                return f"{knob}={value} failed preflight: {values[value]}"
        return None

    def adapt(self, config: TrialConfig) -> TrialConfig:
        """``config`` with each knob that cannot run here set to its fallback."""
        if not self.fallbacks:
            return config
        # validated again: a knob that stops applying (data_parallel on one device) is None
        return TrialConfig.model_validate(config.model_dump() | self.fallbacks)

    def nearest(self, config: TrialConfig) -> tuple[TrialConfig, list[str]]:
        """A named config (the baseline, also_try) as near as this machine runs it: each value
        preflight dropped becomes its knob's fallback where it has one (pinned memory on a CPU
        runs unpinned), so the user's own config is still measured; knobs with no runnable
        value at all take their fallback as in ``adapt``. Returns what changed beyond that."""
        config = self.adapt(config)
        update: dict[str, Any] = {}
        changed: list[str] = []
        for name, values in self.dropped.items():
            knob = knobs.KNOB.get(name)
            value = getattr(config, name, None)
            if knob is None or knob.fallback is None or value == knob.fallback:
                continue
            if str(value) in values:
                update[name] = knob.fallback
                changed.append(f"{name}={knob.fallback} for {value} ({values[str(value)]})")
        if not update:
            return config, []
        return TrialConfig.model_validate(config.model_dump() | update), changed

    def search(self, space: Space) -> Any:
        """The space's search with fallen-back knobs narrowed to their fallback."""
        return space.search.narrowed({k: [v] for k, v in self.fallbacks.items()})

    def to_json(self) -> dict[str, Any]:
        return {
            "dropped": self.dropped,
            "fallbacks": self.fallbacks,
            "capabilities": self.capabilities,
            "probes": [outcome.__dict__ for outcome in self.outcomes],
            "precision_factor": self.precision_factor,
            "precision_judgements": [j.__dict__ for j in self.precision_judgements],
            "problems": list(self.problems),
        }


# Probe results are kept this long: `sweeper doctor --space` followed by `sweeper launch` (or a
# resumed sweep) on the same machine and software does not pay for the same probes twice.
PROBE_CACHE_TTL_S = 6 * 3600
# failures that say what the machine is, not what happened to it this time
_STABLE_FAILURES = ("unsupported",)


def machine_fingerprint() -> dict[str, Any]:
    """What a probe's result depends on besides its request, read without importing torch: the
    host and its boot (a swapped GPU means a reboot), the interpreter, the visible devices and
    the versions of the packages that decide what can run."""
    packages: dict[str, str | None] = {}
    for name in (
        "torch",
        "transformers",
        "triton",
        "flash-attn",
        "accelerate",
        "kernels",
        "trl",
        "bitsandbytes",
        "liger-kernel",
        "torchao",
    ):
        try:
            packages[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            packages[name] = None
    boot = driver = None
    with contextlib.suppress(OSError):
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    with contextlib.suppress(OSError):
        driver = Path("/proc/driver/nvidia/version").read_text().strip()
    return {
        "host": socket.gethostname(),
        "boot": boot,
        "driver": driver,
        "python": sys.executable,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "packages": packages,
    }


class ProbeCache:
    """Probe results on disk (``CACHE_DIR/probes``), keyed by the probe request and the machine
    fingerprint; an entry older than ``ttl_s`` is ignored."""

    def __init__(self, cache_dir: Path, ttl_s: float = PROBE_CACHE_TTL_S) -> None:
        self.folder = cache_dir / "probes"
        self.ttl_s = ttl_s
        self.fingerprint = machine_fingerprint()

    def key(self, request: ChildRequest) -> str:
        data = request.model_dump(mode="json", exclude={"spawned_at", "cache_dir"})
        text = json.dumps({"request": data, "machine": self.fingerprint}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def get(self, request: ChildRequest) -> tuple[ChildResult, float] | None:
        """The cached result and when it was measured (time.time()), or None."""
        path = self.folder / f"{self.key(request)}.json"
        try:
            measured_at = path.stat().st_mtime
            if time.time() - measured_at > self.ttl_s:
                return None
            return ChildResult.model_validate_json(path.read_text()), measured_at
        except (OSError, ValueError):
            return None

    def put(self, request: ChildRequest, result: ChildResult) -> None:
        if result.status != "ok" and result.failure_kind not in _STABLE_FAILURES:
            return  # an OOM or a timeout may not happen again
        if (result.payload or {}).get("precision_contended"):
            # a precision timed while the machine was shared: the next preflight measures it
            # again rather than repeat for hours what the load may have made of it
            return
        with contextlib.suppress(OSError):
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / f"{self.key(request)}.json"
            partial = path.with_suffix(".partial")
            partial.write_text(result.model_copy(update={"traceback": None}).model_dump_json())
            partial.replace(path)


def short_run_of(space: Space) -> tuple[str, bool] | None:
    """A script space's command's own run against what a trial measures, at the space's
    largest step (the fewest steps): ``sweeper.script_defaults.short_run``."""
    from sweeper.script_defaults import flags_of, said, short_run

    script, search = space.workload.script, space.search
    if script is None:
        return None
    if not {"max_steps", "num_train_epochs"} & set(flags_of(script.command)) and not (
        reads_training_arguments(script)
    ):
        return None  # its own parser's length (--epochs 1?): not TrainingArguments' 3 epochs
    # a knob the space does not list runs at the command's value (TrainingArguments' default
    # when the command is silent: batch 8, no accumulation, one device)
    own = said(script.command, script.knobs)
    rows = 1
    for knob, default in (
        ("per_device_batch_size", 8), ("gradient_accumulation_steps", 1), ("devices", 1)
    ):  # fmt: skip
        values = search.values(knob) or [own.get(knob, (default, ""))[0]]
        rows *= max(int(v) for v in values)
    trial = space.trial
    return short_run(
        script.command, script.knobs, space.workload.samples, rows, trial.warmup, trial.measure
    )


def run_preflight(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    note: Callable[[str], None] = lambda _message: None,
    server: ForkServer | None = None,
    *,
    collect: bool = False,
    probe_cache: ProbeCache | None = None,
) -> PreflightReport:
    """Probe the space on this device. A sweep (``collect=False``) stops at the first thing
    that rules it out, with PreflightError; ``sweeper doctor`` (``collect=True``) runs every
    probe and returns the problems in the report. With ``probe_cache``, a probe measured on
    this machine and software within its time to live is reused, not run again."""
    run = _PreflightRun(space, prepared, cache_dir, note, server, collect, probe_cache)
    if not run.script_runs():
        return run.report()
    working_attn = run.attention()
    if working_attn is None:
        return run.report()
    run.precisions(working_attn)
    run.compile_modes(working_attn)
    run.engine_and_adapter()
    run.machine_knobs()
    run.note_reused()
    return run.report()


def _other_python(space: Space) -> str | None:
    """The script's python, when the space runs a script in a python other than this one."""
    if space.workload.engine != "script" or space.workload.script is None:
        return None
    python = script_python(space.workload.script)
    # not resolved: a venv's python is a link to its base interpreter, shared by every venv
    if python is None or os.path.abspath(python) == os.path.abspath(sys.executable):
        return None
    return python


class _PreflightRun:
    """One preflight: its probes in order (attention, precision, compile mode, then what the
    machine lacks), what each dropped, and the problems that rule the space out."""

    def __init__(
        self,
        space: Space,
        prepared: PreparedData,
        cache_dir: Path,
        note: Callable[[str], None],
        server: ForkServer | None,
        collect: bool,
        probe_cache: ProbeCache | None,
    ) -> None:
        self.space, self.prepared, self.cache_dir, self.note = space, prepared, cache_dir, note
        self.server, self.collect, self.probe_cache = server, collect, probe_cache
        self.search = space.search
        self.problems: list[str] = []
        self.outcomes: list[ProbeOutcome] = []
        self.dropped: dict[str, dict[str, str]] = {}
        self.fallbacks: dict[str, Any] = {}
        self.precision_list: list[Precision] = self.search.values("precision")
        # attention kernels are probed in the precision the sweep mostly runs (flash attention
        # needs bf16/fp16), and the first probe also times fp32 to judge that precision
        # (not fp8, which needs what the first probe learns the machine has)
        self.main_precision: Precision = next(
            (p for p in self.precision_list if p not in ("fp32", "fp8")), "fp32"
        )
        self.precision_factor: float | None = None
        self.precision_judgements: list[PrecisionJudgement] = []
        self.capabilities: dict[str, str | None] = {}
        self.script_notes: list[str] = []
        self.device_count: int | None = None  # CUDA devices the probe saw (None: the CPU)
        # whether the probe child imports deepspeed (seconds each): only for a ZeRO stage listed
        self.check_deepspeed = any(
            v in knobs.ZERO_STAGES for v in self.search.values("data_parallel")
        )
        # a user's script runs in its own python: its torch and kernels are what the trials
        # get, so the probes run there (without the fork server, which is sweeper's python)
        self.python = _other_python(space)
        if self.python is not None:
            note(f"preflight probes in the script's python, {self.python}")

    def problem(self, message: str) -> None:
        if not self.collect:
            raise PreflightError(message)
        self.problems.append(message)

    def drop(self, knob: str, value: str, reason: str) -> None:
        self.dropped.setdefault(knob, {})[value] = reason
        self.note(f"preflight drops {knob}={value}: {reason}")

    def probe(self, knob: str, value: str, spec: ProbeSpec) -> tuple[ProbeOutcome, dict[str, Any]]:
        request = ChildRequest.for_space(
            "probe", self.space, self.cache_dir, prepared=self.prepared, probe=spec
        )
        cache = None if self.python is not None else self.probe_cache  # keyed by this python
        cached = None if cache is None else cache.get(request)
        if cached is not None and spec.compare_fp32 and not _timed_in_turns(cached[0]):
            cached = None  # timed one precision after the other (an older sweeper): again
        if cached is not None:
            result, cached_at = cached
            outcome, payload = _outcome(knob, value, result, wall_s=0.0)
            outcome = replace(outcome, cached_at=cached_at)
        else:
            run = run_child(
                request,
                timeout_s=self.space.trial.timeout_s,
                server=self.server,
                python=self.python,
            )
            if cache is not None:
                cache.put(request, run.result)
            outcome, payload = _outcome(knob, value, run.result, wall_s=run.wall_s)
        self.outcomes.append(outcome)
        return outcome, payload

    def judge_precision(
        self, precision: str, payload: dict[str, Any], outcome: ProbeOutcome
    ) -> None:
        judgement = precision_judgement(
            self.space,
            precision,
            payload,
            measured_at=outcome.cached_at,
            cache_folder=None if self.probe_cache is None else self.probe_cache.folder,
        )
        if judgement is None:
            return
        self.precision_judgements.append(judgement)
        if not judgement.refused:
            self.note(f"preflight: {judgement.message}")
        elif len(self.precision_list) == 1:
            self.problem(judgement.message)
        else:
            self.drop("precision", precision, judgement.message)

    def script_runs(self) -> bool:
        """A script space's program is there, names sweeper's line and has a python that
        imports sweeper: checked before any probe, which runs in that python (one without
        torch, say the system's when the venv is not active, failed every attention probe
        with "No module named 'torch'" instead of saying which python it was)."""
        if self.space.workload.script is None:
            return True
        for problem in script_problems(self.space.workload.script):
            self.problem(problem)
        short = short_run_of(self.space)
        # every trial would end unmeasured (one that may not: a note, prepare.resolve_lengths)
        if short is not None and short[1]:
            self.problem(short[0])
        return not self.problems

    def attention(self) -> AttnImplementation | None:
        """Probe each attention implementation; the first that trains, if any."""
        working_attn: AttnImplementation | None = None
        for index, attn in enumerate(self.search.attn_implementation):
            compare = index == 0 or working_attn is None
            outcome, payload = self.probe(
                "attn_implementation",
                attn,
                ProbeSpec(
                    attn_implementation=attn,
                    compile_mode="none",
                    precision=self.main_precision,
                    compare_fp32=compare and self.main_precision != "fp32",
                    steps=10 if compare else 4,  # a ratio of two timings needs more steps
                    deepspeed=self.check_deepspeed,  # these probes say what the machine has
                ),
            )
            if not outcome.ok:
                self.drop("attn_implementation", attn, outcome.reason)
                continue
            if working_attn is None:
                working_attn = attn
                self.capabilities = payload.get("capabilities") or {}
                self.device_count = payload.get("device_count")
                self.precision_factor = precision_slowdown(payload)
                self.judge_precision(self.main_precision, payload, outcome)
        if working_attn is None:
            self.problem(
                "no attention implementation in search.attn_implementation can train here: "
                + "; ".join(f"{o.value}: {o.reason}" for o in self.outcomes)
            )
        return working_attn

    def lacks(self, knob: str, value: Any) -> bool:
        """The value needs what this machine lacks: ``machine_knobs`` drops it, unprobed."""
        need = knobs.KNOB[knob].needs.get(value)
        return need is not None and self.capabilities.get(need, "not checked") is not None

    def precisions(self, working_attn: AttnImplementation) -> None:
        for precision in self.precision_list:
            if precision in (self.main_precision, "fp32") or self.lacks("precision", precision):
                continue  # fp32 always trains; the main precision was judged above
            outcome, payload = self.probe(
                "precision",
                precision,
                ProbeSpec(
                    attn_implementation=working_attn,
                    compile_mode="none",
                    precision=precision,
                    compare_fp32=True,
                    steps=10,
                ),
            )
            if not outcome.ok:
                self.drop("precision", precision, outcome.reason)
                continue
            self.judge_precision(precision, payload, outcome)
        if len(self.dropped.get("precision", {})) == len(self.precision_list):
            self.problem(
                "no precision in search.precision trains well here; add fp32 to the list: "
                + "; ".join(f"{p}: {r}" for p, r in self.dropped["precision"].items())
            )

    def _probe_mode(
        self, working_attn: AttnImplementation, mode: CompileMode, listed: bool = True
    ) -> bool:
        outcome, _ = self.probe(
            "compile_mode",
            mode,
            ProbeSpec(
                attn_implementation=working_attn, compile_mode=mode, precision=self.main_precision
            ),
        )
        if not outcome.ok and listed:
            self.drop("compile_mode", mode, outcome.reason)
        return outcome.ok

    def compile_modes(self, working_attn: AttnImplementation) -> None:
        modes = [
            m for m in self.search.compile_mode if m != "none" and not self.lacks("compile_mode", m)
        ]
        autotuned = [m for m in modes if m in AUTOTUNE_MODES]
        compiled = [
            m for m in modes if m not in AUTOTUNE_MODES and self._probe_mode(working_attn, m)
        ]
        if autotuned and not self.collect:
            # A sweep does not autotune ahead: on a fresh H100 the max-autotune probe of one
            # layer took 345 s of a budget. Where another inductor mode compiles, the autotuned
            # ones are left to their trials, which record their compile time (and a failure,
            # as data).
            if (
                not compiled
                and "default" not in modes
                and self._probe_mode(working_attn, "default", listed=False)
            ):
                compiled = ["default"]
            if compiled:
                self.note(
                    f"preflight does not compile {', '.join(autotuned)} ahead (autotuning takes "
                    f"minutes on a GPU); compile_mode {compiled[0]} compiles here, so each "
                    f"{autotuned[0]} trial pays for its own compile, recorded as its compile time"
                )
                autotuned = []
        for mode in autotuned:
            self._probe_mode(working_attn, mode)
        if len(self.dropped.get("compile_mode", {})) == len(self.search.compile_mode):
            self.problem(
                "no compile mode in search.compile_mode works here; add 'none' to the list: "
                + "; ".join(f"{m}: {r}" for m, r in self.dropped["compile_mode"].items())
            )

    def engine_and_adapter(self) -> None:
        engine = self.space.workload.engine
        missing = self.capabilities.get(f"engine:{engine}")
        if missing is not None:
            self.problem(f"workload.engine: {engine} cannot run here: {missing}")
        if self.space.workload.script is not None and not self.problems:
            problems, notes = script_imports(self.space.workload.script)
            if not problems and self.collect:
                # doctor: the parse as a trial runs it (a sweep's trials say it themselves,
                # and the sweep stops after three alike failures)
                problems, more = script_parses(self.space, self.cache_dir)
                notes += more
            absent = absent_inputs(self.space.workload.script)
            if self.collect:
                # doctor says the space cannot run as written (a walk's missing --dataset_path:
                # doctor said "can run here", then every trial failed at the program's load);
                # a sweep says it and runs, its trials failing alike stop it
                problems += absent
            else:
                notes += absent
            for problem in problems:
                self.problem(problem)
            for note in notes:
                self.script_notes.append(note)
                self.note(note)
        adapter = self.space.workload.adapter
        missing = None if adapter is None else self.capabilities.get(f"adapter:{adapter.kind}")
        if missing is not None:
            assert adapter is not None
            self.problem(
                f"workload.adapter: {adapter.kind} needs peft, not installed here: {missing}"
            )

    def machine_knobs(self) -> None:
        search = self.search
        machine = knobs.machine_drops(
            {k: search.values(k) for k in MACHINE_KNOBS}, self.capabilities
        )
        for knob, reasons in [*self.multi_device_drops().items(), *self.flag_drops().items()]:
            for value, why in reasons.items():
                machine.setdefault(knob, {}).setdefault(value, why)
        for knob, values in machine.items():
            self.dropped.setdefault(knob, {}).update(values)
            for value, reason in values.items():
                self.note(f"preflight drops {knob}={value}: {reason}")
            # every listed value dropped, by its probe or for what the machine lacks
            if len(self.dropped[knob]) == len(search.values(knob)):
                self.fallbacks[knob] = knobs.KNOB[knob].fallback
                self.note(
                    f"preflight: no value of search.{knob} can run here; trials run "
                    f"{knob}={self.fallbacks[knob]!r} instead"
                )

    def multi_device_drops(self) -> dict[str, dict[str, str]]:
        """devices values this machine or engine cannot run, and data-parallel strategies no
        engine runs yet (knob → value → reason)."""
        dropped: dict[str, dict[str, str]] = {}
        engine = self.space.workload.engine
        for count in self.search.values("devices"):
            if count == 1:
                continue
            if engine not in knobs.MULTI_DEVICE_ENGINES:
                dropped.setdefault("devices", {})[str(count)] = (
                    f"the {engine} engine trains on one device so far (several: engine "
                    f"{' or '.join(knobs.MULTI_DEVICE_ENGINES)})"
                )
            elif engine == "script" and (problem := _script_devices(self.space, count)):
                dropped.setdefault("devices", {})[str(count)] = problem
            elif self.device_count is not None and count > self.device_count:
                dropped.setdefault("devices", {})[str(count)] = (
                    f"needs {count} CUDA devices; this machine has {self.device_count}"
                )
        for strategy in self.search.values("data_parallel"):
            # where deepspeed does not import, machine_drops says so (the knob's needs)
            if strategy in knobs.ZERO_STAGES and engine not in knobs.ZERO_ENGINES:
                dropped.setdefault("data_parallel", {})[strategy] = (
                    f"sweeper measures DeepSpeed ZeRO through the Trainer (engine "
                    f"{' or '.join(knobs.ZERO_ENGINES)}); the {engine} engine does not run it"
                )
        return dropped

    def flag_drops(self) -> dict[str, dict[str, str]]:
        """Values a script's knobs form cannot say as flags (``knobs.flag_problems``: sft_flags
        has no flag for SFTConfig's max_length=None, which padding_free needs), or its
        accelerate line as launch options (``accelerate_line.options``: ZeRO, a compile mode
        that is no ``--dynamo_mode``)."""
        from sweeper.trial import accelerate_line

        script = self.space.workload.script
        if script is None:
            return {}
        dropped: dict[str, dict[str, str]] = {}
        launched = accelerate_line.OWNED if accelerate_line.is_line(script.command) else ()
        for name in knobs.NAMES:
            for value in self.search.values(name):
                # the knob alone, active: what it asks of SFTConfig whatever else the trial says
                config = {"packing": False, name: value}
                for problem in knobs.flag_problems(config, script.knobs):
                    dropped.setdefault(name, {})[str(value)] = problem
                try:
                    accelerate_line.options(config if name in launched else {})
                except ValueError as e:
                    dropped.setdefault(name, {})[str(value)] = str(e)
        return dropped

    def note_reused(self) -> None:
        reused = [o for o in self.outcomes if o.cached_at is not None]
        if reused and self.probe_cache is not None:
            oldest = min(o.cached_at for o in reused if o.cached_at is not None)
            since = time.strftime("%H:%M", time.localtime(oldest))
            self.note(
                f"preflight reused {len(reused)} of {len(self.outcomes)} probe results measured "
                f"on this machine with the same software since {since}"
                f" (they are kept {self.probe_cache.ttl_s / 3600:g} h in {self.probe_cache.folder})"
            )

    def report(self) -> PreflightReport:
        return PreflightReport(
            outcomes=tuple(self.outcomes),
            dropped=self.dropped,
            precision_factor=self.precision_factor,
            problems=tuple(self.problems),
            fallbacks=self.fallbacks,
            capabilities=self.capabilities,
            precision_judgements=tuple(self.precision_judgements),
            script_notes=tuple(self.script_notes),
        )


def _payload(result: ChildResult) -> dict[str, Any]:
    return result.payload if result.status == "ok" and result.payload is not None else {}


def _timed_in_turns(result: ChildResult) -> bool:
    """Whether a probe that compared a precision with fp32 timed their steps in turns (a probe
    that failed compared nothing: its failure is what is kept)."""
    payload = _payload(result)
    return not payload or "precision_step_times" in payload


def _outcome(
    knob: str, value: str, result: ChildResult, *, wall_s: float
) -> tuple[ProbeOutcome, dict[str, Any]]:
    if result.status == "ok" and result.payload is not None:
        step_s = result.payload["step_s"]
        outcome = ProbeOutcome(
            knob=knob,
            value=value,
            ok=True,
            reason=f"{step_s * 1000:.0f} ms/step",
            step_s=step_s,
            first_step_s=result.payload.get("first_step_s"),
            fp32_step_s=result.payload.get("fp32_step_s"),
            wall_s=wall_s,
        )
        return outcome, result.payload
    reason = f"{result.failure_kind}: {result.failure_message}"
    return ProbeOutcome(knob=knob, value=value, ok=False, reason=reason, wall_s=wall_s), {}


def _script_devices(space: Space, count: int) -> str | None:
    """Why the space's script cannot run on ``count`` devices (an accelerate launch line)."""
    from sweeper.trial.script import devices_problem

    script = space.workload.script
    return None if script is None else devices_problem(script.command, count)
