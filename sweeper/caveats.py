"""What a recommendation warns of, besides what it cuts off the data (``sweeper.recommend``).

Each function returns sentences for ``Recommendation.warnings``: the winner measured only on a
shared machine, configs whose re-measures drifted beyond the noise, a study priced as one
accelerator but measured on another, what the winning trial's own record says against it, and
what differs from the baseline beyond speed: the effective batch (with the learning rate scaled
to it) and each knob with a caveat (``sweeper.knobs``). ``unmeasured`` says what no trial
measured, so the answer could not weigh it (``Recommendation.unmeasured``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sweeper.cost import device_count, money
from sweeper.errors import BLOCK_FIX, mismatched_knobs
from sweeper.hardware import peak_flops
from sweeper.noise import Sample, drift, machine_noise
from sweeper.recommendation import Unmeasured
from sweeper.store import Store, TrialMetrics


def contention(trial: TrialMetrics) -> list[str]:
    """A warning when every measurement of ``trial`` was taken on a shared machine."""
    if not trial.contended:
        return []
    reasons = _merged([s.get("contention") or "" for s in trial.remeasures or []])
    return [
        "every measurement of this config was taken while the machine was shared"
        + (f" ({'; '.join(reasons)})" if reasons else "")
        + ": its numbers may be low; measure again on a quiet machine"
    ]


def rivals_contended(winner: int, rivals: Sequence[int], eligible: int) -> list[str]:
    """A warning when configs the pick was chosen over were measured only on a shared machine
    (a walk's `best` picked bs1 at 33.9 samples/s over bs8 x 2, measured at 6.0 under load and
    45.6 calm, and said nothing: the page warned, the CLI and REST did not).

    >>> rivals_contended(6, [0, 3], 6)[0][:61]
    '2 of the 5 other eligible configs (#0, #3) were measured only'
    """
    if not rivals:
        return []
    named = ", ".join(f"#{n}" for n in rivals[:8]) + (
        f" and {len(rivals) - 8} more" if len(rivals) > 8 else ""
    )
    return [
        f"{len(rivals)} of the {eligible - 1} other eligible configs ({named}) "
        f"{'was' if len(rivals) == 1 else 'were'} measured only while the machine was shared: "
        "a shared machine only slows a run, so their $/run is a bound, and any of them may be "
        f"cheaper than #{winner}; measure again on a quiet machine before trusting this pick"
    ]


_OTHERS_CPU = re.compile(r"other processes used ([\d.]+) of the (\S+) CPUs")


def _merged(said: Iterable[str]) -> list[str]:
    """Each measurement's contention reasons, said once: the CPU others used as a range
    across the measurements (a walk read "other processes used 1.3 of the 2 CPUs; other
    processes used 1.4 of the 2 CPUs").

    >>> _merged(["other processes used 1.3 of the 2 CPUs",
    ...          "other processes used 1.4 of the 2 CPUs; the hypervisor stole 9% of CPU time"])
    ['other processes used 1.3-1.4 of the 2 CPUs', 'the hypervisor stole 9% of CPU time']
    >>> _merged(["other processes used 1.3 of the 2 CPUs"] * 2)
    ['other processes used 1.3 of the 2 CPUs']
    """
    used: dict[str, list[float]] = {}
    rest: list[str] = []
    for text in said:
        for part in filter(None, (p.strip() for p in text.split(";"))):
            match = _OTHERS_CPU.fullmatch(part)
            if match:
                used.setdefault(match.group(2), []).append(float(match.group(1)))
            elif part not in rest:
                rest.append(part)
    merged = []
    for cpus, values in used.items():
        low, high = f"{min(values):.1f}", f"{max(values):.1f}"
        figure = low if low == high else f"{low}-{high}"
        merged.append(f"other processes used {figure} of the {cpus} CPUs")
    return merged + sorted(rest)


def drift_warnings(trials: Iterable[TrialMetrics]) -> list[str]:
    """A warning for each config whose drift re-measures moved beyond the noise."""
    groups = {t.number: [Sample.from_json(s) for s in t.remeasures] for t in trials if t.remeasures}
    noise = machine_noise(groups.values())
    found = []
    for number, samples in groups.items():
        moved = drift(samples, noise)
        if moved is not None:
            found.append(moved.describe(number))
    return found


def device_mismatch(hardware_name: str, device_name: str | None) -> str | None:
    """A warning when the study is priced as one accelerator but was measured on another,
    in the user's words for the priced one (a walk's `H100 80GB (Vast.ai)` read "not a H100
    SXM's": the catalog's reading, said beside it where it differs).

    >>> print(device_mismatch("H100 80GB (Vast.ai)", "AMD EPYC").split(": ", 1)[1])
    the hours are that machine's, not the H100 80GB (Vast.ai)'s (read as the catalog's H100 SXM)
    """
    if not device_name:
        return None
    priced, measured = peak_flops(hardware_name), peak_flops(device_name)
    if priced is not None and (measured is None or measured.name != priced.name):
        read = (
            ""
            if _same_name(priced.name, hardware_name)
            else f" (read as the catalog's {priced.name})"
        )
        return (
            f"priced as {hardware_name} but measured on {device_name}: the hours are that "
            f"machine's, not the {hardware_name}'s{read}"
        )
    return None


def _same_name(catalog: str, said: str) -> bool:
    """Whether the user's name says every word of the catalog's (H100 SXM in H100 SXM 80GB)."""
    words = said.lower().replace("-", " ").split()
    return all(w in words for w in catalog.lower().replace("-", " ").split())


_AVOID = "padding_free (or TRL's bfd packing) with a kernel that separates samples avoids it"


def ran_warnings(measured: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> list[str]:
    """What the winning trial's own record says against it: packed rows that attended across
    their samples (whatever the baseline packed). A packed trial recorded before sweeper
    checked (``cross_sample_attention`` absent: the H100 study of 2026-11-25) with sweeper's
    wrapped packing is said to have probably done so, not left silent.

    >>> ran_warnings({"packing": True}, {"packing": True, "packing_strategy": "wrapped"})[0][:58]
    'its packed rows probably attended across sample boundaries'
    >>> ran_warnings({"packing": True, "cross_sample_attention": False}, {"packing": True})
    []
    """
    # a run kept although it ended inside the window (a re-walk found it in a log only)
    said = [str(measured["ended_in_window"])] if measured.get("ended_in_window") else []
    config = config or {}
    if measured.get("cross_sample_attention"):
        said.append(
            "its packed rows attended across sample boundaries (measured: a mask of ones, no "
            "per-sample position ids): each sample sees the end of the one before it. " + _AVOID
        )
    elif (
        measured.get("packing")
        and "cross_sample_attention" not in measured
        and config.get("packing_strategy", "wrapped") == "wrapped"
        and not config.get("padding_free")
    ):
        said.append(
            "its packed rows probably attended across sample boundaries: the trial was "
            "recorded before sweeper checked (sweeper's wrapped packing uses a mask of ones); "
            "measure it again to know. " + _AVOID
        )
    return said


def program_run_warnings(
    measured: Mapping[str, Any],
    *,
    epochs: float | None,
    samples: int | None,
    dataset_rows: int | None = None,
    projection: Mapping[str, Any] | None,
    usd_per_hour: float,
    devices: int = 1,
) -> list[str]:
    """What to say when the user's program (``engine: script``) trains another run than the
    one hours and $/run price (``workload.samples`` × ``workload.epochs``), read from its
    running Trainer (``Measurement.program_run``): other epochs (TrainingArguments' default 3
    where the command is silent), or ``max_steps`` (a fixed count of optimizer steps, whose
    samples then follow the config's effective batch). The figure for the program's own
    length is an estimate: training time scales with the samples, start-up and compile not.
    And when its training set holds ``workload.dataset``'s ``dataset_rows`` records, a number
    other than ``workload.samples`` (``_rows_warning``).

    >>> measured = {"program_run": {"num_train_epochs": 3.0, "max_steps": -1},
    ...             "effective_batch": 8}
    >>> part = {"train_hours": 2.0, "startup_s": 360.0, "compile_s": 0.0, "checkpoint_s": 0.0}
    >>> program_run_warnings(measured, epochs=1, samples=1000, projection=part,
    ...                      usd_per_hour=2.5)[0][:60]
    'your program trains 3 epochs (num_train_epochs read from its'
    >>> "about 6.10 h and $15.25" in program_run_warnings(
    ...     measured, epochs=1, samples=1000, projection=part, usd_per_hour=2.5)[0]
    True
    >>> program_run_warnings(measured, epochs=3, samples=1000, projection=part, usd_per_hour=2.5)
    []
    """
    run = measured.get("program_run")
    if not isinstance(run, Mapping) or not epochs or epochs <= 0:
        return []
    said = _rows_warning(run, samples, dataset_rows)
    max_steps, trained = run.get("max_steps"), run.get("num_train_epochs")
    batch = measured.get("effective_batch")
    if isinstance(max_steps, int) and max_steps > 0:
        if not samples or not isinstance(batch, int) or batch <= 0:
            return []
        ratio = max_steps * batch / (samples * epochs)
        what = (
            f"your program trains max_steps {max_steps} optimizer steps (read from its running "
            f"Trainer): at this config's effective batch of {batch}, {max_steps * batch:,} "
            f"samples, {ratio:.2f}x the {samples:,} × {epochs:g} epoch"
            f"{'' if epochs == 1 else 's'} that hours and $/run price, and a config with another "
            "effective batch trains another amount"
        )
        fix = (
            "drop --max_steps from the command to train the space's epochs, or set "
            "workload.samples and workload.epochs to what the run trains"
        )
    elif isinstance(trained, int | float) and abs(trained - epochs) > 1e-9:
        ratio = trained / epochs
        what = (
            f"your program trains {trained:g} epochs (num_train_epochs read from its running "
            "Trainer; TrainingArguments' default is 3 where the command does not set it), "
            f"and hours and $/run price workload.epochs {epochs:g}"
        )
        fix = (
            f"set workload.epochs: {trained:g} if the run trains {trained:g}, or pass "
            f"--num_train_epochs {epochs:g} in the command"
        )
    else:
        return said
    estimate = ""
    if projection and math.isfinite(float(projection.get("train_hours") or math.inf)):
        once = sum(float(projection.get(key) or 0.0) for key in ("startup_s", "compile_s"))
        scaled = (
            float(projection["train_hours"]) * ratio
            + (once + float(projection.get("checkpoint_s") or 0.0) * ratio) / 3600
        )
        cost = scaled * usd_per_hour * device_count(devices)
        estimate = (
            f"; the program's own run would take about {scaled:.2f} h and {money(cost)} "
            "(an estimate: the training hours scaled by the samples, start-up and compile once)"
        )
    return [f"{what}{estimate}; {fix}", *said]


def _rows_warning(
    run: Mapping[str, Any], samples: int | None, dataset_rows: int | None
) -> list[str]:
    """The program's training set against ``workload.samples`` (one epoch of the real job):
    a Trainer's epoch is one pass over its dataset. Said only when that dataset holds as many
    rows as ``workload.dataset`` has records (the same data, a sample per row: a program
    that packs or filters holds another count, and its samples per epoch are not told).

    >>> _rows_warning({"train_rows": 400}, 200, 400)[0][:58]
    "your program's training set holds 400 rows per epoch, the "
    >>> _rows_warning({"train_rows": 400}, 396, 400), _rows_warning({"train_rows": 90}, 200, 400)
    ([], [])
    """
    rows = run.get("train_rows")
    if not isinstance(rows, int) or rows <= 0 or not samples or rows != dataset_rows:
        return []
    if abs(rows - samples) <= 0.02 * samples:
        return []
    return [
        f"your program's training set holds {rows:,} rows per epoch, the records of "
        f"workload.dataset, and hours and $/run price workload.samples {samples:,} "
        f"({rows / samples:.2f}x as many samples per epoch in the run your command trains); "
        f"set workload.samples: {rows} if the command trains the real job's data"
    ]


def effective_batch(config: dict[str, Any]) -> int | None:
    """Samples per optimizer step over every device: batch × accumulation × devices."""
    batch, accumulation = (
        config.get("per_device_batch_size"),
        config.get("gradient_accumulation_steps"),
    )
    if isinstance(batch, int) and isinstance(accumulation, int):
        return batch * accumulation * device_count(config)
    return None


def learning_rate_advice(
    learning_rate: float, old_batch: int, new_batch: int, source: str = ""
) -> tuple[float, str]:
    """The learning rate for ``new_batch`` and a sentence saying why (``source``: where
    ``learning_rate`` comes from, said beside it; empty where the trials trained with it).

    AdamW's rule of thumb is square-root scaling (Malladi et al., 2022); SGD's is linear
    (Goyal et al., 2017). Either way it is a starting point to check on the loss curve.

    >>> lr, _ = learning_rate_advice(1e-4, 16, 8)
    >>> round(lr, 8)
    7.071e-05
    """
    ratio = new_batch / old_batch
    sqrt_lr, linear_lr = learning_rate * math.sqrt(ratio), learning_rate * ratio
    return sqrt_lr, (
        f"effective batch changes from {old_batch} to {new_batch} samples per optimizer step "
        f"(×{ratio:g}): scale the learning rate from {learning_rate:.3g}"
        + (f" ({source})" if source else "")
        + f" to {sqrt_lr:.3g} "
        f"(square-root rule, AdamW; the linear rule gives {linear_lr:.3g}) and watch the "
        "loss curve, or fix effective_batch in the space to keep it"
    )


def knob_caveats(baseline: dict[str, Any], winner: dict[str, Any]) -> list[str]:
    """A warning for each knob that changes more than speed and differs from the baseline.

    A knob the winner leaves inactive (padding_free once packing is on) is not warned of: it
    does nothing there, and the knob that switched it off has its own warning.

    >>> knob_caveats({"optim": "adamw_torch"}, {"optim": "adafactor"})[0][:52]
    'optim is adafactor, not the baseline’s adamw_torch: '
    """
    from sweeper.knobs import KNOB, normalize

    before, after = normalize(baseline), normalize(winner)
    return [
        f"{name} is {after[name]}, "
        + (
            "not set in the baseline"
            if before.get(name) is None
            else f"not the baseline’s {before[name]}"
        )
        + f": {knob.caveat}"
        for name, knob in KNOB.items()
        if knob.caveat and after.get(name) is not None and before.get(name) != after.get(name)
    ]


def measured_since(trials: Iterable[Any]) -> set[int]:
    """The numbers of the failed ``trials`` whose config a later trial completed: failures
    fixed since (a walk fixed its script's length and relaunched; `best`, every export and
    every later launch still warned of the 4 failed configs, all measured since). ``trials``
    are rows with ``number``, ``state`` and ``config`` (``store.list_trials``)."""
    import json

    def key(config: Mapping[str, Any]) -> str:
        return json.dumps(config, sort_keys=True, default=str)

    completed: dict[str, int] = {}
    for t in trials:
        if t.state == "complete":
            completed[key(t.config)] = max(completed.get(key(t.config), -1), t.number)
    return {
        t.number
        for t in trials
        if t.state == "failed" and completed.get(key(t.config), -1) > t.number
    }


def mismatched(store: Store, study: str) -> list[str]:
    """What the trials that failed as ``mismatch`` say against the pick: the knobs the
    program did not run as asked were never measured at the values it ignored, so the pick
    is only among the configs that ran as asked (a walk's script ignored its batch size and
    workers: 7 of 8 trials failed so, and `best` named the one survivor without a word)."""
    rows = store.list_trials(study, states=["failed"], failure_kinds=["mismatch"])
    if rows:  # not those whose config ran as asked since (the program was fixed)
        fixed = measured_since([*rows, *store.list_trials(study, states=["complete"])])
        rows = [row for row in rows if row.number not in fixed]
    if not rows:
        return []
    failed = [row.number for row in rows]  # one read, messages included (not one per trial)
    knobs: dict[str, None] = {}
    for row in rows:
        for knob in mismatched_knobs(row.failure_message or ""):
            knobs.setdefault(knob, None)
    said = ", ".join(knobs) or "some knobs"
    numbers = ", ".join(f"#{n}" for n in failed[:8]) + (" ..." if len(failed) > 8 else "")
    fix = (
        "make the program take those knobs from sweeper (`sweeper.trial_config()`, or the "
        "flags or environment of `knobs:`)"
    )
    if any(BLOCK_FIX in (row.failure_message or "") for row in rows):
        fix = (  # the loop took its accumulation from sweeper, but wraps each micro-batch
            "put each `with sweeper.step(...)` block around a whole optimizer step, passing "
            "its micro-batches as a list (the failures say how)"
        )
    return [
        f"{len(failed)} trial{'' if len(failed) == 1 else 's'} failed because the program "
        "did not run the config as asked "
        f"({numbers}: {said}): the values it ignored were never measured, so this pick is "
        f"only among the configs that ran as asked; {fix} and launch again"
    ]


def unmeasured(
    listed: Mapping[str, Sequence[Any]], trials: Iterable[TrialMetrics]
) -> Unmeasured | None:
    """What no trial measured, from every trial of a study (``store.trial_metrics``) and the
    values its search lists per knob (``StudyFacts.listed``): the configs asked for whose
    trials all ended without a measurement, and the listed values no completed trial ran
    (a knob that applied to no completed config, prefetch_factor without workers, is not
    counted). A walk's `best` named a winner without a word for the flash_attention_2 that
    preflight dropped and the configs that ran out of memory, read as ruled out on merit.
    None when there is nothing to say."""
    import json

    def key(config: Mapping[str, Any]) -> str:
        return json.dumps(config, sort_keys=True, default=str)

    measured: dict[str, Mapping[str, Any]] = {}
    last: dict[str, TrialMetrics] = {}
    running: set[str] = set()
    asked_running: list[TrialMetrics] = []  # running trials: asked for, not yet measured
    for trial in trials:
        config = trial.config or {}
        if trial.state == "complete":
            measured[key(config)] = config
        elif trial.state == "running":
            running.add(key(config))
            asked_running.append(trial)
        else:
            last[key(config)] = trial  # rows come in number order: the latest ending wins
    ended: dict[str, int] = {}
    for name, trial in last.items():
        if name in measured or name in running:
            continue
        kind = trial.failure_kind or trial.state
        if trial.state == "pruned":
            kind = f"{kind} predicted"
        ended[kind] = ended.get(kind, 0) + 1
    values: dict[str, list[Any]] = {}
    untried: dict[str, list[Any]] = {}
    for knob, choices in listed.items():
        ran = [config.get(knob) for config in measured.values()]
        if not any(value is not None for value in ran):
            continue  # it applied to no completed config (or nothing completed)
        missing = [value for value in choices if value not in ran]
        if missing:
            values[knob] = missing
            asked = [(t.config or {}).get(knob) for t in [*last.values(), *asked_running]]
            if never := [value for value in missing if value not in asked]:
                untried[knob] = never
    if not ended and not values:
        return None
    ordered = dict(sorted(ended.items(), key=lambda item: (-item[1], item[0])))
    return Unmeasured(configs=sum(ended.values()), ended=ordered, values=values, untried=untried)


def why_none(store: Store, study: str) -> str:
    """What the study's trials are, when none completed, and what to do: ": 1 interrupted;
    `sweeper launch --study NAME` resumes it" (a walk's Ctrl-C left a study whose `best` said
    only "has no completed trial yet")."""
    from collections import Counter

    rows = store.list_trials(study)
    if not rows:
        return f": none has run; `sweeper launch --study {study}` runs it"
    said = Counter(
        r.failure_kind if r.state == "failed" and r.failure_kind else r.state for r in rows
    )
    counts = ", ".join(f"{n} {what}" for what, n in said.most_common())
    todo = []
    if said.get("interrupted") or said.get("lost") or said.get("running"):
        todo.append(f"`sweeper launch --study {study}` resumes it, running what did not finish")
    if any(r.state == "failed" and r.failure_kind != "interrupted" for r in rows):
        todo.append("each failure's message is on the study page (`sweeper serve`) and in the "
                    "launch's output: fix what it says, then launch again")  # fmt: skip
    return f" ({counts})" + (f": {'; '.join(todo)}" if todo else "")
