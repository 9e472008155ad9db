"""REST writes (bearer token), importance, Pareto, catalog, trial filters, security headers,
CORS and offline docs — on a real store (SQLite and Postgres) through FastAPI's TestClient."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import optuna
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.cache import StudyCache
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config

TOKEN = "t0ken-for-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STUDY = "tiny"


@contextmanager
def optuna_storage(url: str) -> Iterator[optuna.storages.RDBStorage]:
    """Optuna's storage on ``url``, its connections closed afterwards."""
    storage = optuna.storages.RDBStorage(url)
    try:
        yield storage
    finally:
        storage.engine.dispose()


def _trial(store: Store, number: int, cost: float | None, **knobs: object) -> None:
    config = tiny_config(**knobs).model_dump()
    store.start_trial(STUDY, number, config)
    if cost is None:
        store.finish_trial(STUDY, number, "failed", failure_kind="oom", failure_message="OOM")
        return
    store.finish_trial(
        STUDY,
        number,
        "complete",
        cost_per_run_usd=cost,
        hours_per_run=cost / 0.1,
        samples_per_s=10 / cost,
        tokens_per_s=640 / cost,
        mfu=0.01 * number,
    )


def fill(url: str) -> str:
    """Study "tiny" with its real space file, an Optuna study, and six trials where attention
    decides the price and batch size barely matters."""
    with optuna_storage(url) as storage:
        optuna.create_study(study_name=STUDY, storage=storage, direction="minimize")
    store = Store(url)
    store.migrate()
    space_yaml = TINY_SPACE.read_text()
    store.upsert_study(STUDY, **(STUDY_FIELDS | {"space_yaml": space_yaml, "usd_per_hour": 0.1}))
    _trial(store, 0, 2.0, attn_implementation="eager", per_device_batch_size=2)
    _trial(store, 1, 1.0, attn_implementation="sdpa", per_device_batch_size=2)
    _trial(store, 2, 2.1, attn_implementation="eager", per_device_batch_size=4)
    _trial(store, 3, 1.05, attn_implementation="sdpa", per_device_batch_size=4)
    _trial(
        store,
        4,
        None,
        attn_implementation="eager",
        per_device_batch_size=4,
        gradient_accumulation_steps=1,
    )
    _trial(
        store,
        5,
        1.02,
        attn_implementation="sdpa",
        per_device_batch_size=2,
        gradient_accumulation_steps=1,
    )
    store.dispose()
    return url


@pytest.fixture
def client(storage_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(fill(storage_url), api_token=TOKEN)) as test_client:
        yield test_client


@pytest.fixture
def read_only(sqlite_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(fill(sqlite_url))) as test_client:
        yield test_client


def test_writes_need_the_token(client: TestClient) -> None:
    body = {
        "config": tiny_config(per_device_batch_size=4, gradient_accumulation_steps=1).model_dump()
    }
    for headers, status in (
        ({}, 401),
        ({"Authorization": "Bearer wrong-token-0123456789"}, 401),
        ({"Authorization": f"Basic {TOKEN}"}, 401),
    ):
        response = client.post(f"/api/studies/{STUDY}/stop", headers=headers)
        assert response.status_code == status, response.text
        assert response.headers["www-authenticate"] == "Bearer"
        assert (
            client.post(f"/api/studies/{STUDY}/trials", json=body, headers=headers).status_code
            == status
        )
        assert client.delete(f"/api/studies/{STUDY}", headers=headers).status_code == status
    assert client.get(f"/api/studies/{STUDY}").json()["state"] == "running"  # nothing changed


def test_a_server_without_token_is_read_only(read_only: TestClient) -> None:
    response = read_only.post(f"/api/studies/{STUDY}/stop", headers=AUTH)
    assert response.status_code == 403
    assert "SWEEPER_API_TOKEN" in response.json()["detail"]
    assert read_only.get(f"/api/studies/{STUDY}/trials").status_code == 200


def test_enqueue_queues_a_waiting_optuna_trial(client: TestClient, storage_url: str) -> None:
    new = tiny_config(
        per_device_batch_size=2, gradient_accumulation_steps=1, attn_implementation="eager"
    )
    response = client.post(
        f"/api/studies/{STUDY}/trials", json={"config": new.model_dump()}, headers=AUTH
    )
    assert response.status_code == 202, response.text
    assert response.json()["queued"]["attn_implementation"] == "eager"
    with optuna_storage(storage_url) as storage:
        waiting = optuna.load_study(study_name=STUDY, storage=storage).get_trials(
            states=[optuna.trial.TrialState.WAITING]
        )
    assert [t.system_attrs["fixed_params"] for t in waiting] == [response.json()["queued"]]
    assert "prefetch_factor" not in waiting[0].system_attrs["fixed_params"]  # no workers


def test_enqueue_refuses_configs_outside_the_space_or_measured(client: TestClient) -> None:
    outside = tiny_config(max_seq_length=4096).model_dump()
    response = client.post(f"/api/studies/{STUDY}/trials", json={"config": outside}, headers=AUTH)
    assert response.status_code == 422
    assert (
        "max_seq_length = 4096 is not among search.max_seq_length [64]" in response.json()["detail"]
    )
    measured = tiny_config(attn_implementation="sdpa", per_device_batch_size=2).model_dump()
    response = client.post(f"/api/studies/{STUDY}/trials", json={"config": measured}, headers=AUTH)
    assert response.status_code == 409
    assert "trial 1" in response.json()["detail"]
    typo = {"config": {**measured, "batch": 3}}
    assert client.post(f"/api/studies/{STUDY}/trials", json=typo, headers=AUTH).status_code == 422


def test_stop_then_delete(client: TestClient, storage_url: str) -> None:
    assert client.delete(f"/api/studies/{STUDY}", headers=AUTH).status_code == 409  # running
    response = client.post(f"/api/studies/{STUDY}/stop", headers=AUTH)
    assert response.status_code == 202
    assert client.get(f"/api/studies/{STUDY}").json()["state"] == "stopping"
    again = client.post(f"/api/studies/{STUDY}/stop", headers=AUTH)
    assert again.status_code == 409
    assert "stopping, not running" in again.json()["detail"]
    store = Store(storage_url)
    store.set_study_state(STUDY, "stopped")  # what the sweep does after its running trial
    store.dispose()
    assert client.delete(f"/api/studies/{STUDY}", headers=AUTH).status_code == 204
    assert client.get(f"/api/studies/{STUDY}").status_code == 404
    with optuna_storage(storage_url) as storage:
        assert STUDY not in optuna.get_all_study_names(storage=storage)
    assert client.delete("/api/studies/nope", headers=AUTH).status_code == 404


def test_trial_filters_sort_and_total(client: TestClient) -> None:
    response = client.get(
        f"/api/studies/{STUDY}/trials",
        params={"config": ["attn_implementation:sdpa"], "sort": "cost_per_run_usd", "limit": 2},
    )
    assert response.status_code == 200
    assert [t["number"] for t in response.json()] == [1, 5]
    assert response.headers["x-total-count"] == "3"
    response = client.get(
        f"/api/studies/{STUDY}/trials", params={"sort": "mfu", "descending": "true", "limit": 1}
    )
    assert response.json()[0]["number"] == 5
    failed = client.get(f"/api/studies/{STUDY}/trials", params={"failure_kind": "oom"}).json()
    assert [t["number"] for t in failed] == [4]
    for bad in ("batch:2", "per_device_batch_size:two", "nocolon"):
        response = client.get(f"/api/studies/{STUDY}/trials", params={"config": bad})
        assert response.status_code == 422
        assert bad in response.json()["detail"]
    assert client.get(f"/api/studies/{STUDY}/trials", params={"sort": "config"}).status_code == 422
    # integers past what a stored knob holds match no trial: never Postgres' "integer out of
    # range" (503) or SQLite's OverflowError (500); the largest 32-bit one is an ordinary value
    int_knobs = ("per_device_batch_size", "gradient_accumulation_steps", "max_seq_length")
    for knob in (*int_knobs, "num_workers", "prefetch_factor"):
        for value in (2**31 - 1, 2**31, 2**63, 10**30):
            response = client.get(
                f"/api/studies/{STUDY}/trials", params={"config": f"{knob}:{value}"}
            )
            assert response.status_code == 200, (knob, value, response.text)
            assert response.json() == [] and response.headers["x-total-count"] == "0"
    assert client.get(f"/api/studies/{STUDY}/trials").status_code == 200  # the next one too


def test_importance_names_the_knob_that_decides_the_price(client: TestClient) -> None:
    for evaluator in ("fanova", "ped_anova"):
        response = client.get(f"/api/studies/{STUDY}/importance", params={"evaluator": evaluator})
        assert response.status_code == 200, response.text
        ranked = response.json()
        assert ranked[0]["knob"] == "attn_implementation", ranked
        assert {r["knob"] for r in ranked} <= {
            "attn_implementation",
            "per_device_batch_size",
            "gradient_accumulation_steps",
        }
        assert sum(r["importance"] for r in ranked) == pytest.approx(1.0)
    by_speed = client.get(f"/api/studies/{STUDY}/importance", params={"target": "samples_per_s"})
    assert by_speed.json()[0]["knob"] == "attn_implementation"


def test_importance_needs_two_different_completed_trials(sqlite_url: str) -> None:
    store = Store(sqlite_url)
    store.migrate()
    store.upsert_study(STUDY, **(STUDY_FIELDS | {"space_yaml": TINY_SPACE.read_text()}))
    _trial(store, 0, 1.0)
    store.dispose()
    with TestClient(create_app(sqlite_url)) as client:
        response = client.get(f"/api/studies/{STUDY}/importance")
    assert response.status_code == 409
    assert "at least two" in response.json()["detail"]


def test_pareto_and_catalog(client: TestClient) -> None:
    pareto = client.get(f"/api/studies/{STUDY}/pareto")
    assert pareto.status_code == 200, pareto.text
    assert [p["trial_number"] for p in pareto.json()] == [1]  # one price: cheapest = fastest
    catalog = client.get("/api/catalog").json()
    assert {"H100 SXM", "A100", "RTX 4090"} <= {a["name"] for a in catalog["accelerators"]}
    assert catalog["hardware_in_use"] == [
        {
            "hardware_name": STUDY_FIELDS["hardware_name"],
            "device": "cuda",
            "usd_per_hour": 0.1,
            "studies": [STUDY],
        }
    ]


def test_every_response_carries_the_security_headers(read_only: TestClient) -> None:
    for path in ("/", f"/studies/{STUDY}", f"/api/studies/{STUDY}", "/docs", "/api/nope"):
        response = read_only.get(path)
        assert "script-src 'self'" in response.headers["content-security-policy"], path
        assert response.headers["x-content-type-options"] == "nosniff"
    assert (
        "access-control-allow-origin"
        not in read_only.get("/api/studies", headers={"Origin": "http://evil.example"}).headers
    )


def test_cors_allows_only_the_listed_origins(sqlite_url: str) -> None:
    app = create_app(fill(sqlite_url), cors_origins=["http://localhost:3000"])
    with TestClient(app) as client:
        ok = client.get("/api/studies", headers={"Origin": "http://localhost:3000"})
        assert ok.headers["access-control-allow-origin"] == "http://localhost:3000"
        other = client.get("/api/studies", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_docs_are_served_from_local_files(read_only: TestClient) -> None:
    page = read_only.get("/docs")
    assert page.status_code == 200
    assert not re.search(r"(src|href)=\"(https?:)?//", page.text)  # no CDN
    for asset in re.findall(r"(?:src|href)=\"(/static/[^\"]+)\"", page.text):
        assert read_only.get(asset).status_code == 200, asset
    assert "/static/swagger/swagger-ui-bundle.js" in page.text
    assert "/api/studies/{name}/importance" in read_only.get("/openapi.json").json()["paths"]


def test_cache_computes_once_for_concurrent_misses_and_keeps_one_value_per_slot(
    storage_url: str,
) -> None:
    store = Store(fill(storage_url))
    cache = StudyCache()
    calls: list[int] = []
    start = threading.Barrier(6)

    def compute() -> int:
        calls.append(1)
        time.sleep(0.3)  # long enough for every thread to miss while this one computes
        return len(store.list_trials(STUDY))

    def ask() -> int:
        start.wait()
        return cache.get(store, STUDY, "count", compute)

    try:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: ask(), range(6)))
        assert answers == [6] * 6 and len(calls) == 1
        assert cache.get(store, STUDY, "count", compute) == 6 and len(calls) == 1  # a hit
        _trial(store, 6, 3.0, attn_implementation="eager")  # a new version of the study
        assert cache.get(store, STUDY, "count", compute) == 7 and len(calls) == 2
        assert len(cache) == 1  # the new value replaced the old one
        cache.get(store, STUDY, "other", lambda: 0)
        assert len(cache) == 2
    finally:
        store.dispose()


def test_chart_json_is_encoded_once_and_served_gzipped_or_plain(client: TestClient) -> None:
    url = f"/studies/{STUDY}/figures.json"
    zipped = client.get(url, headers={"Accept-Encoding": "gzip"})
    plain = client.get(url, headers={"Accept-Encoding": "identity"})
    assert zipped.status_code == plain.status_code == 200
    assert zipped.headers["content-encoding"] == "gzip"
    assert "content-encoding" not in plain.headers
    # a cache between server and browser must keep the two apart
    assert zipped.headers["vary"] == plain.headers["vary"] == "Accept-Encoding"
    assert zipped.json() == plain.json()  # httpx decoded the gzip: the same charts
    assert set(plain.json()) == {"history", "throughput", "failures", "pareto", "parallel", "slice"}
    assert plain.headers["content-security-policy"]  # served through the app's middleware

    importance = client.get(f"/studies/{STUDY}/importance-figure.json").json()["importance"]
    (bars,) = importance["data"]
    assert bars["y"][-1] == "attn_implementation"  # the largest share is drawn on top
