"""The study page's table of GPU offers under the user's constraints: the form's query read
(max hours, max $ per run, GPU types), and each row marked against them. Data first: the
template renders what these return, and the answer itself is ``sweeper.compare.compare``'s,
the one the CLI (``best --across-hardware``) and REST (``/compare``) give.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sweeper.catalog import parse_offer
from sweeper.cost import hours_figure, money
from sweeper.errors import CatalogError
from sweeper.offers import OfferRow, OfferTable, priced_gpus, shared_notes, standing
from sweeper.recommend import Constraints


@dataclass(frozen=True, kw_only=True)
class GpuChoice:
    """One checkbox of the form: a GPU type of the study's catalog."""

    key: str
    name: str
    usd_per_hour: float | None
    checked: bool


@dataclass(frozen=True, kw_only=True)
class OfferQuery:
    """What the form asked, read from the page's query string.

    ``text``: each field as typed (re-shown in the form); ``errors``: field → what is wrong and
    how to fix it. ``gpus`` None: every GPU type of the catalog."""

    max_hours: float | None = None
    max_cost_usd: float | None = None
    gpus: tuple[str, ...] | None = None
    ticked: tuple[str, ...] = ()  # the GPU types asked that the catalog has (re-shown)
    several: tuple[str, ...] = ()  # the offers of N GPUs asked ("2x h100-sxm"), re-shown
    text: Mapping[str, str] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def asked(self) -> bool:
        """Whether the form narrowed the table at all."""
        return (self.max_hours, self.max_cost_usd, self.gpus) != (None, None, None)

    @property
    def constraints(self) -> Constraints:
        return Constraints(max_hours=self.max_hours, max_cost_usd=self.max_cost_usd)


LABELS = {
    "max_hours": ("max hours per run", "a number of hours, e.g. 24", "for no deadline"),
    "max_cost_usd": ("max $ per run", "a number of dollars, e.g. 60", "for no budget"),
}


def read_query(
    max_hours: str | None,
    max_cost_usd: str | None,
    gpus: Sequence[str] | None,
    catalog: Mapping[str, str],
    catalog_name: str,
) -> OfferQuery:
    """The form's fields, checked: each limit a positive finite number (empty: none), each GPU
    type a key of ``catalog`` (key → name; named ``catalog_name`` in the message), or an offer
    of N of them ("2x h100-sxm", as REST's ``gpus`` takes it; a field may hold several,
    comma-separated). Offers beside no ticked type: every type, and those offers.

    >>> q = read_query("24", " ", ["h100-sxm"], {"h100-sxm": "H100"}, "gpus.yaml")
    >>> q.max_hours, q.max_cost_usd, q.gpus, dict(q.errors)
    (24.0, None, ('h100-sxm',), {})
    >>> dict(read_query("-3", "abc", ["b200"], {"h100-sxm": "H100"}, "gpus.yaml").errors)["gpus"]
    "GPU type 'b200' is not in this study's catalog (gpus.yaml); it has h100-sxm"
    >>> q = read_query("", "", ["2x h100-sxm, 4×a100"], {"h100-sxm": "H", "a100": "A"}, "g")
    >>> q.gpus, q.ticked, q.several
    (('h100-sxm', 'a100', '2x h100-sxm', '4x a100'), (), ('2x h100-sxm', '4x a100'))
    """
    text = {"max_hours": (max_hours or "").strip(), "max_cost_usd": (max_cost_usd or "").strip()}
    errors: dict[str, str] = {}
    limits: dict[str, float | None] = {}
    for name, typed in text.items():
        limits[name] = None
        if not typed:
            continue
        label, example, empty = LABELS[name]
        fix = f"write {example} (or leave it empty {empty})"
        try:
            value = float(typed.removeprefix("$").replace(",", ""))
        except ValueError:
            errors[name] = f"{label}: {typed[:40]!r} is not a number; {fix}"
            continue
        if not math.isfinite(value) or value <= 0:
            what = "above 0" if math.isfinite(value) else "a finite number"
            errors[name] = f"{label}: {typed[:40]!r} is not {what}; {fix}"
            continue
        limits[name] = value
    asked = [part.strip() for g in gpus or () for part in g.split(",") if part.strip()]
    offers: dict[str, tuple[int, str]] = {}
    unknown = []
    for entry in dict.fromkeys(asked):
        try:
            count, key = parse_offer(entry.lower())
        except CatalogError:
            unknown.append(entry)
            continue
        if key not in catalog:
            unknown.append(entry)
        else:
            offers.setdefault(key if count == 1 else f"{count}x {key}", (count, key))
    ticked = tuple(key for key, (count, _) in offers.items() if count == 1)
    several = tuple(key for key, (count, _) in offers.items() if count > 1)
    wanted = list(ticked or (catalog if several else ())) + list(several)
    if unknown:
        errors["gpus"] = (
            f"GPU type{'s' if len(unknown) > 1 else ''} "
            + ", ".join(repr(g[:40]) for g in unknown[:5])
            + f" {'are' if len(unknown) > 1 else 'is'} not in this study's catalog "
            f"({catalog_name}); it has {', '.join(catalog)}"
        )
    return OfferQuery(
        max_hours=limits["max_hours"],
        max_cost_usd=limits["max_cost_usd"],
        gpus=tuple(wanted) if wanted and not unknown else None,
        ticked=ticked,
        several=several,
        text=text | {"gpus": ",".join(wanted), "several": ", ".join(several)},
        errors=errors,
    )


def gpu_choices(table: OfferTable, query: OfferQuery) -> list[GpuChoice]:
    """The catalog's GPU types as the unfiltered table lists them (every type has a one-GPU
    row there), ticked as asked: all when the query names none the catalog has."""
    chosen = set(query.ticked)
    seen: dict[str, GpuChoice] = {}
    for row in table.rows:
        if row.gpu is not None and row.count == 1 and row.gpu not in seen:
            seen[row.gpu] = GpuChoice(
                key=row.gpu,
                name=row.name,
                usd_per_hour=row.usd_per_hour,
                checked=not chosen or row.gpu in chosen,
            )
    return sorted(seen.values(), key=lambda c: c.name)


@dataclass(frozen=True, kw_only=True)
class MarkedRow:
    """A row of the table and how it stands against the constraints."""

    row: OfferRow
    status: str  # meets | band (meets at its figure, not at its band's bad end) | over | unpriced
    mark: str  # e.g. "over 24 h", "over $60.00", "meets"
    cheapest: bool  # the cheapest that meets: highlighted
    note: str  # the row's note, or the mark of a note several rows share (said under the table)


mark = standing  # the same words as the CLI's "meets" column (sweeper.offers.standing)


def marked_rows(table: OfferTable, constraints: Constraints) -> list[MarkedRow]:
    """Every row, marked, the cheapest that meets flagged, a shared note replaced by its mark."""
    rows = []
    shared = shared_notes(table)
    for row in table.rows:
        status, words = mark(row, constraints)
        rows.append(
            MarkedRow(
                row=row,
                status=status,
                mark=words,
                cheapest=row == table.cheapest,
                note=shared.get(row.note, row.note),
            )
        )
    return rows


def offer_text(row: OfferRow) -> str:
    """``L40S 48GB (estimate ±25%) $16.45/run, 16.6 h``: an offer in one line."""
    band = f" ±{row.band:.0%}" if row.band is not None else ""
    return (
        f"{row.name} ({row.basis}{band}) {money(row.cost_per_run_usd or 0.0)}/run, "
        f"{hours_figure(row.hours_per_run or 0.0)} h"
    )


def headline(table: OfferTable, constraints: Constraints, *, measured_meets: bool) -> list[str]:
    """The lines above the table: the cheapest that meets the constraints, or that nothing
    does (and the nearest offers, to say what to relax)."""
    said = constraints.describe()
    asked = said != "no constraint"
    cheapest = table.cheapest
    if cheapest is not None:
        lines = [
            f"Cheapest that meets {said}: {offer_text(cheapest)}."
            if asked
            else f"Cheapest: {offer_text(cheapest)}."
        ]
        if not measured_meets:
            lines.append(
                f"No measured config meets {said}: the answer is an estimate until a study "
                f"measures it on {cheapest.name} (a short sweep there)."
            )
        return lines
    if not priced_gpus(table):
        return ["No GPU of the catalog can be priced yet (the note under the table says why)."]
    priced = [r for r in table.rows if r.hours_per_run is not None and r.cost_per_run_usd]
    lines = [f"Nothing meets {said}: no GPU of the table, measured or estimated."]
    if priced:
        fastest = min(priced, key=lambda r: r.hours_per_run or 0.0)
        cheap = min(priced, key=lambda r: r.cost_per_run_usd or 0.0)
        lines.append(
            f"Fastest: {offer_text(fastest)}"
            + ("." if cheap is fastest else f"; cheapest: {offer_text(cheap)}.")
        )
    return lines
