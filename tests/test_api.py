"""The REST API and pages on a real store (SQLite and Postgres) through FastAPI's TestClient."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from api.app import create_app
from sweeper.measurement import Measurement, sample_measurement
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS

# A space and a slash-free but URL-hostile name: clients must percent-encode it.
STUDY = "llama 1b@h100?#%"
STUDY_PATH = quote(STUDY, safe="")
PLAIN_STUDY = "plain"
STEP_TIMES_S = [0.51, 0.5, 0.52]


def add_study(store: Store, name: str, **overrides: object) -> None:
    fields = STUDY_FIELDS | {"dataset_stats": {"median_tokens": 412, "p90_tokens": 1530}}
    store.upsert_study(name, **(fields | overrides))


def add_complete(
    store: Store, study: str, number: int, config: dict, *, cost: float, it_per_s: float
) -> None:
    store.start_trial(study, number, config)
    samples_per_s = 1_800_000 / (cost / 2.5 * 3600)  # consistent with the price
    measurement = sample_measurement(
        it_per_s=it_per_s,
        samples_per_s=samples_per_s,
        rows_per_s=samples_per_s,
        tokens_per_s=samples_per_s * 400,
        padded_tokens_per_s=samples_per_s * 512,
        peak_memory_bytes=40 * 2**30,
        loss_first=10.4,
        loss_last=9.8,
        step_times_s=STEP_TIMES_S,
    )
    store.finish_trial(
        study,
        number,
        "complete",
        hours_per_run=cost / 2.5,
        cost_per_run_usd=cost,
        wall_s=31.5,
        measurement=measurement.model_dump(),
        **measurement.columns(),
    )


def config(attn: str, batch: int, accumulation: int) -> dict:
    return {
        "per_device_batch_size": batch,
        "gradient_accumulation_steps": accumulation,
        "attn_implementation": attn,
        "compile_mode": "none",
    }


def fill(url: str) -> str:
    """One study: three completed trials at different $/run, one failed, one still running."""
    store = Store(url)
    store.migrate()
    add_study(store, STUDY)
    add_complete(store, STUDY, 0, config("eager", 8, 1), cost=5.0, it_per_s=1.0)
    # Cheapest, but fewer optimizer steps per second (accumulation 4): it/s must not decide.
    add_complete(store, STUDY, 1, config("sdpa", 8, 4), cost=2.0, it_per_s=0.6)
    store.start_trial(STUDY, 2, config("flex_attention", 8, 1))
    store.finish_trial(
        STUDY,
        2,
        "failed",
        failure_kind="unsupported",
        failure_message="FlexAttention does not support backward on CPU",
    )
    add_complete(store, STUDY, 3, config("sdpa", 16, 1), cost=3.0, it_per_s=4.0)
    store.start_trial(STUDY, 4, config("sdpa", 32, 1))
    add_study(store, PLAIN_STUDY, state="finished")
    store.start_trial(PLAIN_STUDY, 0, config("eager", 8, 1))
    store.finish_trial(PLAIN_STUDY, 0, "failed", failure_kind="oom", failure_message="CUDA OOM")
    store.dispose()
    return url


@pytest.fixture
def client(storage_url: str) -> Iterator[TestClient]:
    """The API over the filled store, once on SQLite and once on Postgres."""
    with TestClient(create_app(fill(storage_url))) as test_client:
        yield test_client


@pytest.fixture
def page_client(sqlite_url: str) -> Iterator[TestClient]:
    """For what does not depend on the database backend: pages, static files, OpenAPI."""
    with TestClient(create_app(fill(sqlite_url))) as test_client:
        yield test_client


def test_list_studies_counts_trials_per_state(client: TestClient) -> None:
    response = client.get("/api/studies")
    assert response.status_code == 200
    studies = {study["name"]: study for study in response.json()}
    assert set(studies) == {STUDY, PLAIN_STUDY}
    study = studies[STUDY]
    assert study["trials"] == {"complete": 3, "failed": 1, "running": 1, "pruned": 0}
    assert study["best_cost_per_run_usd"] == pytest.approx(2.0)
    assert study["hardware_name"] == "H100 SXM 80GB"
    assert study["usd_per_hour"] == 2.5
    assert study["n_trials_planned"] == 8
    # Timestamps carry their UTC offset on both backends (SQLite drops it on storage).
    assert study["created_at"].endswith(("Z", "+00:00"))
    assert "space_yaml" not in study
    assert studies[PLAIN_STUDY]["best_cost_per_run_usd"] is None
    # finished with its one trial failed: no answer, whatever "finished" reads as
    assert studies[PLAIN_STUDY]["none_completed"] is True and study["none_completed"] is False
    overview = client.get("/").text
    row = overview.split(f'href="/studies/{PLAIN_STUDY}"', 1)[1].split("</tr>", 1)[0]
    assert 'class="state state-failed"' in row and "none: no trial completed" in row
    assert (
        "no trial completed"
        not in overview.split(f'href="/studies/{STUDY_PATH}"', 1)[1].split("</tr>", 1)[0]
    )

    detail = client.get(f"/api/studies/{STUDY_PATH}").json()
    assert {key: detail[key] for key in study} == study
    assert detail["space_yaml"] == STUDY_FIELDS["space_yaml"]
    assert detail["dataset_stats"] == {"median_tokens": 412, "p90_tokens": 1530}


def test_a_remeasure_in_progress_is_shown_where_no_trial_runs(
    client: TestClient, storage_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-measure runs no trial row: the study page said "0 running" while the machine
    measured a config again for a minute. The live worker's row says which."""
    store = Store(storage_url)
    try:
        store.register_worker(PLAIN_STUDY, "w-live", "host", 1)
        store.set_remeasuring("w-live", 0)
        (plain,) = [s for s in client.get("/api/studies").json() if s["name"] == PLAIN_STUDY]
        assert plain["remeasuring"] == [0] and plain["trials"]["running"] == 0
        assert client.get(f"/api/studies/{PLAIN_STUDY}").json()["remeasuring"] == [0]
        page = client.get(f"/studies/{PLAIN_STUDY}").text
        assert re.search(r"now measuring #0 again", page), page
        assert "+1 re-measure" in client.get("/").text
        # a worker that stopped beating (killed mid re-measure) is not measuring anything
        monkeypatch.setenv("SWEEPER_WORKER_GRACE_S", "1")
        from sqlalchemy import update

        from sweeper.store.models import WorkerRow

        with store.engine.begin() as connection:  # the column's type writes it (sqlite3's own
            # datetime adapter is deprecated on Python 3.12+)
            connection.execute(
                update(WorkerRow).values(heartbeat_at=datetime(2020, 1, 1, tzinfo=UTC))
            )
        assert client.get(f"/api/studies/{PLAIN_STUDY}").json()["remeasuring"] == []
        monkeypatch.delenv("SWEEPER_WORKER_GRACE_S")
        store.beat("w-live")
        store.set_remeasuring("w-live", None)
        assert client.get(f"/api/studies/{PLAIN_STUDY}").json()["remeasuring"] == []
        assert "now measuring" not in client.get(f"/studies/{PLAIN_STUDY}").text
        store.set_remeasuring("w-live", 0)
        store.end_worker("w-live")  # a worker that ends clears it
        assert client.get(f"/api/studies/{PLAIN_STUDY}").json()["remeasuring"] == []
    finally:
        store.dispose()


def test_a_cost_interval_wider_than_the_cost_is_not_shown_as_a_price(
    sqlite_url: str,
) -> None:
    """A ±130% interval reached below $0: the page printed "$2.00/run ±130.0%"."""
    store = Store(sqlite_url)
    store.migrate()
    add_study(store, "noisy")
    add_complete(store, "noisy", 0, config("sdpa", 8, 1), cost=2.0, it_per_s=1.0)
    with store.engine.begin() as connection:
        connection.execute(text("UPDATE sweeper_trials SET cost_ci95_rel = 1.3"))
    store.dispose()
    with TestClient(create_app(sqlite_url)) as page_client:
        page = page_client.get("/studies/noisy").text
    assert "per run, too noisy to price (±130%)" in page
    assert "$2.00/run (±130%, too noisy to price: measure it again on a calm machine)" in page
    assert "±130.0%" not in page


def test_trials_in_number_order_without_measurement(client: TestClient) -> None:
    trials = client.get(f"/api/studies/{STUDY_PATH}/trials").json()
    assert [t["number"] for t in trials] == [0, 1, 2, 3, 4]
    assert [t["state"] for t in trials] == ["complete", "complete", "failed", "complete", "running"]
    assert all("measurement" not in t for t in trials)
    first = trials[0]
    assert first["config"]["attn_implementation"] == "eager"
    assert first["cost_per_run_usd"] == pytest.approx(5.0)
    assert first["peak_memory_bytes"] == 40 * 2**30
    assert first["wall_s"] == pytest.approx(31.5)
    assert first["finished_at"] is not None
    assert trials[4]["finished_at"] is None and trials[4]["samples_per_s"] is None


def test_trial_filters(client: TestClient) -> None:
    url = f"/api/studies/{STUDY_PATH}/trials"

    def numbers(**params: str | int) -> list[int]:
        response = client.get(url, params=params)
        assert response.status_code == 200, response.text
        return [trial["number"] for trial in response.json()]

    assert numbers(after=2) == [3, 4]
    assert numbers(after=4) == []
    assert numbers(limit=2, offset=1) == [1, 2]
    assert numbers(after=0, state="complete") == [1, 3]
    assert client.get(url, params={"limit": 0}).status_code == 422

    failed = client.get(url, params={"state": "failed"}).json()
    assert [t["number"] for t in failed] == [2]
    assert failed[0]["failure_kind"] == "unsupported"
    assert "FlexAttention" in failed[0]["failure_message"]
    several = client.get(url, params=[("state", "failed"), ("state", "running")]).json()
    assert [t["number"] for t in several] == [2, 4]
    assert client.get(url, params={"state": "exploded"}).status_code == 422
    assert numbers(failure_kind="unsupported") == [2]


def test_a_misspelt_trial_filter_is_422_not_every_trial(client: TestClient) -> None:
    url = f"/api/studies/{STUDY_PATH}/trials"
    kind = client.get(url, params={"failure_kind": "ooom"})
    assert kind.status_code == 422, kind.text
    assert "'oom'" in kind.text and "'timeout'" in kind.text
    typo = client.get(url, params={"stat": "failed"})
    assert typo.status_code == 422, typo.text
    assert "unknown query parameter 'stat' (did you mean 'state'?)" in typo.text


def test_one_trial_includes_its_measurement(client: TestClient) -> None:
    trial = client.get(f"/api/studies/{STUDY_PATH}/trials/1").json()
    assert trial["number"] == 1
    assert trial["measurement"]["step_times_s"] == STEP_TIMES_S
    assert Measurement.model_validate(trial["measurement"]).it_per_s == 0.6
    missing = client.get(f"/api/studies/{STUDY_PATH}/trials/99")
    assert missing.status_code == 404
    assert "99" in missing.json()["detail"]


def test_best_is_the_cheapest_completed_trial_not_the_fastest_steps(client: TestClient) -> None:
    response = client.get(f"/api/studies/{STUDY_PATH}/best")
    assert response.status_code == 200
    best = response.json()
    # Trial 3 has the highest it/s (4.0) but costs $3.00/run; trial 1 costs $2.00.
    assert best["trial_number"] == 1
    assert best["cost_per_run_usd"] == pytest.approx(2.0)
    assert best["config"] == config("sdpa", 8, 4)
    assert best["completed_trials"] == 3
    assert best["study"] == STUDY
    assert best["usd_per_hour"] == 2.5


def test_trials_report_padding_per_config(client: TestClient) -> None:
    trials = client.get(f"/api/studies/{STUDY_PATH}/trials", params={"state": "complete"}).json()
    assert [t["padding_share"] for t in trials] == [pytest.approx(1 - 400 / 512)] * 3
    failed = client.get(f"/api/studies/{STUDY_PATH}/trials", params={"state": "failed"}).json()
    assert failed[0]["padding_share"] is None


def test_best_memory_headroom_and_compare(client: TestClient) -> None:
    # every trial peaks at 40 GiB of the H100's 79.2 GiB: half of it is free
    roomy = client.get(f"/api/studies/{STUDY_PATH}/best", params={"min_memory_headroom": 0.1})
    assert roomy.json()["memory_headroom"] == pytest.approx(1 - 40 * 2**30 / 85_029_158_912)
    too_roomy = client.get(f"/api/studies/{STUDY_PATH}/best", params={"min_memory_headroom": 0.6})
    assert too_roomy.status_code == 409
    assert "at least 60% memory headroom" in too_roomy.json()["detail"]
    bad = client.get(f"/api/studies/{STUDY_PATH}/best", params={"min_memory_headroom": 1.5})
    assert bad.status_code == 422
    # one study of its workload: the comparison is that study alone, and its front
    compared = client.get(f"/api/studies/{STUDY_PATH}/compare").json()
    assert compared["recommended"]["trial_number"] == 1
    assert compared["cheapest"] == compared["recommended"]  # its deprecated name
    schema = client.get("/openapi.json").json()["components"]["schemas"]
    assert schema["Comparison"]["properties"]["cheapest"]["deprecated"] is True
    # at one price, hours and dollars rank alike: the front is the cheapest trial alone
    assert [p["trial_number"] for p in compared["pareto"]] == [1]
    assert compared["unavailable"] == {}


def test_unknown_study_is_404_and_no_result_is_409(client: TestClient) -> None:
    for suffix in ("", "/trials", "/trials/0", "/best", "/compare"):
        response = client.get(f"/api/studies/no-such-study{suffix}")
        assert response.status_code == 404, suffix
        assert response.headers["content-type"] == "application/json"
        assert "no-such-study" in response.json()["detail"]

    response = client.get(f"/api/studies/{PLAIN_STUDY}/best")
    assert response.status_code == 409
    assert response.json()["detail"].startswith(f"study {PLAIN_STUDY!r} has no completed trial yet")


def test_fresh_database_serves_empty_lists(sqlite_url: str) -> None:
    with TestClient(create_app(sqlite_url)) as client:
        assert client.get("/api/studies").json() == []
        page = client.get("/")
        assert page.status_code == 200
        assert "No studies in this storage yet" in page.text


def test_broken_database_is_503_with_a_message(sqlite_url: str) -> None:
    with TestClient(create_app(sqlite_url)) as client:
        store: Store = client.app.state.store  # type: ignore[attr-defined]
        with store.engine.begin() as connection:
            connection.execute(text("DROP TABLE sweeper_trials"))
        response = client.get("/api/studies")
        assert response.status_code == 503
        detail = response.json()["detail"]
        assert "database failed or cannot be reached" in detail
        # neither the SQL, nor its parameters, nor where the database is
        assert not any(leak in detail for leak in ("SELECT", "[SQL", "sqlite:", "sweeper_"))


@pytest.mark.parametrize(
    "path",
    [
        f"/api/studies/{STUDY_PATH}/trials?after={2**31}",
        f"/api/studies/{STUDY_PATH}/trials?offset={2**40}",
        f"/api/studies/{STUDY_PATH}/trials/{2**31}",
        "/api/studies/a%00b",
        "/api/studies/a%00b/trials",
        f"/api/studies/{STUDY_PATH}/trials?failure_kind=o%00m",
        f"/api/studies/{STUDY_PATH}/trials?config=attn_implementation:sd%00pa",
        f"/api/studies/{STUDY_PATH}/best?usd_per_hour=Infinity",
        f"/api/studies/{STUDY_PATH}/best?max_hours=NaN",
        f"/studies/{STUDY_PATH}?page={2**31}",
    ],
)
def test_out_of_range_numbers_and_nul_bytes_are_422_on_both_databases(
    client: TestClient, path: str
) -> None:
    response = client.get(path)
    assert response.status_code == 422, response.text
    assert "Traceback" not in response.text and "[SQL" not in response.text


WRITE = {"Authorization": "Bearer secret", "content-type": "application/json"}


@pytest.fixture
def write_client(storage_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(fill(storage_url), api_token="secret")) as test_client:
        yield test_client


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999"])
def test_non_finite_numbers_in_a_body_are_422(write_client: TestClient, number: bytes) -> None:
    body = b'{"config": {"per_device_batch_size": %s, "gradient_accumulation_steps": 1}}' % number
    response = write_client.post(f"/api/studies/{STUDY_PATH}/trials", content=body, headers=WRITE)
    assert response.status_code == 422, response.text
    assert ["body", "config", "per_device_batch_size"] in [
        e["loc"] for e in response.json()["detail"]
    ]


def test_an_oversized_body_is_413_and_a_bad_one_is_not_echoed(write_client: TestClient) -> None:
    huge = b'{"config": "' + b"a" * 5_000_000 + b'"}'
    response = write_client.post(f"/api/studies/{STUDY_PATH}/trials", content=huge, headers=WRITE)
    assert response.status_code == 413 and len(response.content) < 200
    # under the limit but invalid: the 422 says where, without the input
    wrong = b'{"config": "' + b"b" * 500_000 + b'"}'
    response = write_client.post(f"/api/studies/{STUDY_PATH}/trials", content=wrong, headers=WRITE)
    assert response.status_code == 422 and len(response.content) < 2_000
    assert response.json()["detail"][0]["loc"] == ["body", "config"]


def test_openapi_lists_the_study_endpoints(page_client: TestClient) -> None:
    paths = page_client.get("/openapi.json").json()["paths"]
    for path in (
        "/api/studies",
        "/api/studies/{name}",
        "/api/studies/{name}/trials",
        "/api/studies/{name}/trials/{number}",
        "/api/studies/{name}/best",
    ):
        assert path in paths
    assert not any(path.startswith("/studies") or path == "/" for path in paths)


def test_plotly_js_is_served_from_the_installed_package(page_client: TestClient) -> None:
    response = page_client.get("/static/plotly.min.js")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/javascript")
    assert "max-age=31536000" in response.headers["cache-control"]
    assert len(response.content) > 1_000_000
    assert b"plotly" in response.content[:2000].lower()
    own = page_client.get("/static/study.js")
    assert own.status_code == 200 and "Plotly.react" in own.text
    assert page_client.get("/static/style.css").status_code == 200


def test_study_page_uses_local_plotly_only(page_client: TestClient) -> None:
    response = page_client.get(f"/studies/{STUDY_PATH}")
    assert response.status_code == 200
    html = response.text
    sources = re.findall(r'<script[^>]*\bsrc="([^"]*)"', html)
    assert any(src.startswith("/static/plotly.min.js") for src in sources)
    assert all(src.startswith("/static/") for src in sources), sources
    assert not any("cdn" in src.lower() or "https://" in src for src in sources)
    assert "script-src 'self'" in response.headers["content-security-policy"]


def test_study_page_shows_recommendation_and_trials(page_client: TestClient) -> None:
    html = page_client.get(f"/studies/{STUDY_PATH}").text
    assert "$2.00" in html  # the recommendation's $/run
    assert "FlexAttention does not support backward on CPU" in html
    assert "unsupported" in html
    assert 'id="chart-history"' in html and 'id="chart-throughput"' in html
    overview = page_client.get("/").text
    assert f'href="/studies/{STUDY_PATH}"' in overview
    # the overview's answer is the recommendation's (it put the cheapest single trial's $/run
    # in bold beside it, which a tie within the noise made another figure than `best`'s)
    assert "<strong>$2.00/run</strong>" in overview and "Cheapest<br>trial $/run" in overview
    assert "Best $/run" not in overview


def test_study_page_without_completed_trial_says_so(page_client: TestClient) -> None:
    html = page_client.get(f"/studies/{PLAIN_STUDY}").text
    assert "No completed trial yet." in html


def test_unknown_study_page_is_a_404_html_page(page_client: TestClient) -> None:
    response = page_client.get("/studies/no-such-study")
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("text/html")
    assert "no study named &#39;no-such-study&#39;" in response.text


def test_export_of_a_config_stored_without_a_required_knob_is_409_not_500(
    client: TestClient,
) -> None:
    # the fixture's configs predate max_seq_length, num_workers...: as an old study's would
    response = client.get(f"/api/studies/{STUDY_PATH}/export?format=trainer")
    assert response.status_code == 409, response.text
    assert "was stored without" in response.json()["detail"]
    assert client.get(f"/api/studies/{STUDY_PATH}/export?format=json").status_code == 200


def test_each_trial_says_which_measurements_its_figures_stand_on(storage_url: str) -> None:
    """REST's trials said "the metric fields then hold their pooled estimate" for a config
    measured several times, whichever ones counted: ``measured_as`` says it, and the winner's
    ``best`` too, on both databases."""
    from sweeper.noise import Sample, machine_noise, pool

    url = fill(storage_url)
    store = Store(url)
    # trial 1 (the cheapest): measured three times, once while the machine was shared
    runs = [
        Sample(kind, 2.0 * f, 0.8 * f, 250.0 / f, None, None, 0.02, contended=busy)  # type: ignore[arg-type]
        for kind, f, busy in (("trial", 1.0, False), ("rerun", 1.4, True), ("final", 1.02, False))
    ]
    store.record_estimates(STUDY, {1: (pool(runs, machine_noise([runs])), runs)})
    store.dispose()
    with TestClient(create_app(url)) as client:
        trials = {t["number"]: t for t in client.get(f"/api/studies/{STUDY_PATH}/trials").json()}
        best = client.get(f"/api/studies/{STUDY_PATH}/best").json()
        schema = client.get("/openapi.json").json()
    assert trials[1]["measured_as"] == (
        "mean of 2 measurements (1 more, taken on a shared machine, left out)"
    )
    assert trials[0]["measured_as"] == "1 measurement"
    assert trials[2]["measured_as"] is None  # failed: measured nothing
    assert best["trial_number"] == 1 and best["measured_as"] == trials[1]["measured_as"]
    assert (best["measurements"], best["measurements_left_out"]) == (3, 1)
    described = schema["components"]["schemas"]["TrialSummary"]["properties"]["measured_as"]
    assert "fastest of 4 measurements, all on a shared machine" in described["description"]
