"""One job on every GPU offer: hours and $ per run, measured or estimated (said which), and the
cheapest that meets the constraints — the table ``best --across-hardware`` ends with.

Rows, for the GPU types asked (all of the catalog's by default) and the space's
``hardware.compare`` offers:

- **measured**: a study of the same workload ran on that GPU (its recommendation, at its
  study's price); where the study it is compared from measured the same config, the row also
  shows what the model predicted for it, and the pair is a calibration record. A study with
  trials on N devices gives a measured ``N× GPU`` row too (its cheapest config on N devices,
  priced N × the device's $/h, with its scaling efficiency against one device);
- **estimate**: no study measured it; ``sweeper.predict`` scales the recommended config and the
  runners-up measured on a catalog GPU (``RUNNERS_UP``) and keeps the cheapest that fits in
  memory, at the catalog's price, with the error band (``predict.error_band``);
- **predicted OOM**: no measured config fits in the GPU's memory;
- **needs a multi-GPU measurement**: N GPUs (``4x a100-40gb``) no study measured on N devices
  of that GPU; it is not priced, as no scaling is assumed (interconnects differ, and a measured
  efficiency on another GPU does not carry over): the row says the scaling efficiency it would
  need to beat the cheapest option and to meet the deadline, and the efficiency measured at N
  on another GPU where there is one;
- **no estimate**: nothing measured on a GPU to scale from (e.g. a study run on a CPU).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper import predict
from sweeper.catalog import SHIPPED, Catalog, Gpu, parse_offer
from sweeper.cost import device_count, hours_figure, money
from sweeper.knob_values import as_ran
from sweeper.knobs import normalize
from sweeper.offer_rows import (  # the rows' types and words, re-exported here
    UNPRICED,
    Basis,
    CalibrationRecord,
    Meets,
    OfferRow,
    OfferTable,
    meets_limits,
    priced_gpus,
    shared_notes,
    standing,
)
from sweeper.recommend import Candidate, Constraints
from sweeper.recommendation import Recommendation
from sweeper.scaling import Scaling, scaling_of

__all__ = [
    "UNPRICED",
    "Basis",
    "CalibrationRecord",
    "MeasuredStudy",
    "Meets",
    "OfferRow",
    "OfferTable",
    "offer_table",
    "priced_gpus",
    "shared_notes",
    "standing",
]

RUNNERS_UP = 5  # configs scaled per GPU type: the recommended one and the next cheapest


@dataclass(frozen=True, kw_only=True)
class MeasuredStudy:
    """A study of the workload, as the table needs it."""

    name: str
    hardware_name: str
    usd_per_hour: float
    recommendation: Recommendation | None  # under the constraints; None: none meets them
    candidates: Sequence[Candidate]  # its non-truncating completed trials, cheapest first
    devices_listed: Sequence[int] | None = None  # its search.devices (None: not known)


_NOT_ASKED = (
    "the named study's own machine ({study}), shown as the measured reference though not among "
    "the GPUs asked"
)

MeasurementOf = Callable[[str, int], Mapping[str, Any] | None]

MODEL = (
    "each estimate scales a measured step: matmul time by the ratio of dense peaks, the rest of "
    f"the GPU's time by memory bandwidth, host (data) time kept; matmuls at "
    f"{predict.MATMUL_EFFICIENCY:.0%} of peak; same host, disk and start-up as measured"
)


def offer_table(
    studies: Sequence[MeasuredStudy],
    *,
    anchor: str,
    catalog: Catalog,
    measurement_of: MeasurementOf,
    constraints: Constraints,
    gpus: Iterable[str] | None = None,
    offers: Iterable[str] = (),
) -> OfferTable:
    """The table for the studies of one workload, priced from ``anchor`` where it can.

    ``gpus``: the catalog keys to show (None: all); ``offers``: ``[N x] key`` entries (the
    space's ``hardware.compare``) added to them. Raises CatalogError for a key the catalog
    lacks."""
    wanted = _wanted(catalog, gpus, offers)
    measured = {s.name: _gpu_of(catalog, s) for s in studies}
    sources = [s for s in studies if measured[s.name] is not None and s.candidates]
    sources.sort(key=lambda s: (s.name != anchor, s.name))  # the anchor first: ties go to it
    records = _calibration(sources, measured, catalog, measurement_of)
    band = predict.error_band([r.error for r in records])
    if records:  # which GPUs it was learnt on: it is printed on every estimate
        pairs = sorted({" and ".join(sorted((r.source_gpu, r.target_gpu))) for r in records})
        band = predict.Band(
            rel=band.rel,
            records=band.records,
            basis=f"{band.basis}; measured on {', '.join(pairs)} only (each config both ways)",
        )
    rows: list[OfferRow] = []
    measured_keys: set[tuple[str, int]] = set()
    scalings: dict[str, list[Scaling]] = {}
    for study in studies:
        key = measured[study.name]
        ran_on = sorted({device_count(c.trial.config) for c in study.candidates}) or [1]
        if key is not None:
            measured_keys.update((key, n) for n in ran_on)
            scalings[key] = scaling_of(
                (c.trial for c in study.candidates), study.name, study.devices_listed
            )
        if study.name == anchor or (key is not None and key in wanted):
            for n in ran_on:
                row = _measured_row(study, key, catalog, records, constraints, n)
                if key is not None and n not in wanted.get(key, ()):
                    row = row.model_copy(  # a walk read it as an answer to its --gpu list
                        update={
                            "note": "; ".join(
                                x for x in (_NOT_ASKED.format(study=study.name), row.note) if x
                            )
                        }
                    )
                rows.append(row)
    rows = _one_row_per_gpu(rows, anchor)
    why_not = (
        "nothing of this workload was measured on a GPU of the catalog: measure it on one "
        "(a study of the same workload), then every other is estimated from it"
    )
    cheaper_here: list[OfferRow] = []
    for i, row in enumerate(rows):
        rows[i], found = _cheaper_elsewhere(
            row, sources, measured, catalog, measurement_of, constraints, band
        )
        cheaper_here += found
    singles: dict[str, OfferRow] = {r.gpu: r for r in rows if r.gpu is not None and r.count == 1}
    rows += cheaper_here  # after singles: an N-GPU row scales the GPU's measured figure
    for key, counts in wanted.items():
        if 1 in counts and (key, 1) not in measured_keys:
            row = (
                _estimate_row(sources, measured, key, catalog, measurement_of, constraints, band)
                if sources
                else _row_without(key, catalog, "no estimate", why_not)
            )
            rows.append(row)
            singles[key] = row
        elif key not in singles and sources:
            singles[key] = _estimate_row(
                sources, measured, key, catalog, measurement_of, constraints, band
            )
    cheapest = _cheapest(rows)
    for key, counts in wanted.items():
        for count in sorted(c for c in counts if c > 1 and (key, c) not in measured_keys):
            seen = [s for k, found in scalings.items() for s in found if s.devices == count]
            row = _multi_row(key, count, catalog, singles.get(key), cheapest, constraints)
            rows.append(_with_seen_scaling(row, seen, catalog, scalings))
    rows.sort(key=_order)
    rows = [r.model_copy(update={"standing": standing(r, constraints)[1]}) for r in rows]
    cheapest = _cheapest(rows)  # the same offer (an N-GPU row has no price), as it now reads
    return OfferTable(
        catalog="sweeper/gpus.yaml (shipped)" if catalog.path == str(SHIPPED) else catalog.path,
        rows=rows,
        cheapest=cheapest,
        caveat=_too_close(cheapest, rows),
        band=band.rel,
        band_basis=band.basis,
        model=MODEL,
        calibration=records,
    )


def _wanted(
    catalog: Catalog, gpus: Iterable[str] | None, offers: Iterable[str]
) -> dict[str, set[int]]:
    """catalog key → the GPU counts to show."""
    wanted: dict[str, set[int]] = {}
    for key in catalog.gpus if gpus is None else gpus:
        catalog.get(key)
        wanted.setdefault(key, set()).add(1)
    for text in offers:
        count, key = parse_offer(text)
        catalog.get(key, where=f"hardware.compare entry {text!r}: GPU type")
        if gpus is None or key in wanted:
            wanted.setdefault(key, set()).add(count)
    return wanted


def _gpu_of(catalog: Catalog, study: MeasuredStudy) -> str | None:
    """The catalog GPU a study measured on (its trials' device), or None (a CPU, or a GPU
    the catalog does not know)."""
    devices = [c.trial.device_name for c in study.candidates if c.trial.device_name]
    found = catalog.find(devices[0]) if devices else None
    return None if found is None else found[0]


def _observed(
    study: MeasuredStudy, candidate: Candidate, measurement_of: MeasurementOf
) -> predict.Observed:
    measurement = measurement_of(study.name, candidate.trial.number)
    if not measurement:
        raise predict.Unpredictable(f"trial #{candidate.trial.number} has no measurement stored")
    # the precision it ran (a script's own bf16, not the asked fp32) sets the peak it scales by
    ran = as_ran(candidate.trial.config, candidate.trial.own_values)
    return predict.Observed.of(measurement, ran, candidate.trial.projection)


def _calibration(
    sources: Sequence[MeasuredStudy],
    measured: Mapping[str, str | None],
    catalog: Catalog,
    measurement_of: MeasurementOf,
) -> list[CalibrationRecord]:
    """Every config two studies on different GPU types both measured, predicted from one;
    once per GPU pair and config, however many studies hold it (a study imported twice under
    two names doubled a walk's records, and the band's count with them)."""
    records = []
    seen: set[tuple[str, str, str]] = set()
    for source in sources:
        for target in sources:
            src_key, tgt_key = measured[source.name], measured[target.name]
            if src_key is None or tgt_key is None or src_key == tgt_key:
                continue
            theirs = {_key(c.trial.config): c for c in _one_device(target.candidates)}
            for candidate in _one_device(source.candidates):
                config_key = _key(candidate.trial.config)
                other = theirs.get(config_key)
                if other is None or not other.trial.samples_per_s:
                    continue
                if (src_key, tgt_key, config_key) in seen:
                    continue
                seen.add((src_key, tgt_key, config_key))
                try:
                    observed = _observed(source, candidate, measurement_of)
                    guess = predict.predict(
                        observed, catalog.gpus[src_key], catalog.gpus[tgt_key], band=0.0
                    )
                except predict.Unpredictable:
                    continue
                records.append(
                    CalibrationRecord(
                        source_study=source.name,
                        source_gpu=src_key,
                        target_study=target.name,
                        target_gpu=tgt_key,
                        source_trial=candidate.trial.number,
                        target_trial=other.trial.number,
                        predicted_samples_per_s=guess.samples_per_s,
                        measured_samples_per_s=other.trial.samples_per_s,
                        error=guess.samples_per_s / other.trial.samples_per_s - 1,
                    )
                )
    return records


def _predicted_elsewhere(study: str, records: Sequence[CalibrationRecord]) -> list[str]:
    """For a study whose shown config no other GPU measured: each source study's predictions
    of the configs both measured, against this study's measurement (the H200 study's pick was
    measured there alone; its six configs predicted from the H100 came within 15%)."""
    by_source: dict[tuple[str, str], list[CalibrationRecord]] = {}
    for r in records:
        if r.target_study == study:
            by_source.setdefault((r.source_study, r.source_gpu), []).append(r)
    notes = []
    for (source, gpu), mine in sorted(by_source.items()):
        worst = max(mine, key=lambda r: abs(r.error))
        mean = sum(abs(r.error) for r in mine) / len(mine)
        configs = "config" if len(mine) == 1 else "configs"
        notes.append(
            f"predicted from {source} ({gpu}) for {len(mine)} {configs} measured on both "
            f"(not this one): mean |error| {mean:.1%}, worst {worst.error:+.1%} "
            f"(#{worst.target_trial})"
        )
    return notes


def _key(config: Mapping[str, Any]) -> str:
    return repr(sorted(normalize(config).items(), key=lambda item: item[0]))


def _one_device(candidates: Iterable[Candidate]) -> list[Candidate]:
    """The candidates that ran on one device: what the one-GPU model scales."""
    return [c for c in candidates if device_count(c.trial.config) == 1]


def _chosen(
    study: MeasuredStudy, constraints: Constraints, count: int
) -> tuple[Candidate | None, Meets]:
    """The cheapest of ``study``'s configs on ``count`` devices that meets the constraints,
    else its cheapest on ``count`` devices (which does not)."""
    on_n = [c for c in study.candidates if device_count(c.trial.config) == count]
    floor = constraints.min_memory_headroom
    meeting = [
        c
        for c in on_n
        if meets_limits(c.hours, c.cost, 0.0, constraints) == "yes"
        and (floor is None or (c.headroom is not None and c.headroom >= floor))
    ]
    if meeting:
        return min(meeting, key=lambda c: c.key), "yes"
    return (min(on_n, key=lambda c: c.key), "no") if on_n else (None, "no")


def _measured_row(
    study: MeasuredStudy,
    key: str | None,
    catalog: Catalog,
    records: Sequence[CalibrationRecord],
    constraints: Constraints,
    count: int = 1,
) -> OfferRow:
    rec = study.recommendation
    figures: dict[str, Any] = {}
    meets: Meets = "yes"
    device = rec.measured_on if rec is not None else None
    if rec is not None and rec.devices == count:
        figures = {
            "trial_number": rec.trial_number,
            "config": rec.config,
            "samples_per_s": rec.samples_per_s,
            "hours_per_run": rec.hours_per_run,
            "cost_per_run_usd": rec.cost_per_run_usd,
        }
    else:  # the study's recommendation runs on another count: its cheapest on ``count``
        chosen, meets = _chosen(study, constraints, count)
        if chosen is not None:
            device = chosen.trial.device_name
            figures = {
                "trial_number": chosen.trial.number,
                "config": as_ran(chosen.trial.config, chosen.trial.own_values),
                "samples_per_s": chosen.trial.samples_per_s,
                "hours_per_run": chosen.hours,
                "cost_per_run_usd": chosen.cost,
            }
    notes = []
    if key is None and device:
        notes.append(
            f"measured on {device}, not a GPU of the catalog: the hours are that machine's"
        )
    own = next(
        (
            r
            for r in records
            if r.target_study == study.name and r.target_trial == figures.get("trial_number")
        ),
        None,
    )
    if own is not None:
        notes.append(
            f"predicted from {own.source_study} ({own.source_gpu}): "
            f"{own.predicted_samples_per_s:,.1f} samples/s, {own.error:+.1%} off"
        )
    else:  # this config was not measured elsewhere: how the ones that were came out
        notes += _predicted_elsewhere(study.name, records)
    efficiency = None
    if count > 1 and figures:
        scaled = next(
            (
                s
                for s in scaling_of(
                    (c.trial for c in study.candidates), study.name, study.devices_listed
                )
                if s.trial_number == figures["trial_number"]
            ),
            None,
        )
        efficiency = None if scaled is None else scaled.efficiency
        notes.append(
            f"{count} devices measured ({(figures['config'] or {}).get('data_parallel')}), "
            f"priced {count} × ${study.usd_per_hour:.2f}/h"
            + ("" if scaled is None else f"; {scaled.text().split(': ', 1)[1]}")
        )
    name = study.hardware_name if key is None else catalog.gpus[key].name
    if key is None and device and catalog.find(study.hardware_name) is not None:
        # priced as a catalog GPU, measured elsewhere: not the catalog's row of that name (a
        # walk's table had two "2× H100 SXM 80GB", one measured on the CPU and "meets")
        name = f"{name}, as measured on {device}"
    return OfferRow(
        gpu=key,
        name=name if count == 1 else f"{count}× {name}",
        count=count,
        usd_per_hour=study.usd_per_hour * count,
        basis="measured",
        study=study.name,
        meets=meets if figures else None,
        predicted_samples_per_s=own.predicted_samples_per_s if own else None,
        prediction_error=own.error if own else None,
        scaling_efficiency=efficiency,
        note="; ".join(notes),
        **figures,
    )


def _one_row_per_gpu(rows: Sequence[OfferRow], anchor: str) -> list[OfferRow]:
    """One measured row per catalog GPU and device count: the cheapest of the studies that
    measured it (the named study's on a tie), the others named in its note. A walk imported
    the H100 study twice, under two names, and was shown two H100 rows."""
    groups: dict[tuple[str, int], list[OfferRow]] = {}
    kept: list[OfferRow] = []
    for row in rows:
        if row.gpu is None or row.cost_per_run_usd is None:
            kept.append(row)
        else:
            groups.setdefault((row.gpu, row.count), []).append(row)
    for same in groups.values():
        same.sort(key=lambda r: (r.cost_per_run_usd or 0.0, r.study != anchor, r.study or ""))
        best, rest = same[0], same[1:]
        if rest:
            also = ", ".join(
                f"{r.study} (the same trial's figures)"
                if (r.trial_number, r.samples_per_s) == (best.trial_number, best.samples_per_s)
                else f"{r.study} (#{r.trial_number}, {money(r.cost_per_run_usd or 0.0)}/run)"
                for r in rest
            )
            note = f"also measured on this GPU in {also}"
            best = best.model_copy(update={"note": "; ".join(n for n in (best.note, note) if n)})
        kept.append(best)
    return kept


def _with_seen_scaling(
    row: OfferRow,
    seen: Sequence[Scaling],
    catalog: Catalog,
    scalings: Mapping[str, Sequence[Scaling]],
) -> OfferRow:
    """An unmeasured N-GPU row, told the efficiencies measured at N on other GPUs (not
    assumed for it: its interconnect may differ)."""
    told = [s for s in seen if s.efficiency is not None]
    if not told:
        return row
    where = {s.trial_number: k for k, found in scalings.items() for s in found}
    measured = ", ".join(
        f"{s.efficiency:.0%} on {catalog.gpus[where[s.trial_number]].name} "
        f"(#{s.trial_number}, {s.data_parallel})"
        for s in told[:3]
    )
    return row.model_copy(
        update={
            "note": f"{row.note}; measured at {row.count} devices elsewhere: {measured} "
            "(not assumed here: the interconnect may differ)"
        }
    )


def _estimate_row(
    sources: Sequence[MeasuredStudy],
    measured: Mapping[str, str | None],
    key: str,
    catalog: Catalog,
    measurement_of: MeasurementOf,
    constraints: Constraints,
    band: predict.Band,
) -> OfferRow:
    """``key``'s estimate: the cheapest of every source study's cheapest configs
    (``RUNNERS_UP`` each) scaled from the GPU it was measured on, so the answer does not
    depend on which study of the workload the user named (a walk asked the same question of
    the H100 and the H200 study and was told two cheapest GPUs)."""
    target = catalog.gpus[key]
    price = target.price.usd_per_hour
    best: tuple[MeasuredStudy, Candidate, predict.Prediction] | None = None
    ooms: list[predict.Prediction] = []
    oom_configs: set[tuple[str, str]] = set()  # a study imported twice counts once
    why = ""
    for source in sources:
        src_key = measured[source.name]
        assert src_key is not None
        for candidate in _one_device(source.candidates)[:RUNNERS_UP]:
            try:
                guess = predict.predict(
                    _observed(source, candidate, measurement_of),
                    catalog.gpus[src_key],
                    target,
                    band=band.rel,
                )
            except predict.Unpredictable as e:
                why = str(e)
                continue
            if guess.fit == "oom" or not _headroom_ok(guess, constraints):
                ooms.append(guess)
                oom_configs.add((src_key, _key(candidate.trial.config)))
                continue
            if best is None or _rank(guess, price, band.rel, constraints) < _rank(
                best[2], price, band.rel, constraints
            ):
                best = (source, candidate, guess)
    if best is None:
        on = ", ".join(sorted({str(measured[s.name]) for s in sources}))
        if ooms:
            least = min(ooms, key=lambda p: p.memory_needed_bytes)
            return _row_without(
                key,
                catalog,
                "predicted OOM",
                f"none of the {len(oom_configs)} cheapest configs measured on {on} fits: the "
                f"smallest needs {least.memory_needed_bytes / 1e9:,.1f} GB (its peak + "
                f"{predict.CONTEXT_BYTES / 1e9:g} GB for the CUDA context), the GPU has "
                f"{target.memory_gb:g} GB; measure smaller batches or gradient checkpointing",
            )
        return _row_without(key, catalog, "no estimate", why or "no config to scale")
    source, candidate, guess = best
    cost = guess.hours_per_run * price
    notes = [
        f"estimated from {source.name} trial #{candidate.trial.number} on "
        f"{measured[source.name]} (±{band.rel:.0%}): {guess.speedup:.2f}× its speed, "
        f"predicted MFU {guess.mfu:.0%}"
    ]
    if guess.fit == "tight":
        notes.append(
            f"memory tight: needs {guess.memory_needed_bytes / 1e9:,.1f} of {target.memory_gb:g} GB"
        )
    if candidate is not _one_device(source.candidates)[0]:
        notes.append(f"a runner-up: the cheaper configs do not fit in {target.memory_gb:g} GB")
    return OfferRow(
        gpu=key,
        name=target.name,
        usd_per_hour=price,
        basis="estimate",
        study=source.name,
        trial_number=candidate.trial.number,
        config=as_ran(candidate.trial.config, candidate.trial.own_values),
        samples_per_s=guess.samples_per_s,
        hours_per_run=guess.hours_per_run,
        cost_per_run_usd=cost,
        band=band.rel,
        meets=meets_limits(guess.hours_per_run, cost, band.rel, constraints),
        note="; ".join(notes),
    )


def _cheaper_elsewhere(
    row: OfferRow,
    sources: Sequence[MeasuredStudy],
    measured: Mapping[str, str | None],
    catalog: Catalog,
    measurement_of: MeasurementOf,
    constraints: Constraints,
    band: predict.Band,
) -> tuple[OfferRow, list[OfferRow]]:
    """A measured GPU's row, and where a config measured on another GPU is estimated cheaper
    on this one beyond the band (the H200's packed seq-512 pick, priced on the H100, against
    the H100's own measured best), that estimate as a row of its own: an offer the cheapest
    is chosen among (a walk saw it as a note, and the "cheapest that meets" ignored it)."""
    if row.gpu is None or row.cost_per_run_usd is None or row.count != 1:
        return row, []
    others = [s for s in sources if measured[s.name] != row.gpu]
    if not others:
        return row, []
    guess = _estimate_row(others, measured, row.gpu, catalog, measurement_of, constraints, band)
    if guess.cost_per_run_usd is None or guess.cost_per_run_usd * (1 + band.rel) >= (
        row.cost_per_run_usd
    ):
        return row, []
    note = (
        f"cheaper here by estimate: {guess.study} trial #{guess.trial_number}'s config, "
        f"${guess.cost_per_run_usd:,.2f}/run ±{band.rel:.0%} (measured on "
        f"{measured[str(guess.study)]}; its own row); measure it on this GPU"
    )
    other = guess.model_copy(
        update={
            "note": f"{guess.note}; not yet measured here: this GPU's measured best is "
            f"{row.study} #{row.trial_number} at {money(row.cost_per_run_usd)}/run; "
            "measure this config on it before the run",
            "gpu_measured_in": row.study,
        }
    )
    return row.model_copy(update={"note": "; ".join(n for n in (row.note, note) if n)}), [other]


def _rank(
    guess: predict.Prediction, price: float, band: float, constraints: Constraints
) -> tuple[int, float]:
    """Configs that meet the constraints first (at the figure), then the cheaper."""
    cost = guess.hours_per_run * price
    meets = meets_limits(guess.hours_per_run, cost, band, constraints)
    return (meets not in ("yes", "within its band"), cost)


def _headroom_ok(guess: predict.Prediction, constraints: Constraints) -> bool:
    floor = constraints.min_memory_headroom
    return floor is None or 1 - guess.memory_needed_bytes / guess.memory_bytes >= floor


def _row_without(key: str, catalog: Catalog, basis: Basis, note: str) -> OfferRow:
    gpu: Gpu = catalog.gpus[key]
    return OfferRow(
        gpu=key, name=gpu.name, usd_per_hour=gpu.price.usd_per_hour, basis=basis, note=note
    )


def _multi_row(
    key: str,
    count: int,
    catalog: Catalog,
    single: OfferRow | None,
    cheapest: OfferRow | None,
    constraints: Constraints,
) -> OfferRow:
    """N GPUs: unmeasured, so unpriced; what scaling it would need, from one GPU's figures."""
    gpu = catalog.gpus[key]
    note = (
        f"not measured on {count} {gpu.name}: a study there with {count} in search.devices "
        "measures it (no scaling is assumed)"
    )
    if single is not None and single.cost_per_run_usd and single.hours_per_run:
        parts = [
            f"one {gpu.name}: {hours_figure(single.hours_per_run)} h, "
            f"{money(single.cost_per_run_usd)}/run ({single.basis})"
        ]
        if cheapest is not None and cheapest.cost_per_run_usd:
            need = single.cost_per_run_usd / cheapest.cost_per_run_usd
            parts.append(
                f"beats the cheapest ({money(cheapest.cost_per_run_usd)}) only at a scaling "
                f"efficiency above {need:.0%}"
                if need < 1
                else f"cannot beat the cheapest ({money(cheapest.cost_per_run_usd)}) at any "
                f"scaling efficiency: even linear, {count} GPUs cost what one does per run"
            )
        if constraints.max_hours is not None:
            need_h = single.hours_per_run / (count * constraints.max_hours)
            parts.append(
                f"meets {constraints.max_hours:g} h only at an efficiency of {need_h:.0%} or more"
                if need_h <= 1
                else f"cannot meet {constraints.max_hours:g} h even at linear scaling"
            )
        note += ": " + "; ".join(parts)
    return OfferRow(
        gpu=key,
        name=f"{count}× {gpu.name}",
        count=count,
        usd_per_hour=count * gpu.price.usd_per_hour,
        basis="needs a multi-GPU measurement",
        note=note,
    )


def _cheapest(rows: Sequence[OfferRow]) -> OfferRow | None:
    priced = [
        r
        for r in rows
        if r.cost_per_run_usd is not None
        and math.isfinite(r.cost_per_run_usd)
        and r.meets in ("yes", "within its band")
        and r.gpu is not None
    ]
    return min(priced, key=lambda r: (r.cost_per_run_usd, r.basis != "measured"), default=None)


def _too_close(cheapest: OfferRow | None, rows: Sequence[OfferRow]) -> str:
    """Whether the cheapest, an estimate, is told apart from the offers that meet the
    constraints too: not when their $/run lies inside its band (and theirs, if estimated)."""
    if cheapest is None or cheapest.basis != "estimate" or not cheapest.cost_per_run_usd:
        return ""
    high = cheapest.cost_per_run_usd * (1 + (cheapest.band or 0.0))
    close = [
        r
        for r in rows
        if r is not cheapest
        and r.gpu is not None
        and r.meets in ("yes", "within its band")
        and r.cost_per_run_usd is not None
        and r.cost_per_run_usd * (1 - (r.band or 0.0)) <= high
    ]
    if not close:
        return ""
    named = ", ".join(
        f"{r.name} ({money(r.cost_per_run_usd or 0.0)}, {r.basis})"
        for r in close[:3]  # cheapest first
    )
    if cheapest.gpu_measured_in:  # the GPU was measured, not this config on it
        act = (
            f"measure {cheapest.study} trial #{cheapest.trial_number}'s config on "
            f"{cheapest.name} before the run: queue it in {cheapest.gpu_measured_in} (`POST "
            f"/api/studies/{cheapest.gpu_measured_in}/trials` with its config), and the next "
            f"`sweeper launch --study {cheapest.gpu_measured_in}` there measures it"
        )
    else:
        act = f"measure {cheapest.name} (a short sweep on one) before renting it for the run"
    # "within its band" only where the figure itself is inside; else the two bands overlap
    inside = all((r.cost_per_run_usd or 0.0) <= high for r in close)
    where = (
        ("lie" if len(close) > 1 else "lies") + " within its band"
        if inside
        else ("have" if len(close) > 1 else "has") + " a band that overlaps its"
    )
    return (
        f"{cheapest.name} is an estimate, and {named} {where}: the table cannot "
        f"tell them apart; {act}"
    )


def _order(row: OfferRow) -> tuple[int, float, str]:
    cost = row.cost_per_run_usd
    return (0, cost, row.name) if cost is not None else (1, 0.0, row.name)
