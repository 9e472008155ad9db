"""One job across machines: the studies that price the same workload (an H100, an A100, an RTX
4090, each at its own $/h) compared: the recommended option under the constraints, each study's
recommendation (``sweeper.recommend``), and the Pareto front of $ against hours per run.

Asked with ``offers=True``, it also prices the job on every GPU of the catalog
(``sweeper.offers``): measured where a study of the workload ran on it, else estimated
(``sweeper.predict``), with multi-GPU offers marked as needing a measurement."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from sweeper.catalog import load_catalog, parse_offer
from sweeper.errors import NoResultError, NothingMeetsError, SpaceError
from sweeper.knob_values import as_ran
from sweeper.offers import MeasuredStudy, OfferTable, offer_table
from sweeper.recommend import Candidate, Constraints, StudyFacts, decide
from sweeper.recommendation import Recommendation
from sweeper.store import Store, StudyRow, TrialMetrics


class ParetoPoint(BaseModel):
    """A config no other beats on both hours and $ per run."""

    model_config = ConfigDict(frozen=True)

    study: str
    hardware_name: str
    usd_per_hour: float
    trial_number: int
    config: dict[str, Any]
    hours_per_run: float
    cost_per_run_usd: float


class Comparison(BaseModel):
    """The same job on several machines: the recommended option, each study's recommendation,
    the front."""

    model_config = ConfigDict(frozen=True)

    workload_hash: str | None
    recommended: Recommendation | None = Field(
        description="the recommended option across the machines: of each study's "
        "recommendation, the lowest $/run. Each is its study's pick among the configs that tie "
        "with its cheapest within the noise (the baseline, else the lower peak memory: "
        "ties and pick_text say which), so a point of the Pareto front may read cheaper. "
        "None only when no measured config meets the constraints and the offer table names "
        "a catalog GPU (an estimate) that would: the table is then the answer"
    )
    fastest: ParetoPoint | None
    per_study: list[Recommendation]
    unavailable: dict[str, str]  # study → why it has no recommendation
    pareto: list[ParetoPoint]  # by hours, ascending (so by $, descending)
    constraints: str
    # every GPU offer, measured or estimated (asked with offers=True; sweeper.offers)
    offers: OfferTable | None = None

    @computed_field(  # type: ignore[prop-decorator]
        description="deprecated: the same as recommended, under its old name (it is the "
        "recommendation, whose tie pick may not be the cheapest point of the front); kept "
        "for clients written against it",
        json_schema_extra={"deprecated": True},
    )
    @property
    def cheapest(self) -> Recommendation | None:
        return self.recommended


def pareto_front(points: Iterable[ParetoPoint]) -> list[ParetoPoint]:
    """Points not dominated on (hours, $); equal points keep the first study/trial.

    >>> p = lambda n, h, c: ParetoPoint(study="s", hardware_name="h", usd_per_hour=1,
    ...     trial_number=n, config={}, hours_per_run=h, cost_per_run_usd=c)
    >>> [q.trial_number for q in pareto_front([p(0, 10, 5), p(1, 8, 6), p(2, 9, 7), p(3, 12, 4)])]
    [1, 0, 3]
    """
    ordered = sorted(
        points, key=lambda q: (q.hours_per_run, q.cost_per_run_usd, q.study, q.trial_number)
    )
    front: list[ParetoPoint] = []
    for point in ordered:
        if not front or point.cost_per_run_usd < front[-1].cost_per_run_usd:
            front.append(point)
    return front


def compare(
    store: Store,
    study: str,
    constraints: Constraints | None = None,
    *,
    loaded: Mapping[str, Sequence[TrialMetrics]] | None = None,
    offers: bool = False,
    catalog: str | Path | None = None,
    gpus: Sequence[str] | None = None,
) -> Comparison:
    """Every study pricing the same workload as ``study`` (e.g. H100, A100, RTX 4090 at their
    own prices): the recommended option under the constraints (the lowest $/run of the studies'
    recommendations) and the Pareto front of $ vs hours.

    ``constraints.usd_per_hour`` is ignored here: each machine keeps its own price.
    ``loaded``: trials a caller already has, by study name (only completed ones count); the
    other studies' trials are read from the store. ``offers``: add the table of every GPU
    offer (``sweeper.offers``) from ``catalog`` (a file; default the anchor space's
    ``hardware.catalog``, else the shipped one), for the catalog keys ``gpus`` (None: all).
    """
    constraints = constraints or Constraints()
    per_study_constraints = Constraints(
        max_hours=constraints.max_hours,
        max_cost_usd=constraints.max_cost_usd,
        min_memory_headroom=constraints.min_memory_headroom,
        allow_truncation=constraints.allow_truncation,
    )
    anchor = store.get_study(study)
    rows = same_workload(store, anchor)
    recommendations: list[Recommendation] = []
    unavailable: dict[str, str] = {}
    points: list[ParetoPoint] = []
    measured: list[MeasuredStudy] = []
    for row in rows:
        facts = StudyFacts.of(row)
        if loaded is not None and row.name in loaded:
            trials = loaded[row.name]
        else:
            trials = store.trial_metrics(row.name, states=["complete"])
        if offers:
            measured.append(_measured(row, facts, trials, per_study_constraints))
        try:
            recommendation, eligible = decide(facts, trials, per_study_constraints)
        except NoResultError as e:
            unavailable[row.name] = str(e)
            continue
        recommendations.append(recommendation)
        points += [
            ParetoPoint(
                study=row.name,
                hardware_name=row.hardware_name,
                usd_per_hour=row.usd_per_hour,
                trial_number=c.trial.number,
                config=as_ran(c.trial.config, c.trial.own_values),
                hours_per_run=c.hours,
                cost_per_run_usd=c.cost,
            )
            for c in eligible
        ]
    table = (
        _offer_table(store, anchor, measured, per_study_constraints, catalog, gpus)
        if offers
        else None
    )
    if not recommendations:
        offered = table.cheapest if table is not None else None
        if offered is not None:  # e.g. only an estimated faster GPU meets the deadline
            return Comparison(
                workload_hash=anchor.workload_hash,
                recommended=None,
                fastest=None,
                per_study=[],
                unavailable=unavailable,
                pareto=[],
                constraints=per_study_constraints.describe(),
                offers=table,
            )
        raise NothingMeetsError(  # no catalog offer meets either (else answered above)
            "no study of this workload has an eligible trial: "
            + "; ".join(f"{name}: {why}" for name, why in unavailable.items()),
            offers=table,  # the table still says how far each offer is from them
        )
    front = pareto_front(points)
    return Comparison(
        workload_hash=anchor.workload_hash,
        recommended=min(
            recommendations, key=lambda r: (r.cost_per_run_usd, r.hours_per_run or 0.0, r.study)
        ),
        fastest=front[0],
        per_study=recommendations,
        unavailable=unavailable,
        pareto=front,
        constraints=per_study_constraints.describe(),
        offers=table,
    )


@functools.lru_cache(maxsize=512)
def _space_hash(space_yaml: str) -> str | None:
    """The workload hash this version computes from a study's space (None: it does not parse
    here, e.g. written by a version with keys this one lacks)."""
    from sweeper.space import parse_space

    try:
        return parse_space(space_yaml).workload_hash()
    except SpaceError:
        return None


def same_workload(store: Store, anchor: StudyRow) -> list[StudyRow]:
    """The studies pricing ``anchor``'s job (``anchor`` among them), oldest first.

    Two studies price the same job when their workload hashes are equal, as stored or as this
    version computes them from their spaces: the hash covers every field of ``workload:``, so
    a field added since a study was recorded changes the stored hash of every study recorded
    after it (the shipped H100 study, recorded 2026-11-25, stores 4a7b2dbbd3e385e6; the same
    space read now hashes 34464af9cf94f4da). Without the second reading an H200 measured
    today would not meet the H100 study it was predicted from."""
    hashes = {anchor.workload_hash, _space_hash(anchor.space_yaml)} - {None}
    if not hashes:
        return [anchor]
    rows = [
        row
        for row in store.study_rows()
        if row.workload_hash in hashes or _space_hash(row.space_yaml) in hashes
    ]
    return rows or [anchor]


def _measured(
    row: StudyRow, facts: StudyFacts, trials: Sequence[TrialMetrics], constraints: Constraints
) -> MeasuredStudy:
    """A study as the offer table reads it: its recommendation under the constraints, and
    every config it may recommend (the truncation guard holds; deadlines are the target's)."""
    try:
        recommendation: Recommendation | None = decide(facts, trials, constraints)[0]
    except NoResultError:
        recommendation = None
    unconstrained = Constraints(allow_truncation=constraints.allow_truncation)
    try:
        candidates: list[Candidate] = decide(facts, trials, unconstrained)[1]
    except NoResultError:
        candidates = []
    return MeasuredStudy(
        name=row.name,
        hardware_name=row.hardware_name,
        usd_per_hour=row.usd_per_hour,
        recommendation=recommendation,
        candidates=sorted(candidates, key=lambda c: c.key),
        devices_listed=facts.listed.get("devices"),
    )


def _offer_table(
    store: Store,
    anchor: StudyRow,
    measured: Sequence[MeasuredStudy],
    constraints: Constraints,
    catalog: str | Path | None,
    gpus: Sequence[str] | None,
) -> OfferTable:
    compare_with: list[str] = []
    try:
        from sweeper.space import parse_space

        hardware = parse_space(anchor.space_yaml).hardware
        catalog = catalog or hardware.catalog
        compare_with = list(hardware.compare)
    except SpaceError:
        pass  # a study written by another version: the shipped catalog, no extra offers

    def measurement_of(study: str, number: int) -> Mapping[str, Any] | None:
        trial = store.get_trial(study, number)
        return None if trial is None else trial.measurement

    # a GPU asked as "N x key" (2x h100-sxm) is that offer beside the key's one-GPU row, as
    # the space's hardware.compare lists them: a walk could not ask 2x H100 against 4x A100
    keys: list[str] | None = None
    if gpus:
        keys = []
        for text in gpus:
            count, key = parse_offer(text)
            keys.append(key)
            if count > 1:
                compare_with.append(f"{count}x {key}")
    return offer_table(
        measured,
        anchor=anchor.name,
        catalog=load_catalog(catalog),
        measurement_of=measurement_of,
        constraints=dataclasses.replace(constraints, usd_per_hour=None),
        gpus=list(dict.fromkeys(keys)) if keys else None,  # none named: all
        offers=list(dict.fromkeys(compare_with)),
    )
