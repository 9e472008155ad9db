"""Terminal rendering for the command line: the live sweep (``RichObserver``), the
leaderboard, the recommendation, doctor's findings and the cross-machine comparison.

``sweeper.cli`` holds the commands; everything they print to a terminal is drawn here.
"""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from sweeper.cost import hours_figure, money, one_off_text
from sweeper.knob_values import OWN_LABEL, UNREACHED_LABEL, UNREACHED_WHY, as_ran
from sweeper.noise import Basis

if TYPE_CHECKING:
    from sweeper.compare import Comparison
    from sweeper.doctor import DoctorReport
    from sweeper.offers import OfferTable
    from sweeper.recommendation import Recommendation
    from sweeper.space import TrialConfig
    from sweeper.store import TrialRow
    from sweeper.sweep.run import SweepReport
    from sweeper.trial.protocol import PreparedData
    from sweeper.verdict import KnobEffects


def make_console(stderr: bool = False) -> Console:
    """A terminal's console; piped to a file or CI (no terminal, no COLUMNS), lines are not
    wrapped at rich's default 80 columns mid-sentence and tables get room for the config.
    No emoji codes: a path and its 1-based line, "chats.jsonl:100: ...", printed as
    "chats.jsonl💯 ..." (a walk's bad record on line 100; rich's escape() leaves them)."""
    made = Console(stderr=stderr, emoji=False)
    if made.is_terminal or os.environ.get("COLUMNS"):
        return made
    return Console(stderr=stderr, width=160, soft_wrap=True, emoji=False)


console = make_console()
err_console = make_console(stderr=True)


def count(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless there is one: "1 trial", "9 trials"."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


class RichObserver:
    """Shows the sweep while it runs: a progress bar and one line per finished trial."""

    def __init__(self, study: str, n_trials: int) -> None:
        self.running: int | None = None  # the trial running now (said when interrupted)
        self.measuring_again: int | None = None  # the trial whose config is measured again
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.progress.add_task(f"{study}: starting", total=n_trials)
        self.total, self.done = n_trials, 0
        self.first_trial_at: float | None = None

    def __enter__(self) -> RichObserver:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def prepare_started(self) -> None:
        self.progress.update(self.task, description="preparing dataset and tokenizer")

    def prepare_done(self, prepared: PreparedData, wall_s: float) -> None:
        stats = prepared.stats
        self.progress.console.print(
            f"data: {stats['dataset_rows']} rows, tokens per sample p50 {stats['tokens_p50']}, "
            f"p90 {stats['tokens_p90']}, max {stats['tokens_max']} (prepared in {wall_s:.1f} s)",
            highlight=False,
        )
        # preflight (when the space has it) comes next; the first trial replaces this
        self.progress.update(self.task, description="preflight: what can run here")

    def trial_started(self, number: int, config: TrialConfig) -> None:
        self.running = number
        if self.first_trial_at is None:
            self.first_trial_at = time.monotonic()
        self.progress.update(self.task, description=f"trial {number}: {describe(config)}")

    def _eta(self) -> str:
        """`[3/8, about 4 min left]`: the mean trial so far times the trials left (an
        estimate: re-measuring at the end adds to it)."""
        left = self.total - self.done
        if self.first_trial_at is None or left <= 0:
            return f" [{self.done}/{self.total}]"
        per_trial = (time.monotonic() - self.first_trial_at) / self.done
        minutes = per_trial * left / 60
        about = f"{minutes:.0f} min" if minutes >= 1 else f"{per_trial * left:.0f} s"
        return f" [{self.done}/{self.total}, about {about} left]"

    def remeasuring(self, number: int | None) -> None:
        self.measuring_again = number

    def interrupted_words(self) -> str:
        """What an interrupted sweep kept: the running trial's number, or that none ran."""
        running = self.running
        if running is None and self.measuring_again is not None:
            return (
                f"finished trials are kept; #{self.measuring_again}'s config was being "
                "measured again, and that measurement is dropped (its earlier ones stand)"
            )
        if running is None:
            return "no trial was running (nothing is lost); finished trials are kept"
        return f"finished trials are kept, the running one (#{running}) is marked interrupted"

    def trial_done(self, row: TrialRow) -> None:
        self.running = None
        self.done += 1
        config = describe_dict(as_ran(row.config, row.own_values))  # a script's own as ran
        if row.state == "complete":
            line = (
                f"[green]✓[/] #{row.number} {config} → {num(row.samples_per_s, ',.1f')} "
                f"samples/s, {num(row.it_per_s, '.2f')} it/s, "
                f"{dollars(row.cost_per_run_usd)}/run"
            )
        else:
            message = (row.failure_message or "")[:160]
            line = f"[red]✗[/] #{row.number} {config} → {row.failure_kind}: {escape(message)}"
        # a trial the sweep's own end cut (its time budget, a stop) ends the sweep: no time left
        # to estimate (a walk read "about 2 min left" right after "the budget ran out")
        eta = f" [{self.done}/{self.total}]" if row.failure_kind == "interrupted" else self._eta()
        self.progress.console.print(line + escape(eta), highlight=False)
        self.progress.advance(self.task)

    def note(self, message: str) -> None:
        self.progress.console.print(f"[yellow]note:[/] {escape(message)}", highlight=False)

    def planned(self, trials: int) -> None:
        self.total = self.done + trials
        self.progress.update(self.task, total=self.total)


def num(value: float | None, spec: str) -> str:
    """Format a figure that may be unknown (NULL in the store) as '—'."""
    return "—" if value is None else format(value, spec)


def dollars(value: float | None, *, sign: bool = True) -> str:
    """A $ figure (``cost.money``: fractions of a cent keep two figures), '—' if unknown;
    without the sign in a table whose header says $."""
    if value is None:
        return "—"
    text = money(value)
    return text if sign else text.replace("$", "", 1)


def hours_cell(value: float | None) -> str:
    """Hours (``cost.hours_figure``), '—' if unknown."""
    return "—" if value is None else hours_figure(value)


def describe(config: TrialConfig) -> str:
    return describe_dict(config.model_dump())


def describe_dict(config: dict[str, Any]) -> str:
    from sweeper import knobs

    return knobs.describe(config)


# the leaderboard's columns the config gives way to on a narrow terminal, the first first
_YIELDS = ("it/s", "data wait", "padding", "±95%", "tokens/s")
_CONFIG_MIN = 40  # the config column's least width: it folds, never goes


def print_leaderboard(url: str, study: str, top: int = 10) -> None:
    from sweeper.caveats import measured_since
    from sweeper.recommend import padding_share
    from sweeper.store import Store

    store = Store(url)
    trials = store.list_trials(study)
    store.dispose()
    completed = sorted(
        (t for t in trials if t.state == "complete" and t.cost_per_run_usd is not None),
        key=lambda t: (t.cost_per_run_usd, t.number),
    )
    rows = []
    # which measurements each row's figures stand on (sweeper.noise.Basis)
    bases = [Basis.stored(t.remeasures, t.contended) for t in completed[:top]]
    for t, basis in zip(completed[:top], bases, strict=True):
        padding = padding_share(t.tokens_per_s, t.padded_tokens_per_s)
        rows.append({
            "#": str(t.number),
            "config": describe_dict(as_ran(t.config, t.own_values)),
            "samples/s": num(t.samples_per_s, ",.1f"),
            "tokens/s": num(t.tokens_per_s, ",.0f"),
            "it/s": num(t.it_per_s, ".2f"),
            "data wait": num(
                None if t.data_wait_share is None else t.data_wait_share * 100, ".0f"
            ) + "%",
            "padding": num(None if padding is None else padding * 100, ".0f") + "%",
            "h/run": hours_cell(t.hours_per_run),
            "$/run": dollars(t.cost_per_run_usd, sign=False),
            "±95%": num(None if t.cost_ci95_rel is None else t.cost_ci95_rel * 100, ".1f")
            + "%"
            + (f" {basis.mark()}" if basis.mark() else "")
            + (" [yellow]*[/]" if t.contended else ""),
        })  # fmt: skip
    headers = ["#", "config", "samples/s", "tokens/s", "it/s", "data wait", "padding", "h/run",
               "$/run", "±95%"]  # fmt: skip

    def width(header: str) -> int:  # a no-wrap column's cells and its padding and border
        cells = [Text.from_markup(r[header]).cell_len for r in rows]
        return max([len(header), *cells]) + 3

    # on a narrow terminal the figures that matter least give way, so that the config (the
    # point of the table) keeps its least width: rich would squeeze it to nothing instead
    left_out = []
    for header in _YIELDS:
        if sum(width(h) for h in headers if h != "config") + _CONFIG_MIN + 4 <= console.width:
            break
        headers.remove(header)
        left_out.append(header)
    table = Table(title=f"{study}: cheapest per run", title_justify="left")
    for header in headers:
        if header == "config":  # the config is the point of the table: it folds, never cut
            table.add_column(header, justify="left", overflow="fold", min_width=_CONFIG_MIN,
                             ratio=1)  # fmt: skip
        else:
            table.add_column(header, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*(row[h] for h in headers))
    console.print(table)
    if left_out:
        console.print(
            f"  left out at this terminal's width ({console.width} columns): "
            f"{', '.join(left_out)}; a wider terminal shows them, as does the dashboard "
            "(sweeper serve)",
            highlight=False,
        )
    for legend in basis_legend(bases):
        console.print(f"  {legend}", highlight=False)
    contended = [f"#{t.number}" for t in completed[:top] if t.contended]
    if contended:
        console.print(
            f"  [yellow]*[/] measured only while the machine was shared: {', '.join(contended)}",
            highlight=False,
        )
    fixed = measured_since(trials)
    failed = [t for t in trials if t.state == "failed" and t.number not in fixed]
    # each failure whole: the launch's last words point here for what to fix, and a script
    # trial's message begins with its command (the live ✗ line keeps its short cut); one
    # whose config completed in a later trial is history, said in one line
    if fixed:
        console.print(
            f"  failed earlier, their configs measured since: "
            f"{', '.join(f'#{n}' for n in sorted(fixed))} (the study page and "
            f"GET /api/studies/{study}/trials keep them)",
            highlight=False,
        )
    for t in failed:
        console.print(
            f"[red]failed[/] #{t.number} {describe_dict(t.config)}: {t.failure_kind}: "
            f"{escape((t.failure_message or '')[:2000])}",
            highlight=False,
        )


def basis_legend(bases: list[Basis]) -> list[str]:
    """What the leaderboard's marks beside ±95% mean, those it shows (``Basis.mark``).

    >>> [line.split(":")[0] for line in basis_legend([Basis(3), Basis(4, contended=True)])]
    ['×N', 'fastest of N']
    >>> basis_legend([Basis(), Basis(1, contended=True)])  # one measurement each: no mark
    []
    """
    lines = []
    if any(b.measured > 1 and not b.contended and not b.left_out for b in bases):
        lines.append("×N: measured N times; the row is their mean")
    if any(b.left_out for b in bases):
        lines.append(
            "×N of M: measured M times; the row is the mean of the N calm measurements, "
            "those taken on a shared machine left out"
        )
    if any(b.contended and b.measured > 1 for b in bases):
        lines.append(
            "fastest of N: measured N times, each on a shared machine; the row is the "
            "fastest's (sharing only slows a run), its ±95% at least as wide as the "
            "measurements' spread"
        )
    return lines


def print_study_list(rows: list[dict[str, Any]], url: str) -> None:
    """``sweeper study list``: one line per study of the storage at ``url``."""
    if not rows:
        console.print(
            f"no studies in {url} yet: `sweeper launch --space FILE` records one here, "
            "`sweeper study import FILE` loads a recorded one",
            highlight=False,
        )
        return
    from sweeper.store.models import NONE_COMPLETED

    table = Table(title=f"studies in {url}", title_justify="left")
    for header in ("study", "state", "hardware", "$/h"):
        table.add_column(header, justify="right" if header == "$/h" else "left")
    for header in ("complete", "failed", "running", "planned", "cheapest trial $/run"):
        table.add_column(header, justify="right")
    table.add_column("updated (UTC)")
    for row in rows:
        trials = row["trials"]
        running = str(trials["running"])
        if row["remeasuring"]:
            running += f" +{len(row['remeasuring'])} re-measure"
        state = Text(row["state"])
        if row["none_completed"]:
            state.append(f" · {NONE_COMPLETED}", style="red")
        table.add_row(
            escape(row["name"]), state, escape(row["hardware_name"]),
            dollars(row["usd_per_hour"], sign=False), str(trials["complete"]),
            str(trials["failed"]), running, str(row["n_trials_planned"]),
            dollars(row["best_cost_per_run_usd"], sign=False),
            row["updated_at"][:16].replace("T", " "),
        )  # fmt: skip
    console.print(table)
    console.print(
        "the recommendation (which may be another config that ties with the cheapest trial "
        "within the noise): sweeper best --study NAME",
        style="dim",
        highlight=False,
    )


def print_recommendation(rec: Recommendation) -> None:
    config = rec.config
    console.print(
        f"\n[bold]recommended[/] for {rec.study} on {rec.hardware_name} "
        f"(${rec.usd_per_hour:.2f}/h per device"
        + (
            f", {rec.devices} devices: ${rec.usd_per_hour * rec.devices:.2f}/h"
            if rec.devices > 1
            else ""
        )
        + f"): trial #{rec.trial_number}, {rec.pick_text()}",
        highlight=False,
    )
    for key, value in config.items():  # as YAML writes them, to paste into a space's baseline
        shown = (
            "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        )
        own = (
            f"  # {OWN_LABEL}"
            if key in rec.own_values
            else f"  # {UNREACHED_LABEL}"
            if key in rec.unreached
            else ""
        )
        console.print(f"  {key}: {escape(str(shown))}{own}", highlight=False)
    if rec.unreached:
        console.print(f"  ({', '.join(rec.unreached)}: {UNREACHED_WHY})", highlight=False)
    console.print(
        f"  → {rec.throughput_text()}, "
        f"{num(rec.it_per_s, '.2f')} it/s; {hours_cell(rec.hours_per_run)} h/run, "
        f"[bold]{rec.interval_text()}[/]",
        highlight=False,
    )
    if rec.tie_note:
        console.print(f"    {rec.tie_note}", highlight=False)
    # the winner's scaling first, then the other multi-device trials' (sweeper.scaling)
    shown = sorted(rec.scaling, key=lambda s: s.trial_number != rec.trial_number)
    for row in shown[:6]:
        console.print(f"  scaling: {escape(row.text())}", highlight=False)
    if len(shown) > 6:
        console.print(f"  scaling: {len(shown) - 6} more multi-device trials (REST: scaling)")
    _print_projection(rec)
    _print_versus_baseline(rec)
    if rec.constraints != "no constraint":
        console.print(f"  constraints: {escape(str(rec.constraints))}", highlight=False)
    for warning in rec.warnings:
        console.print(f"  [yellow]warning:[/] {escape(warning)}", highlight=False)
    for note in rec.excluded:
        console.print(f"  [yellow]left out:[/] {escape(note)}", highlight=False)
    if rec.unmeasured is not None:  # not weighed, so not ruled out either
        console.print(f"  [yellow]{escape(rec.unmeasured.text())}[/]", highlight=False)


def _print_projection(rec: Recommendation) -> None:
    """Where the run's hours go, and what else the recommendation knows of it."""
    part = rec.projection
    if part:
        console.print(
            f"    training {part['train_hours']:,.2f} h + start-up {part['startup_s']:,.0f} s + "
            f"compile {part['compile_s']:,.0f} s + {part['checkpoint_saves']} checkpoint saves "
            f"{part['checkpoint_s']:,.0f} s",
            highlight=False,
        )
        if sources := one_off_text(part):
            console.print(f"    ({sources})", highlight=False)
    details = []
    if rec.padding_share is not None:
        details.append(f"padding {rec.padding_share:.0%} of computed tokens")
    if rec.truncated_tokens_share is not None:
        details.append(f"truncates {rec.truncated_tokens_share:.1%} of tokens")
    if rec.memory_headroom is not None:
        details.append(f"memory headroom {rec.memory_headroom:.0%}")
    if rec.trainable_text():
        details.append(str(rec.trainable_text()))
    if rec.measured_on:
        details.append(f"measured on {rec.measured_on}")
    if details:
        console.print("    " + "; ".join(details), highlight=False)


def _print_versus_baseline(rec: Recommendation) -> None:
    """The recommendation against the baseline, and what the sweep cost."""
    if rec.keeps_baseline:
        console.print(
            f"  this is your baseline (trial #{rec.trial_number}): {rec.keep_baseline_text}",
            highlight=False,
        )
    elif rec.speedup_vs_baseline is not None and rec.usd_saved_per_run is not None:
        console.print(
            f"  vs baseline (trial #{rec.baseline_trial_number}): "
            f"{hours_cell(rec.baseline_hours_per_run)} h, "
            f"{dollars(rec.baseline_cost_per_run_usd)}/run, "
            f"{rec.baseline_throughput_text()} → "
            f"{rec.speedup_vs_baseline:.2f}× faster, "
            f"{dollars(rec.usd_saved_per_run)} saved per run",
            highlight=False,
        )
    if rec.sweep_cost_usd is not None:
        payback = (
            f"; it pays for itself after {rec.payback_runs} run"
            f"{'s' if rec.payback_runs != 1 else ''}"
            if rec.payback_runs is not None
            else ""
        )
        console.print(
            f"  the sweep used {num(rec.sweep_hours, ',.2f')} device-hours of this machine "
            f"({dollars(rec.sweep_cost_usd)}){payback}",
            highlight=False,
        )


def print_doctor(report: DoctorReport) -> None:
    facts = report.facts
    title = "this machine" + (f" for {report.space}" if report.space else "")
    table = Table(title=title, title_justify="left", show_header=False)
    table.add_column("topic", style="bold")
    table.add_column("finding", overflow="fold")
    table.add_row(
        "versions",
        f"Python {facts['python']}, torch {facts['torch']} (CUDA {facts['torch_cuda'] or 'none'}"
        f"), transformers {facts['transformers']}"
        + (f", driver {facts['driver']}" if facts.get("driver") else ""),
    )
    installed = [
        f"{name} {info['version']}" + ("" if info["imports"] else " (does not import)")
        for name, info in facts["packages"].items()
        if info["installed"]
    ]
    missing = [name for name, info in facts["packages"].items() if not info["installed"]]
    table.add_row(
        "packages",
        (", ".join(installed) or "none of the optional ones")
        + (f"; not installed: {', '.join(missing)}" if missing else ""),
    )
    marks = {"ok": "[green]✓[/]", "warning": "[yellow]![/]", "problem": "[red]✗[/]"}
    for finding in report.findings:
        if finding.level == "ok":
            table.add_row(finding.topic, f"{marks['ok']} {finding.text}")
    console.print(table)
    for finding in report.findings:
        if finding.level == "ok":
            continue
        console.print(
            f"{marks[finding.level]} [bold]{finding.level}[/] ({finding.topic}): "
            f"{escape(finding.text)}",
            highlight=False,
        )
        if finding.fix:
            console.print(f"    fix: {escape(finding.fix)}", highlight=False)
    took = sum(report.phases_s.values())
    if report.space is None:
        console.print(f"\nexamined in {took:.0f} s", highlight=False)
    elif report.problems:
        console.print(
            f"\n[red]{len(report.problems)} problem(s)[/]: {report.space} asks for what this "
            f"machine cannot do (examined in {took:.0f} s)",
            highlight=False,
        )
    else:
        console.print(
            f"\n[green]{report.space} can run here[/] (examined in {took:.0f} s)", highlight=False
        )


def print_comparison(comparison: Comparison) -> None:
    cheapest = comparison.recommended
    if cheapest is None:  # nothing measured meets the constraints; an estimate might
        console.print(
            f"\n[bold]no measured config meets {escape(comparison.constraints)}[/]; "
            "the catalog's table below says which GPU would (an estimate until measured)",
            highlight=False,
        )
        for name, why in comparison.unavailable.items():
            console.print(f"  [yellow]{escape(name)}:[/] {escape(why)}", highlight=False)
        if comparison.offers is not None:
            print_offers(comparison.offers, comparison.constraints)
        return
    # a pick among configs that tie within the noise (for memory, say) is the recommendation,
    # not the cheapest measured: the line says which is, as `best` does (a walk read "#3"
    # here and a cheaper #1 in the front below)
    passed_over = cheapest.ties and cheapest.cheapest_trial_number is not None
    console.print(
        f"\n[bold]{'recommended' if passed_over else 'cheapest'}[/] across "
        f"{len(comparison.per_study)} machine(s): "
        f"{cheapest.hardware_name} (${cheapest.usd_per_hour:.2f}/h, study {cheapest.study}), "
        f"trial #{cheapest.trial_number}: {hours_cell(cheapest.hours_per_run)} h, "
        f"[bold]{dollars(cheapest.cost_per_run_usd)}/run[/]"
        + (f"; {escape(cheapest.pick_text())}" if passed_over else ""),
        highlight=False,
    )
    if cheapest.ties and cheapest.tie_note:  # a front row may read a cent cheaper: say why
        ties = ", ".join(f"#{t}" for t in cheapest.ties)
        console.print(
            f"  ties within the noise with {ties}; {escape(cheapest.tie_note.split('; ')[-1])}",
            highlight=False,
        )
    table = Table(title="Pareto front: no other config is both faster and cheaper")
    for column in ("machine", "$/h", "study", "trial", "config", "h/run", "$/run"):
        table.add_column(column)
    for point in comparison.pareto:
        table.add_row(
            point.hardware_name,
            f"{point.usd_per_hour:.2f}",
            point.study,
            str(point.trial_number),
            describe_dict(point.config),
            hours_cell(point.hours_per_run),
            dollars(point.cost_per_run_usd, sign=False),
        )
    console.print(table)
    for name, why in comparison.unavailable.items():
        console.print(f"  [yellow]{escape(name)}:[/] {escape(why)}", highlight=False)
    if comparison.offers is not None:
        print_offers(comparison.offers, comparison.constraints)


def print_offers(offers: OfferTable, constraints: str) -> None:
    """Every GPU offer for the job: measured or estimated (said which), cheapest first. A note
    that several rows share (nothing measured on a GPU yet) is printed once, under the table."""
    estimated = any(row.basis == "estimate" for row in offers.rows)
    table = Table(
        title=f"every GPU for this job ({constraints})"
        + (f"; estimates ±{offers.band:.0%}" if estimated else ""),
        title_justify="left",
    )
    for column in ("GPU", "$/h", "how known", "h/run", "$/run", "meets", "config", "note"):
        table.add_column(column, overflow="fold")
    from sweeper.offers import priced_gpus, shared_notes

    marks = shared_notes(offers)
    for row in offers.rows:
        band = f" ±{row.band:.0%}" if row.band is not None else ""
        table.add_row(
            escape(row.name),
            num(row.usd_per_hour, ".2f"),
            row.basis + (f" ({row.study})" if row.basis == "measured" else ""),
            hours_cell(row.hours_per_run) + (band if row.hours_per_run is not None else ""),
            dollars(row.cost_per_run_usd, sign=False)
            + (band if row.cost_per_run_usd is not None else ""),
            row.standing or row.meets or "",  # the page's words, both ends of a band
            "" if row.config is None else f"#{row.trial_number} {describe_dict(row.config)}",
            marks.get(row.note) or escape(row.note),
        )
    console.print(table)
    for note, mark in marks.items():
        console.print(f"  {mark} {escape(note)}", highlight=False)
    cheapest = offers.cheapest
    if cheapest is None and not priced_gpus(offers):
        console.print("  [yellow]no GPU of the catalog can be priced yet[/]", highlight=False)
    elif cheapest is None:
        console.print("  [yellow]no GPU offer meets the constraints[/]", highlight=False)
    else:
        console.print(
            f"  [bold]cheapest that meets them:[/] {escape(cheapest.name)}, "
            f"{hours_cell(cheapest.hours_per_run)} h, {dollars(cheapest.cost_per_run_usd)}"
            f"/run, {cheapest.basis}"
            + (f" ±{cheapest.band:.0%}" if cheapest.band is not None else ""),
            highlight=False,
        )
    if offers.caveat:
        console.print(f"  [yellow]too close to call:[/] {escape(offers.caveat)}", highlight=False)
    if estimated:
        console.print(f"  estimates: {escape(offers.model)}", highlight=False)
        console.print(f"  error band: {escape(offers.band_basis)}", highlight=False)
    console.print(f"  catalog: {escape(offers.catalog)}", highlight=False)


def print_sweep_summary(report: SweepReport) -> None:
    """The line after a sweep: trials run, complete and failed, its wall time, what it skipped
    or measured again, and why it stopped."""
    console.print(
        f"{count(report.trials_run, 'trial')} ({report.completed} complete, "
        f"{report.failed} failed) in {report.wall_s:.0f} s"
        + (
            f"; {report.predicted_oom} not run (as heavy as a config that ran out of memory)"
            if report.predicted_oom
            else ""
        )
        + (
            f"; {count(report.repeats, 'proposal')} of a config measured already, told its "
            "result and not run (their trial numbers have no row)"
            if report.repeats
            else ""
        )
        + (
            f"; {report.remeasured} re-measure{'s' if report.remeasured != 1 else ''} of "
            "measured configs (shared machine, drift, the best configs' noise)"
            if report.remeasured
            else ""
        )
        # escaped: a reason may quote code ("callbacks=[sweeper.callback()]")
        + (f"; stopped: {escape(report.stop_reason)}" if report.stop_reason else ""),
        highlight=False,
    )
    if report.device_limit_s is not None and report.study_device_s is not None:
        limit = report.device_limit_s
        console.print(
            f"device time: this worker used {report.device_s:,.0f} device-seconds "
            f"({report.device_s / limit:.0%} of the study's budget, {limit:,.0f}); the "
            f"{count(report.workers, 'worker')} of this run used {report.study_device_s:,.0f} "
            f"({report.study_device_s / limit:.0%})",
            highlight=False,
        )


def print_knob_effects(effects: KnobEffects, study: str) -> None:
    """What each knob the study varied is worth at the recommended config (``sweeper.verdict``)."""
    if not effects.effects and not effects.untold and not effects.shared:
        return
    console.print(f"\n[bold]what each knob is worth here[/] (at trial #{effects.winner})")
    for effect in sorted(effects.effects, key=lambda e: -abs(math.log(e.ratio))):
        console.print(f"  {escape(effect.words)}", highlight=False)
    if effects.untold:
        console.print(f"  {escape(effects.untold_sentence(study))}", highlight=False)
    if effects.shared:
        from sweeper.verdict import shared_words

        console.print(f"  {escape(shared_words(effects))}", highlight=False)
