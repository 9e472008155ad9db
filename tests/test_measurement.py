"""The Measurement is the one declaration of a trial's result: the stored columns, Optuna's
attributes, the REST fields, the sort keys and the dashboard's table agree with it; stored
measurements still load; a missing or misspelt key fails its trial, not the sweep."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types
import typing

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError
from sqlalchemy import BigInteger, Float, String

import dashboards
from api.app import create_app
from api.routes import pages, studies
from api.schemas import TrialDetail, TrialSummary
from sweeper import importance
from sweeper.measurement import (
    COLUMN_METRICS,
    METRICS,
    OPTUNA_ATTRS,
    SORT_KEYS,
    TABLE_METRICS,
    Measurement,
    MeasurementError,
    parse_measurement,
    sample_measurement,
)
from sweeper.store import Store, TrialMetrics, TrialRow
from sweeper.store.store import TRIAL_SORT_KEYS
from sweeper.studyfile import read_study_file
from sweeper.sweep.executor import measurement_of
from sweeper.trial.protocol import ChildResult
from tests.helpers import REPO, STUDY_FIELDS

# TrialRow columns that are not metrics: bookkeeping, the config, the projection's parts and
# the failure.
NOT_METRICS = {
    "id",
    "study_id",
    "number",
    "state",
    "config",
    "own_values",  # what a script ran of its own, beside the config (not a measured figure)
    "started_at",
    "finished_at",
    "wall_s",
    "projection",
    "failure_kind",
    "failure_message",
    "measurement",
    "contended",  # of the config's measurements together (sweeper.noise), not of one
    "remeasures",
    "worker_id",  # the sweep process that ran it
}
SQL_TYPES = {float: Float, int: BigInteger, str: String}
# Fields a measurement stored before them lacks (or that only some devices report).
ADDED_LATER = (
    "engine",
    "trainable_params",
    "mean_row_tokens",
    "optimizer",
    "tf32_matmul",
    "peak_name",
    "peak_memory_reserved_bytes",
    "startup_own_s",
    "startup_inherited_s",
    "host_others_cpu",
    "cpu_steal_share",
    "gpu_other_processes",
    "contended",
    "contention",
)


def _base_type(annotation: object) -> object:
    """``float`` of ``float | None``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        (base,) = [a for a in typing.get_args(annotation) if a is not type(None)]
        return base
    return annotation


# ---------------------------------------------------------------- derived and checked places


def test_trial_row_has_one_column_per_stored_metric() -> None:
    columns = TrialRow.__table__.columns
    assert {c.name for c in columns} - NOT_METRICS == {m.name for m in COLUMN_METRICS}
    for metric in COLUMN_METRICS:
        column = columns[metric.name]
        assert column.nullable, metric.name  # running and failed trials have none
        assert isinstance(column.type, SQL_TYPES[_base_type(metric.value_type)]), metric.name


def test_trial_metrics_rows_type_their_metrics_as_measured() -> None:
    hints = typing.get_type_hints(TrialMetrics)
    for name, hint in hints.items():
        if name in METRICS:
            assert METRICS[name].column, name
            assert hint == _base_type(METRICS[name].value_type) | None, name
        else:
            assert name in NOT_METRICS, name


def test_a_measurement_fills_the_stored_columns(sqlite_url: str) -> None:
    measurement = sample_measurement(samples_per_s=41.5, env={"device_name": "NVIDIA A100"})
    values = measurement.columns()
    assert set(values) == {m.name for m in COLUMN_METRICS if m.path}
    assert values["samples_per_s"] == 41.5 and values["device_name"] == "NVIDIA A100"
    store = Store(sqlite_url)
    store.migrate()
    store.upsert_study("s", **STUDY_FIELDS)
    store.start_trial("s", 0, {})
    store.finish_trial("s", 0, "complete", measurement=measurement.model_dump(), **values)
    row = store.get_trial("s", 0)
    assert row is not None
    assert {name: getattr(row, name) for name in values} == values
    assert Measurement.model_validate(row.measurement) == measurement
    store.dispose()


def test_optuna_attrs_are_measurement_metrics() -> None:
    measurement = sample_measurement()
    attrs = measurement.optuna_attrs()
    assert tuple(attrs) == OPTUNA_ATTRS
    for name in OPTUNA_ATTRS:
        assert METRICS[name].path, name  # measured, not projected
        assert attrs[name] == getattr(measurement, name)
    # what optuna-dashboard users have seen since the first sweep
    assert {"samples_per_s", "tokens_per_s", "it_per_s", "peak_memory_bytes"} <= set(attrs)
    assert json.dumps(sample_measurement(samples_per_s=math.nan).optuna_attrs())  # no NaN


def test_rest_trials_have_a_field_per_stored_column() -> None:
    fields = TrialSummary.model_fields
    assert set(fields) == {c.name for c in TrialRow.__table__.columns} - {
        "id",
        "study_id",
        "measurement",
    }
    # and, in the detail only, the real-token MFU derived for a record that counted padding
    assert set(TrialDetail.model_fields) == set(fields) | {"measurement", "real_token_mfu"}
    for metric in COLUMN_METRICS:
        field = fields[metric.name]
        assert field.annotation == _base_type(metric.value_type) | None, metric.name
        assert field.description == metric.description and metric.description, metric.name


def test_sort_keys_are_metrics_with_a_better_direction() -> None:
    assert ("number", *SORT_KEYS, "wall_s") == TRIAL_SORT_KEYS
    assert typing.get_args(studies.SortKey) == TRIAL_SORT_KEYS
    columns = {c.name for c in TrialRow.__table__.columns}
    for key in SORT_KEYS:
        assert METRICS[key].column and METRICS[key].better is not None
        assert key in columns
    assert set(pages.SORTABLE) <= set(TRIAL_SORT_KEYS)
    # importance ranks knobs by any of these; its direction is the metric's
    for target in typing.get_args(importance.Target):
        assert target in typing.get_type_hints(TrialMetrics) and METRICS[target].better


def test_dashboard_table_shows_the_table_metrics(sqlite_url: str) -> None:
    assert {"number": False} | {
        m.name: m.better == "higher" for m in TABLE_METRICS if m.sortable
    } == pages.SORTABLE
    assert {m.format for m in METRICS.values()} <= set(dashboards.FORMATS)
    store = Store(sqlite_url)
    store.migrate()
    store.upsert_study("s", **STUDY_FIELDS)
    store.start_trial("s", 0, {"per_device_batch_size": 8})
    measurement = sample_measurement(peak_memory_bytes=40 * 2**30, mfu=0.25)
    store.finish_trial(
        "s",
        0,
        "complete",
        measurement=measurement.model_dump(),
        hours_per_run=12.34,
        cost_per_run_usd=30.85,
        **measurement.columns(),
    )
    store.dispose()
    with TestClient(create_app(sqlite_url)) as client:
        page = client.get("/studies/s").text
    table = page[page.index('id="trials-table"') :]
    # every table metric, in the page's order: what a run costs first
    assert sorted(m.name for m in pages.TABLE_COLUMNS) == sorted(m.name for m in TABLE_METRICS)
    assert [m.name for m in pages.TABLE_COLUMNS[:3]] == [
        "cost_per_run_usd", "cost_ci95_rel", "hours_per_run",
    ]  # fmt: skip
    headers = [table.index(f">{m.label}<") for m in pages.TABLE_COLUMNS]
    assert headers == sorted(headers)
    for shown in ("32.0", "12,300", "40.0 GiB", "25.0%", "$30.85", "12.3"):
        assert f">{shown}</td>" in table, shown


# ---------------------------------------------------------------- stored and new measurements


def test_the_committed_study_still_loads() -> None:
    document = read_study_file(REPO / "studies" / "cpu-demo.json")
    complete = [t for t in document.trials if t["state"] == "complete"]
    assert complete
    for trial in complete:
        measurement = parse_measurement(trial["measurement"])
        assert measurement.engine == "loop" and measurement.trainable_params is None
        # the stored columns are what the Measurement says they copy
        for name, value in measurement.columns().items():
            assert trial[name] == value, name


def test_older_measurements_without_later_fields_load() -> None:
    data = sample_measurement().model_dump()
    for name in ADDED_LATER:
        data.pop(name)
    measurement = parse_measurement(data)
    assert (measurement.engine, measurement.optimizer, measurement.startup_own_s) == (
        "loop",
        None,
        None,
    )
    required = {name for name, f in Measurement.model_fields.items() if f.is_required()}
    assert required.isdisjoint(ADDED_LATER)


def test_engines_and_their_own_phases() -> None:
    measurement = sample_measurement(
        engine="sft", trainable_params=4_194_304, phases_s={"dataset": 12.5, "optimizer": None}
    )
    assert measurement.trainable_params == 4_194_304
    assert measurement.phases_s.model_extra == {"dataset": 12.5}
    assert measurement.phases_s.optimizer is None
    assert parse_measurement(measurement.model_dump()) == measurement
    with pytest.raises(MeasurementError, match="engine"):
        parse_measurement(measurement.model_dump() | {"engine": "deepspeed"})
    with pytest.raises(MeasurementError, match=r"phases_s\.dataset"):
        parse_measurement(measurement.model_dump() | {"phases_s": {"dataset": "slow"}})


def test_missing_or_misspelt_keys_fail_loudly() -> None:
    data = sample_measurement().model_dump()
    del data["tokens_per_s"]
    data["token_per_s"] = 1.0
    data["env"]["device_nmae"] = data["env"].pop("device_name")
    with pytest.raises(MeasurementError) as caught:
        parse_measurement(data)
    message = str(caught.value)
    assert "tokens_per_s: missing" in message
    assert "token_per_s: unknown key" in message
    assert "env.device_name: missing" in message and "env.device_nmae: unknown key" in message


def test_the_sweep_turns_a_bad_result_into_a_failed_trial() -> None:
    good = sample_measurement().model_dump()
    assert measurement_of(good) == (sample_measurement(), None)
    assert measurement_of(None) == (None, None)  # the child failed, and said why
    measurement, problem = measurement_of(good | {"sampels_per_s": 3.0})
    assert measurement is None and problem is not None
    assert "sampels_per_s: unknown key" in problem


def test_nan_and_inf_cross_json_as_null_and_read_back_as_nan() -> None:
    measurement = sample_measurement(samples_per_s=math.nan, throughput_ci95_rel=math.inf)
    payload = ChildResult.model_validate_json(
        ChildResult(status="ok", payload=measurement.model_dump()).model_dump_json()
    ).payload
    assert payload is not None and payload["samples_per_s"] is None
    back = parse_measurement(payload)
    assert math.isnan(back.samples_per_s) and math.isnan(back.throughput_ci95_rel)
    assert back.optuna_attrs()["samples_per_s"] is None


def test_inherited_startup_is_counted_once() -> None:
    measurement = sample_measurement(startup_s=2.0).with_inherited_startup(5.0)
    assert (measurement.startup_s, measurement.startup_own_s) == (7.0, 2.0)
    again = measurement.with_inherited_startup(3.0)
    assert (again.startup_s, again.startup_inherited_s) == (5.0, 3.0)


# ---------------------------------------------------------------- the factory


def test_factory_overrides_validate() -> None:
    measurement = sample_measurement(it_per_s=3.0, env={"device_type": "cpu"})
    assert measurement.it_per_s == 3.0
    assert measurement.env.device_type == "cpu" and measurement.env.torch  # the rest kept
    assert sample_measurement() == sample_measurement()
    with pytest.raises(ValidationError, match="sampels_per_s"):
        sample_measurement(sampels_per_s=1.0)
    with pytest.raises(ValidationError):
        sample_measurement(measured_steps="many")


def test_every_field_is_documented() -> None:
    for model in (Measurement, *_nested(Measurement)):
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name}"


def _nested(model: type[BaseModel]) -> list[type[BaseModel]]:
    return [
        f.annotation
        for f in model.model_fields.values()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    ]


def test_the_module_does_not_import_torch() -> None:
    code = "import sys, sweeper.measurement; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
