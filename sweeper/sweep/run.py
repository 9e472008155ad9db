"""``run_sweep``: one worker's share of a sweep, from preparing the workload to the last
re-measure; what it ran comes back as a ``SweepReport``."""

from __future__ import annotations

import contextlib
import functools
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sweeper.errors import DatabaseLostError, DiskFullError, SpaceError, StudyNotFoundError
from sweeper.joining import process_alive
from sweeper.launcher import ForkServer
from sweeper.preflight import PreflightError, PreflightReport
from sweeper.preflight_script import program_fingerprint
from sweeper.search import worker_seed
from sweeper.settings import Settings
from sweeper.space import Space, TrialConfig
from sweeper.store import Store, StudyRow, redact
from sweeper.store.diagnose import disk_full_message
from sweeper.store.optuna import create_or_load_study, optuna_storage, stored_choices
from sweeper.store.retry import connection_lost, disk_full
from sweeper.sweep import settler, spool
from sweeper.sweep.clock import SweepClock
from sweeper.sweep.executor import ChildExecutor, interrupt_held
from sweeper.sweep.loop import SearchLoop
from sweeper.sweep.observer import SilentObserver, SweepObserver
from sweeper.sweep.prepare import preflight, prepare_workload, resolve_lengths, workload_server
from sweeper.sweep.queue import enqueue_changed, enqueue_interrupted, enqueue_known
from sweeper.sweep.share import StudyShare, plan_reached
from sweeper.sweep.stopping import device_hours_limit
from sweeper.sweep.worker import Worker

# How long a sweep waits out a lost database (Settings.database_retry_s, 120 s) before it
# stops: the running trial's measurement is written if the database is back within it.
STARTUP_RETRY_S = 10.0  # the same, for the first connection of a sweep


def _kept_words(
    study: str,
    in_flight: int | None,
    kept: Path | None,
    resume: str = "Resume",
    failure: str | None = None,
) -> str:
    if kept is not None and failure is not None:
        trial = (
            f"trial #{in_flight} had failed ({failure}): its record is kept in {kept} and "
            "written when the study resumes"
        )
    elif kept is not None:
        trial = (
            f"trial #{in_flight} had finished: its measurement is kept in {kept} and written "
            "when the study resumes"
        )
    elif in_flight is not None:
        trial = (
            f"trial #{in_flight} was running: it is marked lost and its config queued again "
            "as soon as a worker of the study meets the database"
        )
    else:
        trial = "no trial was running"
    return (
        f"{trial}. Finished trials are kept. {resume}: `sweeper worker --study {study}` (or "
        "`sweeper launch` of the same space)"
    )


def database_lost_message(
    study: str,
    storage_url: str,
    waited_s: float,
    in_flight: int | None,
    kept: Path | None,
    failure: str | None = None,
) -> str:
    """What a sweep that lost its database says, in one paragraph: what, and how to resume."""
    return (
        f"the database {redact(storage_url)} did not answer for {waited_s:g} s "
        f"(SWEEPER_DATABASE_RETRY_S), so this sweep stopped; "
        + _kept_words(study, in_flight, kept, resume="Resume when it answers", failure=failure)
    )


# Which configs the recommendation may pick, given the study row as prepared (its dataset
# statistics): the caller decides (``sweeper.recommend.recommendable``); only those are
# measured again at the end.
EligibleFor = Callable[[StudyRow], Callable[[TrialConfig], bool]]


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    study: str
    storage_url: str
    trials_run: int
    completed: int
    failed: int
    wall_s: float
    predicted_oom: int = 0  # configs not run: as heavy as one that ran out of memory
    # proposals of a config measured already: told its result, no trial run (their trial
    # numbers have no row)
    repeats: int = 0
    stop_reason: str = ""  # why the sweep ended
    remeasured: int = 0  # measurements of configs measured before (sweeper.noise)
    device_s: float = 0.0  # the device time this worker used (N devices: N × the seconds)
    # with a device-time budget: the study's limit, and what its run's workers used together
    device_limit_s: float | None = None
    study_device_s: float | None = None
    workers: int = 1  # workers of the run that shared the budget
    worker_id: str = ""  # this worker's (its trials' worker_id): the exit status counts them
    stopped: bool = False  # a stop was requested (REST): the user ended it, not the trials
    # it stopped on a defect of the user's program (it ignores a knob): exit non-zero
    program_defect: bool = False


def _forget_refused(
    error: Exception, fresh: bool, store: Store, storage: Any, name: str, grace_s: float
) -> None:
    """Delete the study this launch made when preflight refused it (``error``) before any
    trial (a walk's script without sweeper's line left a failed study behind, with nothing in
    it): unless a trial or another worker of it appeared meanwhile."""
    from sweeper.store.optuna import delete_optuna_study

    if not fresh or not isinstance(error, PreflightError):
        return
    if store.count_trials(name) or store.live_workers(name, grace_s):
        return
    delete_optuna_study(storage, name)
    store.delete_study(name)


def study_fields(
    space: Space, *, n_trials: int, space_text: str, space_path: str | None
) -> dict[str, Any]:
    """The study row's fields that come from the space (``Store.upsert_study`` keywords)."""
    return {
        "hardware_name": space.hardware.name,
        "usd_per_hour": space.hardware.usd_per_hour,
        "device": space.hardware.device,
        "samples": space.workload.samples,
        "epochs": space.workload.epochs,
        "n_trials_planned": n_trials,
        "space_yaml": space_text,
        "space_path": space_path,
        "baseline": None
        if space.baseline is None
        else space.baseline.as_config(space.search).model_dump(),
        "workload_hash": space.workload_hash(),
    }


def trials_done(store: Store, study: str) -> int:
    """Trials of ``study`` that count against its plan: finished, but not lost or interrupted
    (their configs run again). 0 for a study the storage does not hold."""
    try:
        trials = store.list_trials(study, states=["complete", "failed", "pruned"])
    except StudyNotFoundError:
        return 0
    return sum(t.failure_kind not in ("lost", "interrupted") for t in trials)


def live_plan(store: Store, study: str, grace_s: float) -> int | None:
    """The trials ``study`` plans, if it has a live worker; None: no live run to join. A
    worker of this host counts only while its process exists (a worker killed a moment ago
    still beats within the grace period; launching again after it adds trials, as before)."""
    try:
        row = store.get_study(study)
        live = store.live_workers(study, grace_s)
    except StudyNotFoundError:
        return None
    host = socket.gethostname()
    if not [w for w in live if w.host != host or process_alive(w.pid)]:
        return None
    return row.n_trials_planned


def study_lists(store: Store, storage: Any, study: str) -> dict[str, tuple[Any, ...]]:
    """The lists ``study``'s trials were asked with: Optuna's, for the knobs it searched, and
    the one-value lists of the space the study was last launched with (Optuna keeps none for
    those). {}: a study not recorded yet."""
    from sweeper.seqlen import AUTO
    from sweeper.space import parse_space

    lists = stored_choices(storage, study)
    try:
        launched = parse_space(store.get_study(study).space_yaml)
    except (StudyNotFoundError, SpaceError):
        return lists
    for name in launched.search.model_fields_set & set(TrialConfig.model_fields):
        if getattr(launched.search, name) != AUTO and len(launched.search.values(name)) == 1:
            lists.setdefault(name, tuple(launched.search.values(name)))
    return lists


def _same_lists(space: Space, stored: dict[str, tuple[Any, ...]], path: str | None) -> None:
    """Refuse, before anything is written, a space whose lists differ from those the study's
    trials were asked with, naming each (Optuna keeps one list per knob for a study: the
    launch would fail at its first proposal, after preparing and preflight, with a trial left
    running). A one-value list is a list of the study too: a walk widened max_seq_length
    [512] to [256, 512] unrefused, and its next launch was then refused against [256, 512].
    A knob the study never listed may be added, and one it listed left out (it runs at its
    default); a length ``auto`` has not read off the data yet is checked once it has."""
    from sweeper.seqlen import AUTO

    search = space.search
    listed = (search.model_fields_set & set(TrialConfig.model_fields)) | set(search.searched())
    changed = [
        f"{name} {list(stored[name])} (now {values})"
        for name in stored
        if name in listed
        and getattr(search, name) != AUTO
        and tuple(values := search.values(name)) != stored[name]
    ]
    if not changed:
        return
    where = path or "the space"
    raise SpaceError(
        f"{where}: study {space.study!r} was searched with other lists: "
        f"{'; '.join(changed)}. A study keeps the lists its trials were asked with, one value "
        f"or several (Optuna's rule). To search the new lists, give the space a new study name "
        f"(study: {space.study}-2 in {where}); to resume this study, put those lists back as "
        "they were"
    )


def _enqueue_retries(store: Store, study: Any, space: Space, observer: SweepObserver) -> None:
    """What runs again first: interrupted trials' configs, and those that failed in the
    user's program when it has changed since (said)."""
    enqueue_interrupted(store, study, space)
    again = enqueue_changed(store, study, space, program_fingerprint(space.workload.script))
    if again:
        observer.note(
            f"your program changed since {', '.join(f'#{n}' for n in again)} failed in it: "
            f"{'its config runs' if len(again) == 1 else 'their configs run'} again first"
        )


def _retry_waiting(study: Any) -> bool:
    """A preempted or lost trial's config is queued to run once more (``study``: Optuna's)."""
    from optuna.trial import TrialState

    return bool(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))


def _settle_once(
    loop: SearchLoop, executor: ChildExecutor, clock: SweepClock, grace_s: float
) -> None:
    """The end re-measure: once for the study's run, by its last worker to finish searching,
    over every worker's trials (``sweeper.sweep.settler``); the others say who does it."""
    store, study = executor.store, executor.space.study
    assert executor.worker_id is not None, "a sweep's executor records as its worker"
    other = settler.leaves_it(store, study, executor.worker_id, grace_s)
    if other is not None:
        executor.observer.note(other)
        return
    loop.remeasure.take_in(executor.earlier(), executor.earlier_samples())
    loop.settle(clock)


_DEFAULTS = Settings.model_fields


def run_sweep(
    space: Space,
    *,
    storage_url: str,
    cache_dir: Path,
    space_text: str,
    space_path: str | None = None,
    n_trials: int | None = None,
    max_minutes: float | None = None,
    observer: SweepObserver | None = None,
    worker: str | None = None,
    eligible_for: EligibleFor | None = None,
    heartbeat_s: float = _DEFAULTS["heartbeat_s"].default,
    worker_grace_s: float = _DEFAULTS["worker_grace_s"].default,
    database_retry_s: float = _DEFAULTS["database_retry_s"].default,
    fleet_trials: int | None = None,
) -> SweepReport:
    """Run ``n_trials`` measured trials (default: the space's budget) and record them; with
    ``max_minutes`` (default: the tightest of the space's ``budget`` limits), start no trial
    that the time left cannot hold. Preparation and preflight count against that time. ``worker``:
    which of the study's workers this is (each samples with its own seed; by default the first
    live worker is "0" and the others are named by their worker id). ``heartbeat_s``,
    ``worker_grace_s`` and ``database_retry_s``: ``Settings``' (the caller reads them).

    A database away for longer than ``database_retry_s`` ends the sweep with
    ``DatabaseLostError``; its worker is left for the reaper (see ``Worker.abandon``)."""
    observer = observer or SilentObserver()
    asked, n_trials = n_trials, n_trials or space.budget.n_trials
    # budget.max_usd / max_device_hours in device time: a trial on N devices spends N
    device_hours = device_hours_limit(space.budget, space.hardware.usd_per_hour)
    # the study's, all its workers' together (sweeper.sweep.share); --max-minutes replaces
    # the wall-clock limit only: a limit in dollars holds whatever the deadline
    device_limit_s = None if device_hours is None else 3600 * device_hours
    max_minutes = max_minutes or space.budget.minutes(space.hardware.usd_per_hour)
    deadline = None if max_minutes is None else time.monotonic() + 60 * max_minutes
    started = time.perf_counter()
    # a database out of reach at the start is more often a wrong URL or a server not started
    # than a restart: said after a short wait, not after the 2 minutes a sweep rides out
    store = Store(storage_url, retry_s=min(STARTUP_RETRY_S, database_retry_s))
    store.migrate()
    store.retry_s = database_retry_s
    # the fork server first (its imports are done once: the preparation, the probes and the
    # trials are forked from it), stopped whatever ends the sweep
    servers = contextlib.ExitStack()
    try:
        storage = optuna_storage(storage_url, retry_s=database_retry_s)
        # a changed list is refused before the data is prepared (12-15 s in a walk) and
        # before anything is written; an auto length once the data has given it
        lists = study_lists(store, storage, space.study)
        _same_lists(space, lists, space_path)
        zygote = servers.enter_context(ForkServer(str(cache_dir)))
        # the data first: bad data leaves no study behind, and max_seq_length: auto is read off it
        prepared = prepare_workload(space, cache_dir, observer, server=zygote)
        space = resolve_lengths(space, prepared.stats, observer)
        _same_lists(space, lists, space_path)
        # a study this launch makes, and preflight then refuses, is not left behind
        fresh = not store.has_study(space.study)
        study = create_or_load_study(space.study, storage, space.budget.seed)
        # a resumed study plans what it has and what this launch adds (16 after two launches of 8);
        # a worker of a fleet, what the whole fleet adds (``fleet_trials``), not its own share; a
        # worker joining a live run without a count of its own, the run's plan (shared, not added)
        joined = None
        if asked is None and fleet_trials is None:
            joined = live_plan(store, space.study, worker_grace_s)
        done_before = 0
        if joined is not None:
            planned = n_trials = joined
        else:
            done_before = trials_done(store, space.study)
            planned = done_before + (fleet_trials or n_trials)
        store.upsert_study(
            space.study,
            state="running",
            **study_fields(space, n_trials=planned, space_text=space_text, space_path=space_path),
        )
        for number, what in spool.replay(store, storage, space.study, cache_dir):  # before reaping
            observer.note(f"#{number}: wrote the {what} kept while the database was away")
        enqueue_known(study, space)
        _enqueue_retries(store, study, space, observer)
        member = Worker(store, storage, study, space, heartbeat_s, worker_grace_s)
        member.start()
        clock = SweepClock(store, space.study, member.id, since=started)  # preparation counts
        member.clock = clock
        shared = None
        if device_limit_s is not None:
            shared = StudyShare(store, space.study, clock, device_limit_s)
        worker = worker or member.seed_name()
        executor: ChildExecutor | None = None
        try:
            store.upsert_study(space.study, dataset_stats=prepared.stats)
            with workload_server(space, prepared, cache_dir, observer.note, zygote) as server:
                report = PreflightReport()
                if space.trial.preflight:
                    report = preflight(space, prepared, cache_dir, observer, server)
                    fields: dict[str, Any] = {"preflight": report.to_json()}
                    if space.baseline is not None:  # what the baseline runs here (tf32 on a CPU)
                        fields["baseline"] = report.nearest(space.baseline.as_config(space.search))[
                            0
                        ].model_dump()
                    store.upsert_study(space.study, **fields)
                executor = ChildExecutor(
                    space, store, prepared, cache_dir, observer, server, worker_id=member.id
                )
                eligible = (
                    None if eligible_for is None else eligible_for(store.get_study(space.study))
                )
                loop = SearchLoop(
                    space, study, executor, report, observer,
                    earlier=executor.earlier(), earlier_samples=executor.earlier_samples(),
                    seed=worker_seed(space.budget.seed, worker), eligible=eligible,
                    worker_id=member.id,
                )  # fmt: skip
                # a space of 3 configs under n_trials 12 plans 3: "of 12 planned" and a
                # progress of 3/12 read as a sweep cut short
                # one launch only: a fleet's workers start and finish trials meanwhile, so the
                # trials done before this one's preflight are not those its plan was made of
                left = sum(c not in loop.results for c in loop.runnable)
                if joined is None and fleet_trials is None and left < n_trials:
                    planned = done_before + left
                    store.upsert_study(space.study, n_trials_planned=planned)
                    observer.planned(left)
                    observer.note(
                        f"the space holds {left} config{'' if left == 1 else 's'} not yet "
                        f"measured here: {left} trial{'' if left == 1 else 's'}, not "
                        f"{n_trials}"
                    )
                # a worker that joined a live run stops at the run's plan; so does a worker of
                # a fleet (``launch --workers``), its share a cap: a worker that joined the
                # launch's run takes part of the plan, not trials on top of it
                plan = None
                if joined is not None or fleet_trials is not None:
                    plan = functools.partial(
                        plan_reached, store, space.study, planned, member.id,
                        retry_waiting=functools.partial(_retry_waiting, study),
                        fleet=joined is None,
                    )  # fmt: skip
                counts = loop.run(n_trials, clock, deadline, shared=shared, plan=plan)
                if not loop.stopped:
                    _settle_once(loop, executor, clock, worker_grace_s)
        except KeyboardInterrupt:
            with interrupt_held():
                member.stop("interrupted")
            raise
        except Exception as e:
            full = disk_full(e)
            if not (full or connection_lost(e)):
                member.stop("failed")
                _forget_refused(e, fresh, store, storage, space.study, worker_grace_s)
                raise
            member.abandon()  # no word to a database that cannot take it: the reaper ends us
            in_flight = None if executor is None else executor.in_flight
            kept = None if executor is None else executor.kept
            failure = None if executor is None else executor.kept_failure
            if full:
                said = disk_full_message(storage_url, e)
                kept_words = _kept_words(space.study, in_flight, kept, failure=failure)
                raise DiskFullError(f"{said}; {kept_words}") from e
            raise DatabaseLostError(
                database_lost_message(
                    space.study, storage_url, database_retry_s, in_flight, kept, failure
                )
            ) from e
        except BaseException:
            member.stop("failed")
            raise
        finally:
            clock.charge()
            storage.engine.dispose()
        member.stop("stopped" if loop.stopped else "finished")
        use = None if shared is None else shared.use()
        store.dispose()
        return SweepReport(
            study=space.study,
            storage_url=storage_url,
            trials_run=counts["run"],
            completed=counts["complete"],
            failed=counts["failed"],
            wall_s=time.perf_counter() - started,
            predicted_oom=counts["predicted"],
            repeats=counts["repeats"],
            stop_reason=loop.stop_reason,
            remeasured=loop.remeasure.remeasured,
            device_s=clock.charged_device_s,
            device_limit_s=device_limit_s,
            study_device_s=None if use is None else use.used_s,
            workers=1 if use is None else len(use.workers),
            worker_id=member.id,
            stopped=loop.stopped,
            program_defect=loop.stopping.program_defect,
        )
    finally:
        servers.close()
