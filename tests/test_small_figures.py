"""A small job's figures (a CPU study's run costs fractions of a cent and takes minutes): the
limits the user gives and the figures a refusal quotes never round to the same text when they
differ, and a price or limit of 0 is refused by the CLI as REST refuses it (422)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sweeper.errors import NoResultError
from sweeper.recommend import Constraints, best
from sweeper.store import Store
from tests.helpers import STUDY_FIELDS, run_sweeper, tiny_config


@pytest.fixture
def small(sqlite_url: str) -> Iterator[Store]:
    store = Store(sqlite_url)
    store.migrate()
    store.upsert_study("small", **(STUDY_FIELDS | {"usd_per_hour": 0.10}))
    for number, (hours, cost) in enumerate([(0.028, 0.0706), (0.031, 0.0031)]):
        config = tiny_config(per_device_batch_size=2 + 2 * number).model_dump()
        store.start_trial("small", number, config)
        store.finish_trial("small", number, "complete", samples_per_s=10.0, it_per_s=1.0,
                           hours_per_run=hours, cost_per_run_usd=cost)  # fmt: skip
    yield store
    store.dispose()


def test_a_refusal_quotes_the_users_limit_and_distinct_figures(small: Store) -> None:
    # re-priced at $2.50/h the runs cost $0.070 and $0.0775: at most $0.0695 was once
    # "at most $0.07 ... the cheapest costs $0.07", and the fastest "0.0 h"
    with pytest.raises(NoResultError) as refused:
        best(small, "small", Constraints(usd_per_hour=2.5, max_cost_usd=0.0695))
    said = str(refused.value)
    assert "meets at most $0.0695 at $2.50/h" in said, said
    assert "the fastest takes 0.028 h" in said and "the cheapest costs $0.07" in said, said
    with pytest.raises(NoResultError, match=r"at most \$0\.0001 .* the cheapest costs \$0\.0028"):
        best(small, "small", Constraints(max_cost_usd=0.0001))


@pytest.mark.parametrize(
    ("option", "value"),
    [("--usd-per-hour", "0"), ("--max-hours", "-1"), ("--max-cost", "nan"), ("--max-cost", "0")],
)
def test_the_cli_refuses_a_price_or_limit_that_is_not_above_zero(
    small: Store, option: str, value: str
) -> None:
    ran = run_sweeper("best", "--study", "small", "--storage", small.url, option, value)
    assert ran.returncode == 2, ran.stdout + ran.stderr
    example = {"--usd-per-hour": "2.50", "--max-hours": "24", "--max-cost": "60"}[option]
    said = " ".join(ran.stderr.split())
    assert f"{value} is not a number above 0; give e.g. {example}" in said
    assert "Traceback" not in ran.stderr


def test_rest_takes_max_cost_and_refuses_a_query_it_does_not_know(small: Store) -> None:
    """The REST query takes ``max_cost`` (the CLI's name, as issue 35 names it) beside
    ``max_cost_usd``; a parameter the route does not take is a 422 naming the near one, not a
    silent unconstrained answer."""
    from fastapi.testclient import TestClient

    from api.app import create_app

    with TestClient(create_app(small.url)) as client:
        limited = client.get("/api/studies/small/best?max_cost=0.003")
        assert limited.status_code == 200, limited.text
        assert limited.json()["constraints"] == "at most $0.003"
        cents = client.get("/api/studies/small/best?max_cost=17").json()
        assert cents["constraints"] == "at most $17.00"
        same = client.get("/api/studies/small/best?max_cost_usd=0.003").json()
        assert same["trial_number"] == limited.json()["trial_number"] == 0
        typo = client.get("/api/studies/small/best?max_costs=0.003")
        assert typo.status_code == 422, typo.text
        assert "unknown query parameter 'max_costs' (did you mean 'max_cost'?)" in typo.text
        both = client.get("/api/studies/small/best?max_cost=1&max_cost_usd=2")
        assert both.status_code == 422 and "give one of them" in both.text
        # a route's own parameters beside the constraints are known: compare's gpus
        compared = client.get("/api/studies/small/compare?gpus=h100-sxm&max_cost=50")
        assert "unknown query parameter" not in compared.text, compared.text
        assert (
            "unknown query parameter 'gpu'"
            in client.get("/api/studies/small/compare?gpu=h100-sxm").text
        )
