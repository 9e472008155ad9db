"""Running one config: the ``TrialExecutor`` interface the search loop calls, and the
``ChildExecutor`` that runs each trial in a child process (forked from the workload server),
projects its run and records it in our tables. bench/search_replay.py's executor looks
configs up in a table instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import optuna

from sweeper import knobs
from sweeper.cost import RunPlan, RunProjection, money, project_run
from sweeper.errors import StorageError
from sweeper.launcher import ChildRun, ForkServer, run_child
from sweeper.measurement import Measurement, MeasurementError, parse_measurement
from sweeper.noise import Estimate, Sample, SampleKind, now_iso
from sweeper.preflight_script import program_fingerprint
from sweeper.space import Space, TrialConfig
from sweeper.store import Store, TrialRow
from sweeper.store.retry import connection_lost, disk_full
from sweeper.sweep import spool
from sweeper.sweep.devicepool import DevicePool, DevicePoolError, Held
from sweeper.sweep.observer import SweepObserver
from sweeper.sweep.outcome import Outcome
from sweeper.sweep.queue import LOST_RETRIES, PROGRAM, changed_failures, json_key, times_lost
from sweeper.trial.protocol import ChildRequest, ChildResult, PreparedData, tokens_per_sample


class TrialExecutor(Protocol):
    """Runs one config as Optuna trial ``trial`` and records it; ``sweeper launch`` runs a
    child process (``ChildExecutor``), bench/search_replay.py looks the config up in a table."""

    def execute(
        self, trial: optuna.Trial, config: TrialConfig, left_s: float | None
    ) -> Outcome: ...

    def record_predicted(self, trial: optuna.Trial, config: TrialConfig, message: str) -> None: ...

    def remeasure(
        self, number: int, config: TrialConfig, kind: SampleKind, left_s: float | None
    ) -> Sample | None:
        """Measure trial ``number``'s config again (no new trial); None if it failed."""
        ...

    def record_estimates(
        self, estimates: Mapping[int, tuple[Estimate, Sequence[Sample] | None]]
    ) -> None: ...

    def stop_requested(self) -> bool: ...

    def claim(self, number: int, config: TrialConfig) -> int | None:
        """Take ``config`` for trial ``number`` before running it; None when it is ours, else
        the trial (of any worker of the study) that took it first."""
        ...


class ChildExecutor:
    """Runs each trial in a child process (forked from the workload server) and records it
    in our tables."""

    def __init__(
        self,
        space: Space,
        store: Store,
        prepared: PreparedData,
        cache_dir: Path,
        observer: SweepObserver,
        server: ForkServer | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.space, self.store, self.worker_id = space, store, worker_id
        # the user's program as it is (engine: script): its failures are kept with it
        self.program = program_fingerprint(space.workload.script)
        self.in_flight: int | None = None  # the trial number being run and recorded, if any
        self.kept: Path | None = None  # where a record the database refused was kept
        self.kept_failure: str | None = None  # its failure kind, if the trial failed
        self.prepared, self.cache_dir, self.observer, self.server = (
            prepared, cache_dir, observer, server,
        )  # fmt: skip
        # the machine's devices this worker shares with its fleet (None: it owns what it sees)
        self.pool = DevicePool.from_env()

    def stop_requested(self) -> bool:
        return self.store.stop_requested(self.space.study)

    def earlier(self) -> dict[TrialConfig, Outcome]:
        """What the study's earlier trials gave (a resumed sweep)."""
        results = {}
        trials = self.store.list_trials(self.space.study, states=["complete", "failed", "pruned"])
        changed = changed_failures(self.store, self.space.study, self.program)
        for t in trials:
            if t.failure_kind == "lost" and times_lost(trials, t.config) <= LOST_RETRIES:
                continue  # its worker died: the config is tried once more
            if (
                t.failure_kind == "interrupted"
                and times_lost(trials, t.config, "interrupted") <= LOST_RETRIES
            ):
                continue  # stopped before it measured anything: tried once more
            if t.number in changed:
                continue  # the program that failed is not the one here now: tried again
            results[TrialConfig.model_validate(t.config)] = Outcome.of_row(t)
        return results

    def earlier_samples(self) -> dict[TrialConfig, list[Sample]]:
        """Each measurement of the study's earlier completed trials (a resumed sweep)."""
        samples: dict[TrialConfig, list[Sample]] = {}
        for t in self.store.list_trials(self.space.study, states=["complete"]):
            config = TrialConfig.model_validate(t.config)
            if t.remeasures:
                samples[config] = [Sample.from_json(s) for s in t.remeasures]
            elif t.cost_per_run_usd is not None and t.hours_per_run is not None:
                samples[config] = [
                    Sample(
                        kind="trial",
                        cost_per_run_usd=t.cost_per_run_usd,
                        hours_per_run=t.hours_per_run,
                        samples_per_s=t.samples_per_s,
                        tokens_per_s=t.tokens_per_s,
                        it_per_s=t.it_per_s,
                        ci95_rel=t.cost_ci95_rel,
                        contended=bool(t.contended),
                        peak_memory_bytes=t.peak_memory_bytes,
                    )
                ]
        return samples

    def claim(self, number: int, config: TrialConfig) -> int | None:
        key = hashlib.sha256(json_key(config.model_dump()).encode()).hexdigest()
        return self.store.claim(self.space.study, key, number, self.worker_id)

    def record_predicted(self, trial: optuna.Trial, config: TrialConfig, message: str) -> None:
        self.store.start_trial(self.space.study, trial.number, config.model_dump(), self.worker_id)
        self.store.finish_trial(
            self.space.study, trial.number, "pruned", failure_kind="oom", failure_message=message
        )

    def record_estimates(
        self, estimates: Mapping[int, tuple[Estimate, Sequence[Sample] | None]]
    ) -> None:
        self.store.record_estimates(self.space.study, estimates)

    def execute(self, trial: optuna.Trial, config: TrialConfig, left_s: float | None) -> Outcome:
        row, sample = self._run_one(trial, config, left_s)
        if row.state == "complete" and row.cost_per_run_usd is not None and sample is not None:
            return Outcome(
                number=row.number,
                cost=row.cost_per_run_usd,
                spread=row.cost_ci95_rel or 0.0,
                sample=sample,
            )
        return Outcome(
            number=row.number,
            failure_kind=row.failure_kind or "error",
            message=row.failure_message,
        )

    def remeasure(
        self, number: int, config: TrialConfig, kind: SampleKind, left_s: float | None
    ) -> Sample | None:
        # no trial row runs meanwhile: the worker's row says what the machine is doing
        if self.worker_id is not None:
            self.store.set_remeasuring(self.worker_id, number)
        try:
            measured = self._measure(config, left_s)
        finally:
            if self.worker_id is not None:
                self.store.set_remeasuring(self.worker_id, None)
        if measured.measurement is None or measured.projection is None:
            reason = measured.invalid or measured.run.result.failure_message or "no message"
            self.observer.note(
                f"#{number} could not be measured again ({kind}): "
                f"{measured.run.result.failure_kind or 'error'}: {reason}"
            )
            return None
        sample = measured.sample(kind)
        if not math.isfinite(sample.cost_per_run_usd):
            self.observer.note(f"#{number} measured again ({kind}): no usable throughput")
            return None
        self.observer.note(
            f"#{number} measured again ({_KIND_WORDS[kind]}): {sample.samples_per_s or 0:,.1f} "
            f"samples/s, {money(sample.cost_per_run_usd)}/run"
            + (f" (contended: {sample.contention})" if sample.contended else "")
        )
        return sample

    def _measure(self, config: TrialConfig, left_s: float | None) -> _Measured:
        """Run ``config`` in a child and project its run; no trial is recorded."""
        space = self.space
        request = ChildRequest.for_space(
            "trial", space, self.cache_dir, prepared=self.prepared, config=config,
            settings=space.trial, varied=_varied(space),
        )  # fmt: skip
        timeout_s = space.trial.timeout_s
        if left_s is not None and left_s < timeout_s:
            timeout_s = max(30.0, left_s)
        held: Held | None = None
        try:
            with contextlib.ExitStack() as stack:
                env = None
                if self.pool is not None:
                    held = stack.enter_context(self.pool.hold(config.devices))
                    env = {"CUDA_VISIBLE_DEVICES": held.visible}
                run = run_child(request, timeout_s=timeout_s, server=self.server, env=env)
                if held is not None:  # before the devices are given back, not after
                    held = dataclasses.replace(held, until=time.time())
        except (DevicePoolError, OSError) as e:
            # no device for it, or its directory could not be made or written (a full or
            # read-only temporary directory): a failed trial, recorded, not a crashed worker
            kind = "unsupported" if isinstance(e, DevicePoolError) else "error"
            message = str(e) if kind == "unsupported" else f"the trial could not start: {e!r}"
            run = ChildRun(
                result=ChildResult(status="failed", failure_kind=kind, failure_message=message),
                wall_s=0.0,
                log_tail="",
                pid=0,
            )
        result = run.result
        measurement, invalid = measurement_of(result.payload if result.status == "ok" else None)
        if measurement is None:
            return _Measured(run, timeout_s, None, invalid, None, held)
        measurement = measurement.with_inherited_startup(run.inherited_startup_s)
        projection = project_run(
            run_plan(space, self.prepared.stats, config.devices),
            samples_per_s=measurement.samples_per_s,
            it_per_s=measurement.it_per_s,
            tokens_per_s=measurement.tokens_per_s,
            packing=config.packing,
            startup_s=measurement.startup_s,
            compile_s=measurement.compile_s,
            checkpoint_save_s=measurement.checkpoint_save_s,
        )
        return _Measured(run, timeout_s, measurement, None, projection, held)

    def _run_one(
        self, trial: optuna.Trial, config: TrialConfig, left_s: float | None = None
    ) -> tuple[TrialRow, Sample | None]:
        space, store, observer = self.space, self.store, self.observer
        self.in_flight = trial.number
        store.start_trial(space.study, trial.number, config.model_dump(), self.worker_id)
        observer.trial_started(trial.number, config)
        try:
            measured = self._measure(config, left_s)
        except KeyboardInterrupt:
            with interrupt_held():
                _record_failure(
                    store, trial, space.study, "interrupted", "the sweep was stopped by the user"
                )
                trial.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        run, measurement, projection = measured.run, measured.measurement, measured.projection
        if measured.held is not None:  # which of the pool's devices it ran on, and when
            held = measured.held
            trial.set_user_attr("device_ids", list(held.devices))
            trial.set_user_attr("device_hold", [held.since, held.until, held.waited_s])
            observer.note(f"#{trial.number} ran on CUDA_VISIBLE_DEVICES={held.visible}")
        sample = None
        if measurement is not None and projection is not None:
            if math.isfinite(projection.cost_per_run_usd):
                sample = measured.sample("trial")
            attrs: dict[str, Any] = {
                **measurement.optuna_attrs(),
                "hours_per_run": projection.hours_per_run,
                "effective_batch": measurement.effective_batch,  # as it ran (a script's own)
            }
            if measurement.contended:
                attrs["contention"] = measurement.contention
            fields: dict[str, Any] = {
                "wall_s": run.wall_s,
                "hours_per_run": projection.hours_per_run,
                "cost_per_run_usd": projection.cost_per_run_usd,
                "projection": projection.breakdown() | measurement.one_off_sources(),
                "measurement": measurement.model_dump(),
                # a script's own values of knobs it owns, beside the config asked (the key)
                "own_values": measurement.own_values,
                "cost_ci95_rel": None if sample is None else sample.ci95_rel,
                "contended": measurement.contended,
                **measurement.columns(),
            }
            with self._kept_if_refused(trial.number, fields, projection.cost_per_run_usd, attrs):
                for key, value in attrs.items():
                    trial.set_user_attr(key, value)
                row = store.finish_trial(space.study, trial.number, "complete", **fields)
        elif measured.invalid is not None:
            # a child of another version, or an engine's typo: this trial fails, the sweep goes on
            row = self._failed(
                trial,
                "error",
                measured.invalid,
                wall_s=run.wall_s,
                details={"payload": run.result.payload, "log_tail": run.log_tail},
            )
        else:
            result = run.result
            kind, message = result.failure_kind or "error", result.failure_message or "no message"
            if result.failure_kind == "timeout" and measured.timeout_s < space.trial.timeout_s:
                # the budget, not the config, ended it: a timeout would read as the config's
                kind = "interrupted"
                message = (
                    f"the sweep's time budget ran out {measured.timeout_s:.0f} s into this trial "
                    f"(trial.timeout_s is {space.trial.timeout_s:.0f} s): it says nothing about "
                    "the config, and the study's next launch runs it again"
                )
            row = self._failed(
                trial,
                kind,
                message,
                wall_s=run.wall_s,
                details={"traceback": result.traceback, "log_tail": run.log_tail},
            )
        observer.trial_done(row)
        self.in_flight = None
        return row, sample

    def _failed(
        self,
        trial: optuna.Trial,
        kind: str,
        message: str,
        *,
        wall_s: float,
        details: dict[str, Any],
    ) -> TrialRow:
        """Record a trial that ran and failed: a failure is data (it cost the same minutes),
        kept like a measurement when the database refuses it."""
        if self.program is not None:
            details = {**details, PROGRAM: self.program}
        fields = failure_fields(kind, message, wall_s=wall_s, details=details)
        with self._kept_if_refused(trial.number, fields, None, failure_attrs(kind, message)):
            return _record_failure(
                self.store, trial, self.space.study, kind, message, wall_s=wall_s, details=details
            )

    @contextlib.contextmanager
    def _kept_if_refused(
        self, number: int, fields: dict[str, Any], value: float | None, attrs: dict[str, Any]
    ) -> Iterator[None]:
        """When the database cannot take trial ``number``'s record (away past the retry
        window, or its disk full), keep the record on this disk for the study's next launch or
        worker to write (``sweeper.sweep.spool``), then let the error stop the sweep."""
        try:
            yield
        except Exception as e:
            if not (isinstance(e, StorageError) or connection_lost(e) or disk_full(e)):
                raise
            try:
                self.kept = spool.keep(
                    self.cache_dir, self.space.study, number, fields, value, attrs
                )
                self.kept_failure = fields.get("failure_kind")
            except (OSError, ValueError, TypeError) as kept_error:  # the first error stands
                self.observer.note(f"#{number}'s record could not be kept: {kept_error}")
            raise


_KIND_WORDS = {
    "trial": "first measurement",
    "rerun": "the machine was shared",
    "final": "to separate the best",
    "drift": "drift reference",
}


@dataclass(frozen=True)
class _Measured:
    """One child run of a config: its measurement and projection, or why there is none."""

    run: ChildRun
    timeout_s: float
    measurement: Measurement | None
    invalid: str | None  # the payload was not a Measurement
    projection: RunProjection | None
    held: Held | None = None  # the pool's devices it ran on (a fleet's worker)

    def sample(self, kind: SampleKind) -> Sample:
        m, p = self.measurement, self.projection
        assert m is not None and p is not None
        ci = m.throughput_ci95_rel
        return Sample(
            kind=kind,
            cost_per_run_usd=p.cost_per_run_usd,
            hours_per_run=p.hours_per_run,
            samples_per_s=m.samples_per_s,
            tokens_per_s=m.tokens_per_s,
            it_per_s=m.it_per_s,
            ci95_rel=ci if math.isfinite(ci) else None,
            contended=m.contended,
            contention=m.contention,
            peak_memory_bytes=m.peak_memory_bytes,
            at=now_iso(),
        )


def _record_failure(
    store: Store,
    trial: optuna.Trial,
    study_name: str,
    kind: str,
    message: str,
    *,
    wall_s: float | None = None,
    details: dict[str, Any] | None = None,
) -> TrialRow:
    for key, value in failure_attrs(kind, message).items():
        trial.set_user_attr(key, value)
    row = store.finish_trial(
        study_name,
        trial.number,
        "failed",
        **failure_fields(kind, message, wall_s=wall_s, details=details),
    )
    if kind == "interrupted":  # nothing was measured: the config may run again
        store.release_claim(study_name, trial.number)
    return row


@contextlib.contextmanager
def interrupt_held() -> Iterator[None]:
    """While a stop is being recorded, a second SIGINT or SIGTERM waits (and is dropped: the
    sweep is stopping already). A Ctrl-C in a terminal reaches `launch --workers` and each of
    its workers, and the launcher passes it on: the second one used to end the recording
    half-way, a claim kept and Optuna's trial left RUNNING (a user walk)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM)
    before = {sig: signal.signal(sig, lambda *_: None) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in before.items():  # (None: one set outside Python; default)
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def failure_attrs(kind: str, message: str) -> dict[str, Any]:
    """A failed trial's user attributes in Optuna."""
    return {"failure_kind": kind, "failure_message": message[:2000]}


def failure_fields(
    kind: str, message: str, *, wall_s: float | None, details: dict[str, Any] | None
) -> dict[str, Any]:
    """A failed trial's columns in our store (``Store.finish_trial``'s fields)."""
    return {
        "wall_s": wall_s,
        "failure_kind": kind,
        "failure_message": message,
        "measurement": details,
    }


def measurement_of(payload: dict[str, Any] | None) -> tuple[Measurement | None, str | None]:
    """A finished child's payload as a Measurement, or why it is not one (None, None: the
    child failed and said why itself)."""
    if payload is None:
        return None, None
    try:
        return parse_measurement(payload), None
    except MeasurementError as e:
        return None, str(e)


def run_plan(space: Space, dataset_stats: dict[str, Any] | None, devices: int = 1) -> RunPlan:
    """The real job of ``space`` on ``devices`` devices, as the cost model needs it
    (``hardware.usd_per_hour`` is one device's price)."""
    return RunPlan(
        samples=space.workload.samples,
        epochs=space.workload.epochs,
        usd_per_hour=space.hardware.usd_per_hour,
        devices=devices,
        save_steps=space.workload.checkpoint.save_steps,
        tokens_per_sample=tokens_per_sample(dataset_stats),
    )


def _varied(space: Space) -> tuple[str, ...]:
    """The knobs the space lists with more than one value."""
    return tuple(
        knob.name
        for knob in knobs.KNOBS
        if isinstance(values := getattr(space.search, knob.name, None), list) and len(values) > 1
    )
