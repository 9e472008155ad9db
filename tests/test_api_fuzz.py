"""Schemathesis against /openapi.json, on a filled store (SQLite and Postgres): whatever a
client sends, the API answers with a 4xx and a short message, never a 5xx."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.generation import GenerationMode

from api.app import create_app
from tests.test_api import STUDY, STUDY_PATH, fill

TOKEN = "fuzz-token"


@pytest.fixture(params=["sqlite", "postgres"])
def fuzzed_app(request: pytest.FixtureRequest) -> Iterator[FastAPI]:
    if request.param == "postgres":
        request.applymarker(pytest.mark.postgres)
    url = request.getfixturevalue(f"{request.param}_url")
    app = create_app(fill(url), api_token=TOKEN)
    yield app
    app.state.store.dispose()


def test_no_request_gets_a_server_error(fuzzed_app: FastAPI) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app)
    failures: list[str] = []
    calls: list[int] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10  # every route is in the schema

    for operation in operations:
        # valid and invalid requests (schemathesis's positive and negative modes), to a
        # random study name and to the filled study, so that they reach the database
        known = {"name": STUDY} if "{name}" in operation.path else None
        modes = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        strategies = [operation.as_strategy(mode) for mode in modes]
        if known:
            strategies += [operation.as_strategy(m, path_parameters=known) for m in modes]

        @given(case=st.one_of(strategies))
        @settings(
            max_examples=60,  # per operation: well under a minute per database
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,  # the same requests every run: a failure reproduces
            database=None,
        )
        def check(case: schemathesis.Case) -> None:
            response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})
            calls.append(response.status_code)
            where = f"{case.method} {case.formatted_path} {case.query or ''}"
            if response.status_code >= 500:
                failures.append(f"{where}: {response.status_code} {response.text[:300]}")
            for leak in ("[SQL", "sqlite:", "postgresql", "Traceback"):
                if leak in response.text:
                    failures.append(f"{where}: the body shows {leak!r}")

        check()
    assert len(calls) >= 10 * len(operations)
    assert failures == [], "\n".join(failures[:20])


def test_no_config_filter_value_gets_a_server_error(fuzzed_app: FastAPI) -> None:
    """``config=KNOB:VALUE`` is one free string to the schema, so schemathesis seldom writes a
    knob's name before the colon: here every knob gets any integer (past 64 bits included),
    float spelling or text, alone and combined."""
    from fastapi.testclient import TestClient

    from sweeper.knobs import KNOBS

    values = st.one_of(
        st.integers().map(str),
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.sampled_from(["true", "false", "null", "inf", "-inf", "nan", "1e400", "-0", ""]),
        st.text(max_size=12),
    )
    item = st.tuples(st.sampled_from([k.name for k in KNOBS]), values).map(":".join)
    failures: list[str] = []
    client = TestClient(fuzzed_app)

    @given(items=st.lists(item, min_size=1, max_size=3))
    @settings(
        max_examples=150,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def check(items: list[str]) -> None:
        response = client.get(f"/api/studies/{STUDY_PATH}/trials", params={"config": items})
        if response.status_code >= 500 or response.status_code not in (200, 422):
            failures.append(f"{items}: {response.status_code} {response.text[:200]}")

    check()
    assert failures == [], "\n".join(failures[:20])
