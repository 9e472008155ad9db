"""The offer table's rows and what they say against the user's limits: the types
``sweeper.offers`` fills (``OfferRow``, ``OfferTable``, ``CalibrationRecord``), whether a row
meets the constraints at both ends of its band (``meets``), and in the words the CLI's
"meets" column and the study page share (``standing``)."""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sweeper.cost import money
from sweeper.recommend import Constraints

Basis = Literal[
    "measured", "estimate", "predicted OOM", "needs a multi-GPU measurement", "no estimate"
]
# yes: at the figure and at its band's bad end; "within its band": at the figure only;
# "at its band's good end": not at the figure, only if the estimate is that much too slow;
# no: not even there (a measured row has no band: yes or no)
Meets = Literal["yes", "within its band", "at its band's good end", "no"]


class OfferRow(BaseModel):
    """One GPU offer for the job: measured or estimated hours and $ per run."""

    model_config = ConfigDict(frozen=True)

    gpu: str | None  # the catalog key; None for a measured machine the catalog does not know
    name: str
    count: int = 1
    usd_per_hour: float | None  # for all ``count`` GPUs
    basis: Basis
    study: str | None = None  # measured in, or estimated from
    trial_number: int | None = None
    config: dict[str, Any] | None = None
    samples_per_s: float | None = None
    hours_per_run: float | None = None
    cost_per_run_usd: float | None = None
    band: float | None = None  # an estimate's relative half-width (hours and $ alike)
    meets: Meets | None = None  # the constraints: at the figure, or only inside its band
    predicted_samples_per_s: float | None = None  # measured rows: the model's figure
    prediction_error: float | None = None  # predicted ÷ measured − 1
    scaling_efficiency: float | None = None  # measured N-device rows: against one device
    standing: str = ""  # ``meets`` in words, both ends of the band ("" without limits)
    # an estimate for a GPU a study did measure (another config, estimated cheaper there):
    # that study, whose row is the GPU's measured best
    gpu_measured_in: str | None = None
    note: str = ""


class CalibrationRecord(BaseModel):
    """A config measured on two GPU types: the prediction from one against the other."""

    model_config = ConfigDict(frozen=True)

    source_study: str
    source_gpu: str
    target_study: str
    target_gpu: str
    source_trial: int
    target_trial: int
    predicted_samples_per_s: float
    measured_samples_per_s: float
    error: float  # predicted ÷ measured − 1


class OfferTable(BaseModel):
    model_config = ConfigDict(frozen=True)

    catalog: str  # the file it priced from
    rows: list[OfferRow]  # cheapest first; rows without a price last
    cheapest: OfferRow | None  # the cheapest that meets the constraints (maybe an estimate)
    # when the cheapest is an estimate whose band overlaps other offers: which, and what to do
    caveat: str = ""
    band: float
    band_basis: str  # how the estimates' band was derived
    model: str  # what an estimate scales, in one line
    calibration: list[CalibrationRecord]


def meets_limits(hours: float, cost: float, band: float, constraints: Constraints) -> Meets:
    """Whether the constraints hold at the figure, and at either end of its band (a walk
    found the labels one-sided: an estimate 5% over the deadline with a ±17% band read "no",
    as one twice over it does).

    >>> c = Constraints(max_hours=24)
    >>> [meets_limits(h, 0.0, 0.17, c) for h in (20.0, 23.0, 25.0, 40.0)]
    ['yes', 'within its band', "at its band's good end", 'no']
    """

    def within(h: float, c: float) -> bool:
        return (constraints.max_hours is None or h <= constraints.max_hours) and (
            constraints.max_cost_usd is None or c <= constraints.max_cost_usd
        )

    if not within(hours, cost):
        good = max(0.0, 1 - band)
        return "at its band's good end" if band and within(hours * good, cost * good) else "no"
    return "yes" if within(hours * (1 + band), cost * (1 + band)) else "within its band"


UNPRICED = {
    "needs a multi-GPU measurement": "unknown until measured",
    "predicted OOM": "does not fit",
}


def standing(row: OfferRow, constraints: Constraints) -> tuple[str, str]:
    """(status, words) for one row against the constraints.

    >>> r = OfferRow(gpu="x", name="X", usd_per_hour=2, basis="estimate", hours_per_run=30,
    ...     cost_per_run_usd=60, band=0.25, meets="no")
    >>> standing(r, Constraints(max_hours=24, max_cost_usd=50))
    ('over', 'over 24 h and $50.00')
    >>> standing(r.model_copy(update={"meets": "within its band"}), Constraints(max_hours=31))
    ('band', 'meets at its figure; over 31 h at +25%')
    >>> good_end = r.model_copy(update={"meets": "at its band's good end"})
    >>> standing(good_end, Constraints(max_hours=24))
    ('over', 'over 24 h at its figure; meets at -25%')
    """
    hours, cost = row.hours_per_run, row.cost_per_run_usd
    if hours is None or cost is None or row.meets is None:
        return "unpriced", UNPRICED.get(row.basis, "not priced")
    if row.meets == "yes":
        return "meets", "meets"
    limits = []
    if row.meets == "within its band":
        hours, cost = hours * (1 + (row.band or 0.0)), cost * (1 + (row.band or 0.0))
    if constraints.max_hours is not None and hours > constraints.max_hours:
        limits.append(f"{constraints.max_hours:g} h")
    if constraints.max_cost_usd is not None and cost > constraints.max_cost_usd:
        limits.append(money(constraints.max_cost_usd))
    over = "over " + " and ".join(limits) if limits else f"does not meet {constraints.describe()}"
    if row.meets == "within its band":
        return "band", f"meets at its figure; {over} at +{row.band or 0:.0%}"
    if row.meets == "at its band's good end":
        return "over", f"{over} at its figure; meets at -{row.band or 0:.0%}"
    return "over", over


def shared_notes(table: OfferTable) -> dict[str, str]:
    """Note → mark, for each note that several rows share (before any GPU of the workload was
    measured, every GPU row has the same reason for having no estimate): said once, under the
    table, the rows marked "*", "**", ...

    >>> r = OfferRow(gpu="x", name="X", usd_per_hour=2, basis="no estimate", note="why")
    >>> shared_notes(OfferTable.model_construct(rows=[r, r.model_copy(update={"gpu": "y"})]))
    {'why': '*'}
    """
    counts = Counter(row.note for row in table.rows if row.note)
    shared = [note for note, times in counts.items() if times > 1]
    return {note: "*" * (i + 1) for i, note in enumerate(shared)}


def priced_gpus(table: OfferTable) -> list[OfferRow]:
    """The rows of catalog GPUs with a figure, measured or estimated."""
    return [r for r in table.rows if r.gpu is not None and r.cost_per_run_usd is not None]
