"""A study written by a real sweep opens in optuna-dashboard, served from the same database.

The sweep tells Optuna $/run as the (minimized) objective and copies the measurement onto each
trial's user attributes; optuna-dashboard's own WSGI app, behind a real HTTP server, must show
those numbers exactly as our own tables hold them, and serve its UI for the storage.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx
import optuna
import pytest
from optuna_dashboard import wsgi

from sweeper.search import INFEASIBLE_KINDS
from sweeper.space import Space
from sweeper.store import Store, TrialRow
from sweeper.sweep.run import run_sweep
from tests.helpers import TINY_SPACE

# The baseline (trial 0) and one sampled config: enough for a best trial and two rows to compare.
N_TRIALS = 2
# Columns of our table that the sweep also copies onto the Optuna trial as user attributes.
SHARED_METRICS = (
    "it_per_s",
    "samples_per_s",
    "tokens_per_s",
    "data_wait_share",
    "peak_memory_bytes",
    "compile_s",
    "hours_per_run",
)
# Measurement fields every completed trial carries as user attributes (None where not measured).
MEASUREMENT_ATTRS = (
    *SHARED_METRICS,
    "startup_s",
    "checkpoint_save_s",
    "padding_share",
    "effective_batch",
)
# Our trial states and the names optuna-dashboard gives Optuna's.
DASHBOARD_STATE = {"complete": "Complete", "failed": "Fail"}


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one access-log line per request would only bury pytest's own output


@pytest.fixture(scope="module")
def swept_url(tmp_path_factory: pytest.TempPathFactory, tiny_space: Space, cache_dir: Path) -> str:
    """A SQLite database holding one real sweep of the tiny space."""
    url = f"sqlite:///{tmp_path_factory.mktemp('dashboard') / 'sweeper.db'}"
    report = run_sweep(
        tiny_space,
        storage_url=url,
        cache_dir=cache_dir,
        space_text=TINY_SPACE.read_text(),
        n_trials=N_TRIALS,
    )
    assert (report.completed, report.failed) == (N_TRIALS, 0), report
    return url


@pytest.fixture(scope="module")
def our_trials(swept_url: str, tiny_space: Space) -> dict[int, TrialRow]:
    """Our own table's rows of the sweep, by Optuna trial number."""
    store = Store(swept_url)
    try:
        return {row.number: row for row in store.list_trials(tiny_space.study)}
    finally:
        store.dispose()


@pytest.fixture(scope="module")
def dashboard(swept_url: str) -> Iterator[httpx.Client]:
    """optuna-dashboard's app for the sweep's database, on a real HTTP server on a free port."""
    # Built as `optuna-dashboard sqlite:///…` builds it (optuna_dashboard._storage_url), but
    # here, so that its engine can be disposed when the server stops.
    storage = optuna.storages.RDBStorage(
        swept_url, skip_compatibility_check=True, skip_table_creation=True
    )
    server: WSGIServer = make_server("127.0.0.1", 0, wsgi(storage), handler_class=_QuietHandler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.server_port}", timeout=30) as client:
            yield client
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        storage.engine.dispose()
    assert not thread.is_alive(), "the dashboard server did not stop"


def _get_json(client: httpx.Client, path: str) -> Any:
    response = client.get(path)
    assert response.status_code == 200, (path, response.text)
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def _study_id(client: httpx.Client, name: str) -> int:
    summaries = _get_json(client, "/api/studies")["study_summaries"]
    matching = [s for s in summaries if s["study_name"] == name]
    assert len(matching) == 1, summaries
    return matching[0]["study_id"]


def _study_detail(client: httpx.Client, name: str) -> dict[str, Any]:
    return _get_json(client, f"/api/studies/{_study_id(client, name)}?after=0")


def _attrs(trial: dict[str, Any]) -> dict[str, str]:
    """A dashboard trial's user attributes; the dashboard sends each value as a string."""
    return {attr["key"]: attr["value"] for attr in trial["user_attrs"]}


def _number_or_none(text: str) -> float | None:
    """Numbers are sent as ``str(value)``, None as the JSON ``null``."""
    return None if text == "null" else float(text)


def test_study_is_listed_minimizing_cost(dashboard: httpx.Client, tiny_space: Space) -> None:
    summaries = _get_json(dashboard, "/api/studies")["study_summaries"]
    ours = [s for s in summaries if s["study_name"] == tiny_space.study]
    assert len(ours) == 1, summaries
    assert ours[0]["directions"] == ["minimize"]
    assert ours[0]["is_preferential"] is False

    detail = _study_detail(dashboard, tiny_space.study)
    assert detail["name"] == tiny_space.study
    assert detail["directions"] == ["minimize"]


def test_trials_show_our_cost_and_measurement(
    dashboard: httpx.Client, our_trials: dict[int, TrialRow], tiny_space: Space
) -> None:
    detail = _study_detail(dashboard, tiny_space.study)
    trials = {trial["number"]: trial for trial in detail["trials"]}
    # every trial we measured is there; any other Optuna trial is a config the loop did not
    # run: proposed again (told its earlier $/run) or ruled out (told as infeasible)
    assert set(our_trials) <= set(trials)
    completed = [n for n, t in trials.items() if t["state"] == "Complete" and not t["constraints"]]
    measured = [n for n, r in our_trials.items() if r.state == "complete"]
    assert set(measured) <= set(completed) and len(measured) == N_TRIALS

    for number, trial in trials.items():
        attrs = _attrs(trial)
        row = our_trials.get(number)
        if row is None:
            assert attrs.get("skipped") or attrs.get("repeat_of"), trial
            continue
        infeasible = row.state == "failed" and row.failure_kind in INFEASIBLE_KINDS
        state = "Complete" if infeasible else DASHBOARD_STATE[row.state]
        assert trial["state"] == state, (trial, row.state)
        params = {p["name"]: p["param_external_value"] for p in trial["params"]}
        assert params, trial
        assert params == {name: str(row.config[name]) for name in params}
        if row.state == "failed":
            assert infeasible or "values" not in trial
            assert attrs["failure_kind"] == row.failure_kind
            continue

        assert row.cost_per_run_usd is not None and row.cost_per_run_usd > 0
        assert trial["values"] == [pytest.approx(row.cost_per_run_usd, rel=1e-12)]
        assert set(MEASUREMENT_ATTRS) <= set(attrs), sorted(attrs)
        for metric in SHARED_METRICS:
            ours = getattr(row, metric)
            shown = _number_or_none(attrs[metric])
            assert (shown is None) == (ours is None), (number, metric, shown, ours)
            if ours is not None:
                assert shown == pytest.approx(ours, rel=1e-12), (number, metric)
        for measured in ("it_per_s", "samples_per_s", "tokens_per_s", "hours_per_run"):
            value = _number_or_none(attrs[measured])
            assert value is not None and value > 0, (number, measured)
        config = row.config
        expected_batch = config["per_device_batch_size"] * config["gradient_accumulation_steps"]
        assert int(attrs["effective_batch"]) == expected_batch

    sortable = {a["key"]: a["sortable"] for a in detail["union_user_attrs"]}
    for column in ("it_per_s", "samples_per_s", "tokens_per_s", "hours_per_run"):
        assert sortable[column] is True, sortable


def test_best_trial_is_our_cheapest(
    dashboard: httpx.Client, our_trials: dict[int, TrialRow], tiny_space: Space
) -> None:
    detail = _study_detail(dashboard, tiny_space.study)
    complete = [r for r in our_trials.values() if r.state == "complete"]
    cheapest = min(complete, key=lambda r: r.cost_per_run_usd or float("inf"))
    assert [t["number"] for t in detail["best_trials"]] == [cheapest.number]
    assert detail["best_trials"][0]["values"] == [
        pytest.approx(cheapest.cost_per_run_usd, rel=1e-12)
    ]


def test_dashboard_ui_is_served(dashboard: httpx.Client, tiny_space: Space) -> None:
    page = dashboard.get("/", follow_redirects=True)
    assert page.status_code == 200
    assert page.url.path == "/dashboard"
    assert page.headers["content-type"].startswith("text/html")
    assert "<title>Optuna Dashboard</title>" in page.text
    assert '<script defer src="/static/bundle.js"></script>' in page.text

    bundle = dashboard.get("/static/bundle.js")
    assert bundle.status_code == 200
    assert len(bundle.content) > 100_000  # the real single-page app, not an error page

    # the study page also asks for parameter importances; they must compute on our trials
    study_id = _study_id(dashboard, tiny_space.study)
    importances = _get_json(dashboard, f"/api/studies/{study_id}/param_importances")
    assert len(importances["param_importances"]) == 1  # one objective: $/run
    names = {entry["name"] for entry in importances["param_importances"][0]}
    assert {"per_device_batch_size", "attn_implementation"} <= names, names
