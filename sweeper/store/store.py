"""The one door to our tables: engine, schema migration, one session scope, and queries.

Foreign database errors become ``StorageError`` here, with the URL's password hidden.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import (
    ColumnElement,
    Engine,
    Select,
    delete,
    false,
    func,
    make_url,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import ArgumentError, IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, defer, sessionmaker

from sweeper.errors import ConflictError, DiskFullError, StorageError, StudyNotFoundError
from sweeper.measurement import SORT_KEYS
from sweeper.noise import Estimate, Sample, pooled_run
from sweeper.store.diagnose import (
    database_error_message,
    database_fix,
    disk_full_message,
    no_tables,
)
from sweeper.store.engine import MIGRATION_LOCK_ID, make_engine, schema_lock
from sweeper.store.models import ClaimRow, StudyRow, TrialMetrics, TrialRow, WorkerRow
from sweeper.store.retry import disk_full, retried

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Any 64-bit constant: serialises concurrent schema upgrades of one Postgres database.
# What Store.trial_metrics loads of each trial (the fields of TrialMetrics, in its order).
METRIC_COLUMNS = tuple(getattr(TrialRow, name) for name in TrialMetrics.__annotations__)
# Columns trials can be sorted by (REST ?sort=, the dashboard's table headers): the metrics
# with a better direction (sweeper.measurement), the number and the wall time.
TRIAL_SORT_KEYS = ("number", *SORT_KEYS, "wall_s")


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(moment: datetime) -> datetime:
    """An aware UTC datetime: SQLite hands back naive ones (stored as UTC), Postgres aware."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def redact(url: str) -> str:
    """The URL with its password hidden, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # shown as typed, but for anything between "user:" and "@"
        return re.sub(r"(://[^:/@]*):[^@]*@", r"\1:***@", url)


def finite_or_none(value: float | None) -> float | None:
    """NaN and inf are not measurements: store them as NULL (the raw JSON keeps a note)."""
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def json_safe(value: Any) -> Any:
    """Replace non-finite floats by None, recursively, so JSON columns stay valid JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


@dataclass(frozen=True)
class TrialMarks:
    """What the study page marks beside the table (``Store.trial_marks``)."""

    running: list[int]
    contended: list[int]  # complete, every measurement taken on a shared machine
    skipped: list[int]  # numbers Optuna gave that have no row (a repeated proposal)
    highest: int  # -1: no trial


class Store:
    """Our tables in one database (SQLite file or Postgres), created on first use."""

    def __init__(self, url: str, *, retry_s: float = 0.0) -> None:
        """``retry_s``: how long a call that lost its connection is tried again (a sweep
        rides out a database restart; the API answers 503 at once instead)."""
        self.url = url
        self.retry_s = retry_s
        try:
            self.engine: Engine = make_engine(url)
        except (ArgumentError, ImportError, SQLAlchemyError) as e:
            raise StorageError(
                f"invalid storage URL {redact(url)!r}: {e}. Use sqlite:///path/to/file.db or "
                "postgresql+psycopg://user@host:5432/dbname"
            ) from e
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One unit of work: commits on success, rolls back on any error."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except SQLAlchemyError as e:
            session.rollback()
            if disk_full(e):
                raise DiskFullError(disk_full_message(self.url, e)) from e
            if no_tables(e):
                raise StorageError(
                    f"{redact(self.url)} holds no sweeper study (it has no sweeper tables): "
                    "check --storage (or SWEEPER_STORAGE), or create a study there with "
                    "`sweeper launch --space FILE --storage URL`"
                ) from e
            raise StorageError(database_error_message(self.url, e)) from e
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def migrate(self) -> None:
        """Bring our tables to the newest schema (safe to call from several workers)."""
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        try:
            # Postgres: the transaction's advisory lock below; SQLite: the file lock
            sqlite = self.engine.dialect.name == "sqlite"
            with (
                schema_lock(self.url) if sqlite else nullcontext(),
                self.engine.begin() as connection,
            ):
                if connection.dialect.name == "postgresql":
                    connection.execute(
                        text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID}
                    )
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
        except SQLAlchemyError as e:
            said = str(getattr(e, "orig", None) or e).strip()
            # psycopg's own text often ends asking whether the server is running: end it once
            said = said if said.endswith((".", "?", "!")) else f"{said}."
            check = (
                "Check the URL (user, host, port, database)."
                if "server running" in said
                else "Check that the server is running and the URL (user, host, port, "
                "database) is right."
            )
            check = database_fix(self.url, said) or check
            raise StorageError(
                f"cannot reach or migrate the database at {redact(self.url)}: {said} {check}"
            ) from e

    def dispose(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------------ studies

    def upsert_study(self, name: str, **fields: Any) -> StudyRow:
        """Create the study row, or update it when a sweep is resumed. Two workers of one
        ``launch --workers`` (or two machines) that create the same new study at once: the
        one whose insert loses to the other's updates the row the other made (the unique
        name decides; under load a worker of the CI's `launch --workers 2` test failed with
        the database's duplicate key error, and its launch with it)."""
        for attempt in range(2):
            try:
                with self.session() as s:
                    row = s.scalar(select(StudyRow).where(StudyRow.name == name))
                    now = utcnow()
                    if row is None:
                        row = StudyRow(name=name, created_at=now, updated_at=now, **fields)
                        s.add(row)
                    else:
                        for key, value in fields.items():
                            setattr(row, key, value)
                        row.updated_at = now
                    s.flush()
                    return row
            except StorageError as e:
                if attempt or not isinstance(e.__cause__, IntegrityError):
                    raise
        raise AssertionError("unreachable")  # (the second attempt returns or raises)

    def set_study_state(self, name: str, state: str) -> None:
        with self.session() as s:
            row = self._study(s, name)
            row.state = state
            row.updated_at = utcnow()

    def request_stop(self, name: str) -> bool:
        """Ask a running sweep to stop after its running trial; False if it is not running.

        One conditional UPDATE, so two requests (or a sweep finishing meanwhile) cannot race.
        """
        with self.session() as s:
            study_id = self._study(s, name).id
            result = s.execute(
                update(StudyRow)
                .where(StudyRow.id == study_id, StudyRow.state == "running")
                .values(state="stopping", updated_at=utcnow())
            )
            return bool(result.rowcount)  # type: ignore[attr-defined]  # an UPDATE's CursorResult

    def stop_requested(self, name: str) -> bool:
        with self.session() as s:
            return self._study(s, name).state == "stopping"

    def add_sweep_seconds(
        self,
        name: str,
        seconds: float,
        worker_id: str | None = None,
        device_seconds: float = 0.0,
    ) -> None:
        """Count device time the sweep spent (trials, preparation, probes: wall × devices
        held) against the study, what the sweep cost, and ``device_seconds`` against
        ``worker_id``, in one transaction: the workers share the study's budget by these."""
        with self.session() as s:
            row = self._study(s, name)
            row.sweep_seconds = (row.sweep_seconds or 0.0) + max(0.0, seconds)
            if worker_id is not None:
                _charge(s, worker_id, device_seconds)

    def add_worker_seconds(self, worker_id: str, device_seconds: float) -> None:
        """Count device time against a worker alone (its heartbeat's charge: the study row,
        whose changes the API's caches follow, is written after each trial)."""
        with self.session() as s:
            _charge(s, worker_id, device_seconds)

    def study_rows(self) -> list[StudyRow]:
        """Every study, oldest first."""
        with self.session() as s:
            query = select(StudyRow).order_by(StudyRow.created_at, StudyRow.id)
            return list(s.scalars(query).all())

    def version(self, name: str) -> tuple[Any, ...]:
        """A cheap fingerprint of a study and its trials: it changes whenever a trial starts or
        finishes or the study row changes (state, sweep time), so derived results (the
        recommendation, the charts) can be cached until it does. One aggregate query."""
        with self.session() as s:
            row = self._study(s, name)
            counts = s.execute(
                select(
                    func.count(TrialRow.id),
                    func.max(TrialRow.id),
                    func.count(TrialRow.finished_at),
                    func.max(TrialRow.finished_at),
                ).where(TrialRow.study_id == row.id)
            ).one()
            return (row.id, row.updated_at, row.state, row.sweep_seconds, *counts)

    def get_study(self, name: str) -> StudyRow:
        with self.session() as s:
            return self._study(s, name)

    def list_studies(self, grace_s: float | None = None) -> list[tuple[StudyRow, dict[str, Any]]]:
        """Every study with trial counts per state, its best $/run, when it last changed and
        the trials its live workers (a beat within ``grace_s``, if given) measure again now."""
        with self.session() as s:
            studies = s.scalars(select(StudyRow).order_by(StudyRow.created_at)).all()
            counts = s.execute(
                select(TrialRow.study_id, TrialRow.state, func.count()).group_by(
                    TrialRow.study_id, TrialRow.state
                )
            ).all()
            best = dict(
                s.execute(
                    select(TrialRow.study_id, func.min(TrialRow.cost_per_run_usd))
                    .where(TrialRow.state == "complete")
                    .group_by(TrialRow.study_id)
                ).all()
            )
            # A sweep writes its study row at its start and end; its trials start and finish
            # in between, and that is when the study was last updated for a reader.
            latest = {
                sid: [t for t in times if t is not None]
                for sid, *times in s.execute(
                    select(
                        TrialRow.study_id,
                        func.max(TrialRow.started_at),
                        func.max(TrialRow.finished_at),
                    ).group_by(TrialRow.study_id)
                ).all()
            }
            live = [WorkerRow.state == "alive", WorkerRow.remeasuring.is_not(None)]
            if grace_s is not None:
                live.append(WorkerRow.heartbeat_at >= utcnow() - timedelta(seconds=grace_s))
            remeasuring = s.execute(
                select(WorkerRow.study_id, WorkerRow.remeasuring)
                .where(*live)
                .order_by(WorkerRow.remeasuring)
            ).all()
        summaries = []
        for study in studies:
            per_state = {state: n for sid, state, n in counts if sid == study.id}
            updated = max([study.updated_at, *latest.get(study.id, [])], key=as_utc)
            summaries.append(
                (
                    study,
                    {
                        "trials": per_state,
                        "best_cost_per_run_usd": best.get(study.id),
                        "updated_at": updated,
                        "remeasuring": [n for sid, n in remeasuring if sid == study.id],
                    },
                )
            )
        return summaries

    def delete_study(self, name: str) -> None:
        with self.session() as s:
            s.delete(self._study(s, name))

    def has_study(self, name: str) -> bool:
        with self.session() as s:
            return s.scalar(select(StudyRow.id).where(StudyRow.name == name)) is not None

    @property
    def redacted_url(self) -> str:
        return redact(self.url)

    def export_rows(self, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The study row and its trials (in number order), every column but the database ids,
        read in one transaction so a sweep writing meanwhile cannot tear the snapshot."""
        with self.session() as s:
            study = self._study(s, name)
            trials = s.scalars(
                select(TrialRow).where(TrialRow.study_id == study.id).order_by(TrialRow.number)
            ).all()
            return _columns_of(study), [_columns_of(t) for t in trials]

    def import_rows(self, study: dict[str, Any], trials: Sequence[dict[str, Any]]) -> None:
        """Insert a study row and its trials in one transaction: all of it, or nothing."""
        with self.session() as s:
            if s.scalar(select(StudyRow.id).where(StudyRow.name == study["name"])) is not None:
                raise ConflictError(f"a study named {study['name']!r} already exists")
            row = StudyRow(**study)
            s.add(row)
            s.flush()
            s.add_all(TrialRow(study_id=row.id, **trial) for trial in trials)

    @staticmethod
    def _study(s: Session, name: str) -> StudyRow:
        row = s.scalar(select(StudyRow).where(StudyRow.name == name))
        if row is None:
            names = sorted(s.scalars(select(StudyRow.name)).all())
            held = (
                "it holds no study"
                if not names
                else f"its studies: {', '.join(names[:20])}"
                + (f" and {len(names) - 20} more" if len(names) > 20 else "")
            )
            near = difflib.get_close_matches(name, names, n=1)
            maybe = f"; did you mean {near[0]!r}?" if near else ""
            raise StudyNotFoundError(f"no study named {name!r} in this storage ({held}){maybe}")
        return row

    def claim(
        self, study: str, config_key: str, number: int, worker_id: str | None = None
    ) -> int | None:
        """Take ``config_key`` for trial ``number`` of ``worker_id``: None if it is ours now
        (or already was), else the number of the trial that took it first. That number can
        be ``number`` itself: on SQLite two workers can pop the same queued Optuna trial."""
        try:
            with self.session() as s:
                study_id = self._study(s, study).id
                s.add(
                    ClaimRow(
                        study_id=study_id, config_key=config_key, trial_number=number,
                        worker_id=worker_id,
                    )
                )  # fmt: skip
            return None
        except StorageError as e:
            if not isinstance(e.__cause__, IntegrityError):
                raise
        with self.session() as s:
            owner = s.scalar(
                select(ClaimRow).where(
                    ClaimRow.study_id == self._study(s, study).id,
                    ClaimRow.config_key == config_key,
                )
            )
            if owner is None or (owner.trial_number, owner.worker_id) == (number, worker_id):
                return None
            return owner.trial_number

    def release_claim(self, study: str, number: int) -> None:
        """Let the config of trial ``number`` run again: the trial was interrupted before it
        measured anything."""
        with self.session() as s:
            s.execute(
                delete(ClaimRow).where(
                    ClaimRow.study_id == self._study(s, study).id, ClaimRow.trial_number == number
                )
            )

    # ------------------------------------------------------------------ trials

    # ------------------------------------------------------------------ workers

    def register_worker(
        self, study: str, worker_id: str, host: str, pid: int, devices: str | None = None
    ) -> None:
        """A sweep process starts working on ``study``; it is alive while it beats."""
        now = utcnow()
        with self.session() as s:
            s.add(
                WorkerRow(
                    id=worker_id, study_id=self._study(s, study).id, host=host, pid=pid,
                    devices=devices, state="alive", started_at=now, heartbeat_at=now,
                )
            )  # fmt: skip

    def beat(self, worker_id: str) -> None:
        with self.session() as s:
            _update_worker(s, worker_id, WorkerRow.state == "alive", heartbeat_at=utcnow())

    def end_worker(self, worker_id: str) -> None:
        with self.session() as s:
            _update_worker(s, worker_id, state="done", finished_at=utcnow(), remeasuring=None)

    def set_remeasuring(self, worker_id: str, number: int | None) -> None:
        """``worker_id`` is measuring trial ``number`` again (None: it has finished)."""
        with self.session() as s:
            _update_worker(s, worker_id, remeasuring=number)

    def list_workers(self, study: str) -> list[tuple[WorkerRow, int]]:
        """Every worker the study ever had, oldest first, with the number of trials it ran."""
        with self.session() as s:
            study_id = self._study(s, study).id
            ran = (
                select(TrialRow.worker_id, func.count().label("n"))
                .where(TrialRow.study_id == study_id)
                .group_by(TrialRow.worker_id)
                .subquery()
            )
            rows = s.execute(
                select(WorkerRow, func.coalesce(ran.c.n, 0))
                .outerjoin(ran, ran.c.worker_id == WorkerRow.id)
                .where(WorkerRow.study_id == study_id)
                .order_by(WorkerRow.started_at, WorkerRow.id)
            )
            return [(worker, int(n)) for worker, n in rows]

    def live_workers(self, study: str, grace_s: float) -> list[WorkerRow]:
        """The study's workers that beat within the last ``grace_s`` seconds."""
        since = utcnow() - timedelta(seconds=grace_s)
        with self.session() as s:
            study_id = self._study(s, study).id
            return list(
                s.scalars(
                    select(WorkerRow).where(
                        WorkerRow.study_id == study_id,
                        WorkerRow.state == "alive",
                        WorkerRow.heartbeat_at >= since,
                    )
                )
            )

    def reap(self, study: str, grace_s: float, gone: Sequence[str] = ()) -> list[TrialRow]:
        """Mark the study's workers silent for more than ``grace_s`` seconds ``lost`` (and
        those in ``gone``, known dead however recent their heartbeat), and their running
        trials failed with kind ``lost``; the trials marked. A study left ``running`` with no
        live worker becomes ``interrupted``."""
        now = utcnow()
        since = now - timedelta(seconds=grace_s)
        with self.session() as s:
            row = self._study(s, study)
            dead = list(
                s.scalars(
                    select(WorkerRow)
                    .where(
                        WorkerRow.study_id == row.id,
                        WorkerRow.state == "alive",
                        or_(WorkerRow.heartbeat_at < since, WorkerRow.id.in_(list(gone))),
                    )
                    .with_for_update(skip_locked=True)
                )
            )
            by_id = {w.id: w for w in dead}
            lost: list[TrialRow] = []
            for trial in s.scalars(
                select(TrialRow).where(TrialRow.study_id == row.id, TrialRow.state == "running")
            ):
                worker = by_id.get(trial.worker_id or "")
                if worker is None:
                    continue
                trial.state, trial.failure_kind, trial.finished_at = "failed", "lost", now
                trial.failure_message = (
                    f"its worker ({worker.host}, pid {worker.pid}) stopped sending heartbeats "
                    f"at {worker.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC (killed, or its machine "
                    "was lost); the config is tried once more"
                )
                lost.append(trial)
                s.execute(  # the config may run again
                    delete(ClaimRow).where(
                        ClaimRow.study_id == row.id, ClaimRow.trial_number == trial.number
                    )
                )
            for worker in dead:
                worker.state, worker.finished_at = "lost", now
            alive = s.scalar(
                select(func.count())
                .select_from(WorkerRow)
                .where(
                    WorkerRow.study_id == row.id,
                    WorkerRow.state == "alive",
                    WorkerRow.heartbeat_at >= since,
                )
            )
            if dead and not alive and row.state in ("running", "stopping"):
                row.state, row.updated_at = "interrupted", now
            return lost

    # ------------------------------------------------------------------ trials

    def start_trial(
        self, study: str, number: int, config: dict[str, Any], worker_id: str | None = None
    ) -> None:
        with self.session() as s:
            study_row = self._study(s, study)
            s.add(
                TrialRow(
                    worker_id=worker_id,
                    study_id=study_row.id,
                    number=number,
                    state="running",
                    config=config,
                    started_at=utcnow(),
                )
            )

    def finish_trial(self, study: str, number: int, state: str, **fields: Any) -> TrialRow:
        """Record a trial's outcome; floats are stored only when finite."""
        with self.session() as s:
            study_row = self._study(s, study)
            row = s.scalar(
                select(TrialRow).where(TrialRow.study_id == study_row.id, TrialRow.number == number)
            )
            if row is None:
                raise StorageError(f"trial {number} of study {study!r} was never started")
            row.state = state
            row.finished_at = utcnow()
            for key, value in fields.items():
                if isinstance(value, float):
                    value = finite_or_none(value)
                elif isinstance(value, dict | list):
                    value = json_safe(value)
                setattr(row, key, value)
            s.flush()
            return row

    def record_estimates(
        self, study: str, estimates: Mapping[int, tuple[Estimate, Sequence[Sample] | None]]
    ) -> None:
        """Write configs' pooled estimates (``sweeper.noise``) onto their trials, in one
        transaction: the throughput and cost columns, the $/run interval, whether every
        measurement was contended, and, when given, each measurement."""
        if not estimates:
            return
        with self.session() as s:
            study_row = self._study(s, study)
            rows = s.scalars(
                select(TrialRow).where(
                    TrialRow.study_id == study_row.id, TrialRow.number.in_(list(estimates))
                )
            ).all()
            for row in rows:
                estimate, samples = estimates[row.number]
                row.cost_ci95_rel = finite_or_none(estimate.ci95_rel)
                row.contended = estimate.contended
                if samples is None:
                    continue
                row.remeasures = json_safe([sample.to_json() for sample in samples])
                # padded tokens keep the config's padding ratio (a measurement records none:
                # it is the batches', not the machine's), so the padding share stays true
                tokens = finite_or_none(estimate.tokens_per_s)
                if row.padded_tokens_per_s and row.tokens_per_s and tokens is not None:
                    row.padded_tokens_per_s *= tokens / row.tokens_per_s
                row.samples_per_s = finite_or_none(estimate.samples_per_s)
                row.tokens_per_s = tokens
                row.it_per_s = finite_or_none(estimate.it_per_s)
                hours, cost = pooled_run(row.projection, estimate, samples)
                row.hours_per_run = finite_or_none(hours)
                row.cost_per_run_usd = finite_or_none(cost)
                if row.projection and math.isfinite(hours):
                    one_time_s = float(row.projection.get("one_time_s") or 0.0)
                    row.projection = {
                        **row.projection,
                        "train_hours": max(0.0, hours - one_time_s / 3600),
                    }

    def list_trials(
        self,
        study: str,
        *,
        after: int | None = None,
        states: Sequence[str] | None = None,
        failure_kinds: Sequence[str] | None = None,
        config: Mapping[str, Any] | None = None,
        sort: str = "number",
        descending: bool = False,
        limit: int | None = None,
        offset: int = 0,
        include_measurement: bool = False,
    ) -> list[TrialRow]:
        """Trials in number order (or by ``sort``, a column of TRIAL_SORT_KEYS; missing values
        last); ``after`` returns only numbers greater than it (polling); ``config`` keeps trials
        whose knobs have these values, e.g. ``{"per_device_batch_size": 8}``.

        The bulky raw ``measurement`` JSON is only loaded with ``include_measurement=True``;
        touching it otherwise raises, rather than silently querying per row.
        """
        if sort not in TRIAL_SORT_KEYS:
            raise ValueError(f"cannot sort trials by {sort!r}; use one of {TRIAL_SORT_KEYS}")
        with self.session() as s:
            study_row = self._study(s, study)
            query = _filter_trials(
                select(TrialRow), study_row.id, after, states, failure_kinds, config
            )
            if not include_measurement:
                query = query.options(defer(TrialRow.measurement, raiseload=True))
            column = getattr(TrialRow, sort)
            order = (column.desc() if descending else column.asc()).nulls_last()
            query = query.order_by(order, TrialRow.number).offset(offset)
            if limit is not None:
                query = query.limit(limit)
            return list(s.scalars(query).all())

    def trial_metrics(
        self, study: str, *, states: Sequence[str] | None = None
    ) -> Sequence[TrialMetrics]:
        """Every trial (or those in ``states``) in number order, as plain read-only rows of
        METRIC_COLUMNS: what the recommendation, importance and charts read.

        With 10,000 trials this takes about half the time of ``list_trials``: no ORM objects,
        no timestamps, no failure text.
        """
        with self.session() as s:
            study_row = self._study(s, study)
            query = _filter_trials(select(*METRIC_COLUMNS), study_row.id, None, states, None, None)
            return s.execute(query.order_by(TrialRow.number)).all()  # type: ignore[return-value]

    def trial_marks(self, study: str, rows: int | None = None) -> TrialMarks:
        """What the study page marks: running trials, those measured only on a shared
        machine, numbers with no row, and the highest number. Small queries; reading every
        trial's (number, state, contended) took 72-108 ms at 10,000 trials. ``rows``: the
        study's trial count if the caller has it (``count_trials``); numbers 0..highest with
        as many rows have no gap, and the gap query is skipped."""
        with self.session() as s:
            study_id = self._study(s, study).id
            of_study = TrialRow.study_id == study_id
            numbers = select(TrialRow.number).where(of_study).order_by(TrialRow.number)
            running = s.scalars(numbers.where(TrialRow.state == "running")).all()
            contended = s.scalars(
                numbers.where(TrialRow.state == "complete", TrialRow.contended.is_(True))
            ).all()
            highest = s.scalar(select(func.max(TrialRow.number)).where(of_study))
            gaps: Sequence[Any] = []
            if highest is not None and rows != highest + 1:
                # gaps in the numbering, found in SQL: each row whose number is more than one
                # above the one before it, with the one before
                previous = func.lag(TrialRow.number).over(order_by=TrialRow.number)
                pairs = select(TrialRow.number.label("n"), previous.label("p")).where(of_study)
                q = pairs.subquery()
                gaps = s.execute(
                    select(q.c.n, q.c.p).where(q.c.n - func.coalesce(q.c.p, -1) > 1)
                ).all()
        skipped = [k for n, p in gaps for k in range(0 if p is None else p + 1, n)]
        return TrialMarks(
            running=list(running),
            contended=list(contended),
            skipped=skipped,
            highest=-1 if highest is None else highest,
        )

    def count_trials(
        self,
        study: str,
        *,
        after: int | None = None,
        states: Sequence[str] | None = None,
        failure_kinds: Sequence[str] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> int:
        """How many trials ``list_trials`` with the same filters returns without a limit."""
        with self.session() as s:
            study_row = self._study(s, study)
            query = _filter_trials(
                select(func.count(TrialRow.id)), study_row.id, after, states, failure_kinds, config
            )
            return int(s.scalar(query) or 0)

    def get_trial(self, study: str, number: int) -> TrialRow | None:
        """One trial with its raw measurement, or None if the study has no such number."""
        with self.session() as s:
            study_row = self._study(s, study)
            return s.scalar(
                select(TrialRow).where(TrialRow.study_id == study_row.id, TrialRow.number == number)
            )


def _update_worker(s: Session, worker_id: str, *where: Any, **values: Any) -> None:
    s.execute(update(WorkerRow).where(WorkerRow.id == worker_id, *where).values(**values))


def _charge(s: Session, worker_id: str, device_seconds: float) -> None:
    device_seconds = max(0.0, device_seconds)
    _update_worker(s, worker_id, device_seconds=WorkerRow.device_seconds + device_seconds)


def _columns_of(row: StudyRow | TrialRow) -> dict[str, Any]:
    skipped = {"id", "study_id"}
    return {c.name: getattr(row, c.name) for c in row.__table__.columns if c.name not in skipped}


def _filter_trials(
    query: Select[Any],
    study_id: int,
    after: int | None,
    states: Sequence[str] | None,
    failure_kinds: Sequence[str] | None,
    config: Mapping[str, Any] | None,
) -> Select[Any]:
    query = query.where(TrialRow.study_id == study_id)
    if after is not None:
        query = query.where(TrialRow.number > after)
    if states:
        query = query.where(TrialRow.state.in_(list(states)))
    if failure_kinds:
        query = query.where(TrialRow.failure_kind.in_(list(failure_kinds)))
    for knob, value in (config or {}).items():
        query = query.where(_config_equals(knob, value))
    return query


def _config_equals(knob: str, value: Any) -> ColumnElement[bool]:
    """``config[knob] == value`` in SQL, typed by the value (JSON on SQLite, JSONB on PG)."""
    element = TrialRow.config[knob]
    if value is None:
        return element.as_string().is_(None)
    if isinstance(value, bool):
        return element.as_boolean() == value
    if isinstance(value, int):
        # a stored knob value is a 32-bit integer (as Postgres casts it): a larger one matches
        # no trial, and must not reach the cast ("integer out of range") or SQLite (OverflowError)
        if not -(2**31) <= value < 2**31:
            return false()
        return element.as_integer() == value
    if isinstance(value, float):
        if not math.isfinite(value):
            return false()
        return element.as_float() == value
    return element.as_string() == str(value)


def _retrying_method(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Store, *args: Any, **kwargs: Any) -> Any:
        if not self.retry_s:
            return method(self, *args, **kwargs)
        return retried(method, lambda: self.retry_s, f"store.{method.__name__}")(
            self, *args, **kwargs
        )

    return call


# every public method of the store rides out a lost connection when the store has retry_s
for _name, _member in list(vars(Store).items()):
    plain = inspect.isfunction(_member) and not inspect.isgeneratorfunction(_member)
    if plain and not _name.startswith("_") and _name not in ("dispose", "session"):
        setattr(Store, _name, _retrying_method(_member))
