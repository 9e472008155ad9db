"""Scaling priced (issue 35 item 2): a run on N devices costs hours × N × one device's $/h;
each multi-device trial states its scaling efficiency against the same config on one device
measured in the study, or that it is missing; the effective batch counts the devices and the
learning-rate advice follows. Checked through ``best`` (in-process), the REST route and the
study page, on a real SQLite store."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from sweeper.cost import RunPlan, project_run
from sweeper.recommend import Constraints, best
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config

SAMPLES = 600_000 * 3  # seed 000's job
PRICE = 2.5  # STUDY_FIELDS: an H100 at $2.50 per device-hour


def _config(batch: int, accumulation: int, devices: int, strategy: str | None = None) -> dict:
    return tiny_config(
        per_device_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        devices=devices,
        data_parallel=strategy,
    ).model_dump()


TRIALS = [  # number, config, samples/s
    (0, _config(8, 2, 1), 100.0),  # the baseline, on one device: 5 h
    (1, _config(8, 2, 2, "ddp"), 180.0),  # 90% scaling
    (2, _config(8, 2, 2, "fsdp2"), 190.0),  # 95% scaling
    (3, _config(2, 1, 4, "ddp"), 300.0),  # no 1-device twin measured
]


@pytest.fixture
def store(sqlite_url: str) -> Iterator[Store]:
    store = Store(sqlite_url)
    store.migrate()
    text = TINY_SPACE.read_text().replace(
        "  samples: 10000\n", "  samples: 10000\n  learning_rate: 0.0002\n"
    )
    store.upsert_study("scale", **(STUDY_FIELDS | {"baseline": TRIALS[0][1], "space_yaml": text}))
    for number, config, samples_per_s in TRIALS:
        projection = project_run(
            RunPlan(samples=SAMPLES, epochs=1, usd_per_hour=PRICE, devices=config["devices"]),
            samples_per_s=samples_per_s,
        )
        store.start_trial("scale", number, config)
        store.finish_trial(
            "scale",
            number,
            "complete",
            samples_per_s=samples_per_s,
            hours_per_run=projection.hours_per_run,
            cost_per_run_usd=projection.cost_per_run_usd,
        )
    yield store
    store.dispose()


def _hours(samples_per_s: float) -> float:
    return SAMPLES / samples_per_s / 3600


def test_one_device_prices_as_before_and_n_devices_cost_n_times(store: Store) -> None:
    r = best(store, "scale")
    # nothing on several devices beats one device per run: the baseline, priced as before
    assert r.trial_number == 0 and r.devices == 1
    assert r.cost_per_run_usd == pytest.approx(_hours(100) * PRICE)
    stored = {t.number: t.cost_per_run_usd for t in store.list_trials("scale")}
    assert stored[1] == pytest.approx(_hours(180) * 2 * PRICE)
    assert stored[3] == pytest.approx(_hours(300) * 4 * PRICE)
    # a deadline of 3 h: only the groups make it; fsdp2 on 2 is cheapest (4 devices cost more)
    fast = best(store, "scale", Constraints(max_hours=3))
    assert fast.trial_number == 2 and fast.devices == 2
    assert fast.cost_per_run_usd == pytest.approx(_hours(190) * 2 * PRICE)
    repriced = best(store, "scale", Constraints(max_hours=3, usd_per_hour=1.0))
    assert repriced.cost_per_run_usd == pytest.approx(_hours(190) * 2 * 1.0)


def test_scaling_efficiency_against_one_device_or_said_missing(store: Store) -> None:
    fast = best(store, "scale", Constraints(max_hours=3))
    rows = {s.trial_number: s for s in fast.scaling}
    assert sorted(rows) == [1, 2, 3]
    assert rows[1].efficiency == pytest.approx(180 / (2 * 100))
    assert rows[2].efficiency == pytest.approx(190 / (2 * 100))
    assert rows[2].single_trial_number == 0 and rows[2].data_parallel == "fsdp2"
    assert rows[3].efficiency is None and rows[3].single_trial_number is None
    assert "the same config on 1 device is not measured" in rows[3].note
    assert fast.winner_scaling == rows[2]
    assert rows[2].text() == (
        "#2 on 2 devices (fsdp2): 1.90× one device's samples/s, 95% scaling efficiency (against #0)"
    )


def test_the_effective_batch_counts_devices_and_the_learning_rate_follows(store: Store) -> None:
    fast = best(store, "scale", Constraints(max_hours=3))
    assert (fast.effective_batch, fast.baseline_effective_batch) == (8 * 2 * 2, 8 * 2)
    assert fast.suggested_learning_rate == pytest.approx(0.0002 * 2**0.5)
    assert any("effective batch changes from 16 to 32" in w for w in fast.warnings)


def test_rest_and_study_page_show_the_scaling(sqlite_url: str, store: Store) -> None:
    with TestClient(create_app(sqlite_url)) as client:
        body = client.get("/api/studies/scale/best", params={"max_hours": 3}).json()
        page = client.get("/studies/scale").text
    assert body["trial_number"] == 2 and body["devices"] == 2
    assert body["cost_per_run_usd"] == pytest.approx(_hours(190) * 2 * PRICE)
    scaling = {s["trial_number"]: s for s in body["scaling"]}
    assert scaling[1]["efficiency"] == pytest.approx(0.9)
    assert scaling[3]["efficiency"] is None
    assert "$2.50/h per device" in page
    text = re.sub(r"\s+", " ", page)
    assert "Scaling: #1 on 2 devices (ddp): 1.80× one device&#39;s samples/s, 90%" in text
    assert "Scaling: #3 on 4 devices (ddp): no scaling efficiency" in text


def test_a_pair_measured_on_a_shared_machine_gives_no_efficiency(store: Store) -> None:
    """A walk's 2-core CPU: the 1-device trial ran beside busy loops (its step 4.08 s, 0.35 s
    calm) and `best` said "27.30× one device's samples/s, 1365% scaling efficiency" as a fact,
    and the dashboard in bold. A shared machine slows each trial by its own factor: the pair's
    ratio is said as such, with no efficiency, and a calm pair gives one again."""
    from sweeper.noise import Sample, pool

    hours = _hours(100)
    shared = Sample("trial", hours * PRICE, hours, 100.0, None, None, 0.05, contended=True,
                    contention="other processes used 1.9 of the 2 CPUs")  # fmt: skip
    store.record_estimates("scale", {0: (pool([shared]), [shared])})
    fast = best(store, "scale", Constraints(max_hours=3))
    rows = {s.trial_number: s for s in fast.scaling}
    assert rows[1].efficiency is None and rows[2].efficiency is None
    assert rows[2].single_trial_number == 0 and rows[2].single_samples_per_s == 100.0
    assert rows[2].text() == (
        "#2 on 2 devices (fsdp2): no scaling efficiency: #0 was measured only while the machine "
        "was shared (1.90× #0's samples/s on 1 device, a ratio of how busy the machine was, not "
        "of how the config scales); measure both again on a quiet machine"
    )
    assert rows[3].efficiency is None and "is not measured" in rows[3].note  # no twin: as before
    calm = Sample("rerun", hours * PRICE, hours, 100.0, None, None, 0.05)
    store.record_estimates("scale", {0: (pool([shared, calm]), [shared, calm])})
    again = {s.trial_number: s for s in best(store, "scale", Constraints(max_hours=3)).scaling}
    assert again[2].efficiency == pytest.approx(190 / (2 * 100)) and again[2].note == ""


def test_a_missing_twins_advice_is_a_route_the_study_takes(sqlite_url: str) -> None:
    """A walk followed "list 1 in search.devices and run it, e.g. `sweeper launch --study
    NAME`, or queue it from the API" down three refused routes (a changed list, the stored
    lists, a 422 "devices = 1 is not among search.devices [2]") with a literal NAME. The
    advice names the study; where 1 is listed the queue it names takes the twin (202), and
    where it is not, it says a study keeps its lists (and the queue refuses, as said)."""
    store = Store(sqlite_url)
    store.migrate()
    texts = {}
    for name, devices in (("both", "[1, 2]"), ("two", "[2]")):
        texts[name] = TINY_SPACE.read_text().replace(
            "search:\n", f"search:\n  devices: {devices}\n  data_parallel: [ddp]\n"
        )
        store.upsert_study(name, **(STUDY_FIELDS | {"space_yaml": texts[name]}))
        store.start_trial(name, 0, _config(4, 2, 2, "ddp"))
        store.finish_trial(name, 0, "complete", samples_per_s=150.0, it_per_s=1.0,
                           hours_per_run=3.0, cost_per_run_usd=15.0)  # fmt: skip
    notes = {name: best(store, name).scaling[0].note for name in texts}
    store.dispose()
    from sweeper.store.optuna import create_or_load_study, optuna_storage

    storage = optuna_storage(sqlite_url)
    try:
        for name in texts:  # as the studies' first launch made them
            create_or_load_study(name, storage, seed=0)
    finally:
        storage.engine.dispose()  # an unclosed connection is an error on Python 3.13
    assert "NAME" not in notes["both"] + notes["two"]
    assert "POST /api/studies/both/trials" in notes["both"], notes["both"]
    assert "`sweeper launch --study both`" in notes["both"]
    assert "search.devices [2] lists no 1, which a study keeps" in notes["two"], notes["two"]
    assert "(study: two-scaling)" in notes["two"]
    twin = {"config": _config(4, 2, 1) | {"data_parallel": None}}
    with TestClient(create_app(sqlite_url, api_token="secret")) as client:
        auth = {"Authorization": "Bearer secret"}
        queued = client.post("/api/studies/both/trials", json=twin, headers=auth)
        refused = client.post("/api/studies/two/trials", json=twin, headers=auth)
    assert queued.status_code == 202, queued.text
    assert refused.status_code == 422 and "devices" in refused.text, refused.text
