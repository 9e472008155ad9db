"""One store suite, run against SQLite and a fresh Postgres database."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from sweeper.errors import StorageError, StudyNotFoundError
from sweeper.measurement import sample_measurement
from sweeper.store import Store, TrialMetrics
from tests.helpers import STUDY_FIELDS


@pytest.fixture
def store(storage_url: str) -> Store:
    store = Store(storage_url)
    store.migrate()
    yield store
    store.dispose()


def test_migrate_is_idempotent_and_creates_our_tables(store: Store) -> None:
    store.migrate()
    tables = set(inspect(store.engine).get_table_names())
    assert {"sweeper_studies", "sweeper_trials", "sweeper_alembic_version"} <= tables


def test_migrations_match_the_models(store: Store) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from sweeper.store.models import Base

    with store.engine.connect() as connection:
        context = MigrationContext.configure(
            connection, opts={"version_table": "sweeper_alembic_version"}
        )
        differences = [
            d
            for d in compare_metadata(context, Base.metadata)
            # Optuna's tables share the database; only ours must match
            if "sweeper_" in str(d)
        ]
    assert differences == []


def test_study_round_trip_and_resume(store: Store) -> None:
    created = store.upsert_study("s", **STUDY_FIELDS)
    again = store.upsert_study("s", **{**STUDY_FIELDS, "n_trials_planned": 9})  # resumed
    assert again.id == created.id
    row = store.get_study("s")
    assert (row.n_trials_planned, row.usd_per_hour, row.samples) == (9, 2.5, 600_000)
    store.set_study_state("s", "finished")
    assert store.get_study("s").state == "finished"


def test_trials_lifecycle_filters_and_counts(store: Store) -> None:
    store.upsert_study("s", **STUDY_FIELDS)
    for number in range(4):
        store.start_trial("s", number, {"per_device_batch_size": 2**number})
    store.finish_trial(
        "s",
        0,
        "complete",
        samples_per_s=10.0,
        cost_per_run_usd=5.0,
        measurement=sample_measurement(step_times_s=[0.1, 0.2]).model_dump(),
    )
    store.finish_trial("s", 1, "complete", samples_per_s=20.0, cost_per_run_usd=2.5)
    store.finish_trial("s", 2, "failed", failure_kind="oom", failure_message="CUDA out of memory")
    # trial 3 stays running
    numbers = [t.number for t in store.list_trials("s")]
    assert numbers == [0, 1, 2, 3]
    assert [t.number for t in store.list_trials("s", after=1)] == [2, 3]
    assert [t.number for t in store.list_trials("s", states=["failed"])] == [2]
    assert [t.number for t in store.list_trials("s", limit=2, offset=1)] == [1, 2]
    first = store.list_trials("s", include_measurement=True)[0]
    assert first.config == {"per_device_batch_size": 1}
    assert first.measurement == sample_measurement(step_times_s=[0.1, 0.2]).model_dump()
    assert first.finished_at is not None and first.finished_at >= first.started_at
    ((study, summary),) = store.list_studies()
    assert study.name == "s"
    assert summary["trials"] == {"complete": 2, "failed": 1, "running": 1}
    assert summary["best_cost_per_run_usd"] == 2.5


def test_a_studys_updated_time_follows_its_trials(store: Store) -> None:
    """The overview's "Updated" moved only when the study row changed (a sweep's start and
    end), so a sweep running for an hour read "updated an hour ago" throughout."""
    from datetime import UTC

    store.upsert_study("s", **STUDY_FIELDS)
    ((_, empty),) = store.list_studies()
    assert empty["updated_at"] == store.get_study("s").updated_at
    row_time = store.get_study("s").updated_at
    store.start_trial("s", 0, {})
    (started_row,) = store.list_trials("s")
    started = started_row.started_at
    ((_, running),) = store.list_studies()
    finished = store.finish_trial("s", 0, "complete", cost_per_run_usd=1.0).finished_at
    ((_, done),) = store.list_studies()

    def aware(moment):
        return moment if moment.tzinfo else moment.replace(tzinfo=UTC)

    assert aware(running["updated_at"]) == aware(started) > aware(row_time)
    assert aware(done["updated_at"]) == aware(finished) >= aware(started)
    assert store.get_study("s").updated_at == row_time  # the row itself was not written


def test_non_finite_numbers_are_stored_as_null(store: Store) -> None:
    store.upsert_study("s", **STUDY_FIELDS)
    store.start_trial("s", 0, {})
    store.finish_trial(
        "s",
        0,
        "complete",
        samples_per_s=float("nan"),
        loss_last=float("inf"),
        measurement=sample_measurement(losses=[1.0, float("nan")]).model_dump(),
    )
    (row,) = store.list_trials("s", include_measurement=True)
    assert row.samples_per_s is None and row.loss_last is None
    assert row.measurement["losses"] == [1.0, None]


def test_get_trial_loads_the_measurement(store: Store) -> None:
    store.upsert_study("s", **STUDY_FIELDS)
    store.start_trial("s", 0, {})
    measurement = sample_measurement(step_times_s=[0.5]).model_dump()
    store.finish_trial("s", 0, "complete", measurement=measurement)
    trial = store.get_trial("s", 0)
    assert trial is not None and trial.measurement == measurement
    assert store.get_trial("s", 1) is None
    (listed,) = store.list_trials("s")
    with pytest.raises(Exception, match="measurement"):
        _ = listed.measurement  # deferred on lists: it must not lazy-load per row


def test_unknown_study_and_trial(store: Store) -> None:
    with pytest.raises(StudyNotFoundError, match="'nope'"):
        store.list_trials("nope")
    store.upsert_study("s", **STUDY_FIELDS)
    with pytest.raises(StorageError, match="never started"):
        store.finish_trial("s", 7, "complete")


def test_delete_cascades_to_trials(store: Store) -> None:
    store.upsert_study("s", **STUDY_FIELDS)
    store.start_trial("s", 0, {})
    store.delete_study("s")
    with pytest.raises(StudyNotFoundError):
        store.get_study("s")
    assert store.list_studies() == []


def test_unreachable_database_is_a_clear_error() -> None:
    store = Store("postgresql+psycopg://postgres:secret@127.0.0.1:1/none")
    with pytest.raises(StorageError) as info:
        store.migrate()
    message = str(info.value)
    assert "127.0.0.1:1" in message and "secret" not in message and "***" in message


def test_invalid_url_is_a_clear_error() -> None:
    with pytest.raises(StorageError, match="invalid storage URL"):
        Store("notadb://x")


def _config(batch: int, attn: str, packing: bool, prefetch: int | None) -> dict[str, object]:
    return {
        "per_device_batch_size": batch,
        "attn_implementation": attn,
        "packing": packing,
        "prefetch_factor": prefetch,
    }


def test_trials_filter_by_knob_and_kind_sort_and_count(store: Store) -> None:
    store.upsert_study("s", **STUDY_FIELDS)
    costs = {0: 3.0, 1: None, 2: 1.0, 3: 2.0, 4: None}
    configs = {
        0: _config(8, "sdpa", False, None),
        1: _config(8, "eager", True, 2),
        2: _config(16, "sdpa", True, 2),
        3: _config(8, "sdpa", True, None),
        4: _config(16, "eager", False, 4),
    }
    for number, cost in costs.items():
        store.start_trial("s", number, configs[number])
        if cost is None:
            kind = "oom" if number == 1 else "timeout"
            store.finish_trial("s", number, "failed", failure_kind=kind)
        else:
            store.finish_trial("s", number, "complete", cost_per_run_usd=cost, mfu=cost / 10)

    def numbers(**filters: object) -> list[int]:
        return [t.number for t in store.list_trials("s", **filters)]  # type: ignore[arg-type]

    assert numbers(config={"per_device_batch_size": 8}) == [0, 1, 3]
    assert numbers(config={"per_device_batch_size": 8, "attn_implementation": "sdpa"}) == [0, 3]
    assert numbers(config={"packing": True}) == [1, 2, 3]
    assert numbers(config={"prefetch_factor": None}) == [0, 3]
    assert numbers(config={"prefetch_factor": 2}) == [1, 2]
    assert numbers(failure_kinds=["oom"]) == [1]
    # by $/run, cheapest first, trials without a price last (in number order)
    assert numbers(sort="cost_per_run_usd") == [2, 3, 0, 1, 4]
    assert numbers(sort="cost_per_run_usd", descending=True) == [0, 3, 2, 1, 4]
    assert numbers(sort="mfu", limit=2, offset=1) == [3, 0]
    assert store.count_trials("s", states=["failed"]) == 2
    assert store.count_trials("s", config={"packing": False}) == 2
    assert store.list_trials("s", sort="mfu")[0].mfu == pytest.approx(0.1)
    with pytest.raises(ValueError, match="cannot sort trials by 'config'"):
        store.list_trials("s", sort="config")


def test_stop_is_requested_only_for_a_running_study(store: Store) -> None:
    store.upsert_study("s", **STUDY_FIELDS)  # state "running"
    assert not store.stop_requested("s")
    assert store.request_stop("s") is True
    assert store.stop_requested("s")
    assert store.get_study("s").state == "stopping"
    assert store.request_stop("s") is False  # already stopping
    store.set_study_state("s", "finished")
    assert store.request_stop("s") is False
    with pytest.raises(StudyNotFoundError):
        store.request_stop("nope")


def test_version_changes_whenever_a_trial_or_the_study_changes(store: Store) -> None:
    store.upsert_study("s", **STUDY_FIELDS)
    seen = [store.version("s")]
    store.start_trial("s", 0, {"per_device_batch_size": 8})
    seen.append(store.version("s"))
    store.finish_trial("s", 0, "complete", cost_per_run_usd=1.0)
    seen.append(store.version("s"))
    store.add_sweep_seconds("s", 12.0)
    seen.append(store.version("s"))
    store.set_study_state("s", "finished")
    seen.append(store.version("s"))
    assert len(set(seen)) == len(seen)
    assert store.version("s") == seen[-1]  # stable while nothing changes


def test_trial_metrics_are_the_list_trials_fields_in_number_order(store: Store) -> None:
    store.upsert_study("s", **STUDY_FIELDS)
    for number, state in ((2, "complete"), (0, "failed"), (1, "complete"), (3, "running")):
        store.start_trial("s", number, {"per_device_batch_size": 2**number, "packing": False})
        if state == "complete":
            store.finish_trial(
                "s",
                number,
                "complete",
                samples_per_s=10.0 + number,
                cost_per_run_usd=5.0 - number,
                projection={"train_hours": 1.5},
                device_name="NVIDIA H100 80GB HBM3",
            )
        elif state == "failed":
            store.finish_trial("s", 0, "failed", failure_kind="oom", failure_message="OOM")
    rows = store.trial_metrics("s")
    full = {t.number: t for t in store.list_trials("s")}
    assert [row.number for row in rows] == [0, 1, 2, 3]
    fields = list(TrialMetrics.__annotations__)
    for row in rows:
        assert tuple(row) == tuple(getattr(full[row.number], name) for name in fields)
    assert rows[2].projection == {"train_hours": 1.5} and rows[0].failure_kind == "oom"
    complete = store.trial_metrics("s", states=["complete"])
    assert [(r.number, r.cost_per_run_usd) for r in complete] == [(1, 4.0), (2, 3.0)]


@pytest.mark.postgres
def test_two_workers_creating_one_new_study_at_once_both_go_on(postgres_url: str) -> None:
    """Two workers of `launch --workers 2` create the same new study: the second's insert
    waits on the first's unique name, then fails with the duplicate key once the first
    commits. Under load a worker of the CI's SIGTERM test died so ("duplicate key value
    violates unique constraint sweeper_studies_name_key"), and its launch with it. The one
    that loses the race now updates the row the other made. Made deterministic: the first
    insert is held open (flushed, not committed) while the other upserts."""
    import threading
    import time

    from sweeper.store.models import StudyRow
    from sweeper.store.store import utcnow

    store = Store(postgres_url)
    store.migrate()
    errors: list[BaseException] = []

    def second() -> None:
        try:
            store.upsert_study("race", **(STUDY_FIELDS | {"usd_per_hour": 7.0}))
        except BaseException as e:  # reported to the test
            errors.append(e)

    try:
        with store.session() as s:
            now = utcnow()
            s.add(StudyRow(name="race", created_at=now, updated_at=now, **STUDY_FIELDS))
            s.flush()  # the name is taken, not yet committed
            other = threading.Thread(target=second)
            other.start()
            time.sleep(1.0)  # its SELECT saw no row; its INSERT waits on ours
            assert other.is_alive()
        other.join(timeout=30)
        assert not other.is_alive()
        assert errors == [], errors
        assert store.get_study("race").usd_per_hour == 7.0  # the loser's fields, updated
    finally:
        store.dispose()
