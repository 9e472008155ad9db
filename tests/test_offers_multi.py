"""The offers table reads measured N-device trials (issue 35 item 3): a study with trials on 1
and 2 devices shows 1× and 2× rows, both measured, the 2× priced at 2 × the device's $/h with
its scaling efficiency; an N-GPU offer nobody measured stays unpriced and says why (and what
was measured at N elsewhere); estimates of other GPU types scale one-device trials only.

The 2-device trials are CONSTRUCTED from the study recorded on a real H100 (its completed
trials copied as ``devices: 2, data_parallel: ddp`` at 1.8× the samples/s, so 90% scaling):
no two-GPU machine was measured for this test; the table's arithmetic is what it checks."""

from __future__ import annotations

import copy

import pytest

from sweeper.compare import compare
from sweeper.recommend import Constraints
from tests.test_catalog import _h100, _offers, _store_with

PRICE = 2.5  # the recorded study's $ per H100-hour


def _with_two_device_twins(scale: float = 1.8) -> dict:
    document = _h100()
    twins = []
    for trial in document["trials"]:
        if trial["state"] != "complete":
            continue
        twin = copy.deepcopy(trial)
        twin["number"] = 100 + trial["number"]
        twin["config"] = twin["config"] | {"devices": 2, "data_parallel": "ddp"}
        measurement, projection = twin["measurement"], twin["projection"]
        for key in ("samples_per_s", "tokens_per_s", "it_per_s", "padded_tokens_per_s"):
            if twin.get(key) is not None:
                twin[key] = twin[key] * scale
            if measurement.get(key) is not None:
                measurement[key] = measurement[key] * scale
        projection["train_hours"] /= scale
        twin["hours_per_run"] = projection["train_hours"] + projection["one_time_s"] / 3600
        twin["cost_per_run_usd"] = twin["hours_per_run"] * 2 * PRICE
        twin["remeasures"] = None
        twin["cost_ci95_rel"] = None
        twins.append(twin)
    document["trials"] += twins
    document["optuna"] = None  # the twins have no Optuna trial: our rows are what is read
    return document


def test_one_and_two_device_rows_are_measured_and_unmeasured_counts_say_why(
    sqlite_url: str,
) -> None:
    store = _store_with(sqlite_url, (_with_two_device_twins(), "h100"))
    try:
        table = _offers(
            store,
            "h100",
            constraints=Constraints(max_hours=24),
            gpus=["h100-sxm", "a100-40gb", "h200-sxm"],
            offers=["2x h100-sxm", "2x a100-40gb", "4x a100-40gb"],
        )
    finally:
        store.dispose()
    rows = {row.name: row for row in table.rows}
    one, two = rows["H100 SXM 80GB"], rows["2× H100 SXM 80GB"]
    assert one.config is not None
    assert (one.basis, one.count, one.config.get("devices", 1)) == ("measured", 1, 1)
    assert one.cost_per_run_usd == pytest.approx(16.57, abs=0.01)  # as before N-device trials
    assert (two.basis, two.count, two.usd_per_hour) == ("measured", 2, 2 * PRICE)
    assert two.config is not None and two.config["devices"] == 2
    assert two.trial_number is not None and two.trial_number >= 100
    assert two.hours_per_run is not None and two.cost_per_run_usd is not None
    assert two.cost_per_run_usd == pytest.approx(two.hours_per_run * 2 * PRICE)
    assert two.scaling_efficiency == pytest.approx(0.9)
    assert "90% scaling efficiency" in two.note and "priced 2 × $2.50/h" in two.note
    # at 90% scaling two H100s cost 2/1.8 = 1.11× one per run: one stays the cheapest
    assert table.cheapest is not None and table.cheapest.name == "H100 SXM 80GB"
    two_a100 = rows["2× A100 SXM 40GB"]
    assert two_a100.basis == "needs a multi-GPU measurement"
    assert two_a100.cost_per_run_usd is None and two_a100.hours_per_run is None
    assert "not measured on 2 A100 SXM 40GB" in two_a100.note
    assert "measured at 2 devices elsewhere: 90% on H100 SXM 80GB" in two_a100.note
    four = rows["4× A100 SXM 40GB"]
    assert four.basis == "needs a multi-GPU measurement" and "elsewhere" not in four.note
    # the one-GPU estimates scale a one-device trial, never a group's samples/s
    h200 = rows["H200 SXM 141GB"]
    assert h200.basis == "estimate" and h200.config is not None
    assert h200.config.get("devices", 1) == 1  # stored before the knob: one device


def test_compare_through_the_store_shows_the_measured_two_device_row(sqlite_url: str) -> None:
    store = _store_with(sqlite_url, (_with_two_device_twins(), "h100"))
    try:
        result = compare(store, "h100", offers=True, gpus=["h100-sxm"])
    finally:
        store.dispose()
    assert result.offers is not None
    names = {row.name: row.basis for row in result.offers.rows}
    assert names == {"H100 SXM 80GB": "measured", "2× H100 SXM 80GB": "measured"}
