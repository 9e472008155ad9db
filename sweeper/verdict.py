"""What each knob is worth on the user's own job: its effect on $/run at the recommended config.

For every knob the study varied and every value it measured other than the winner's, the ratio
of $/run with that value to $/run with the winner's, with a 95% interval, from the best evidence
there is:

- **at the winner**: a trial that differs from the recommended one in that knob alone (a knob
  the change turns on or off, such as ``prefetch_factor`` with ``num_workers: 0``, follows it).
  The interval combines the two trials' own measurement intervals;
- **elsewhere**: pairs of trials that differ in that knob alone, none of them at the winner:
  their geometric mean, with an interval from the pairs' spread (three or more pairs: a
  t-interval, which also holds the knob's interactions with the rest) or from their
  measurements' intervals (fewer);
- **model**: no pair: a least-squares fit of log $/run on every varied knob's values (main
  effects only, said so), with the coefficient's standard error; only where the trials
  outnumber the model's terms by at least two.

A ratio above 1 means the other value costs more per run. The words follow the interval, not
the knob's fame: a lever whose interval lies above 1 is "leave it at ..." whatever blogs say.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sweeper.knobs import KNOB
from sweeper.noise import NEGLIGIBLE  # an effect within it of 1 does not matter to a bill
from sweeper.recommend import Constraints, StudyFacts, choose, truncates
from sweeper.store import Store
from sweeper.store.models import TrialMetrics

Basis = Literal["at the winner", "elsewhere", "model"]

Z95 = 1.96
# two-sided 95% t quantiles by degrees of freedom (1..30); past 30, the normal's
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
# a measurement without its own interval: what one short trial's $/run typically spreads
DEFAULT_CI95_REL = 0.05
SHOWN_TRIALS = 20


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else Z95


class KnobEffect(BaseModel):
    """One knob's other value against the winner's: $/run ratio (other ÷ winner)."""

    model_config = ConfigDict(frozen=True)

    knob: str
    winner_value: Any
    value: Any
    ratio: float
    low: float  # the ratio's 95% interval
    high: float
    basis: Basis
    pairs: int = 0  # trial pairs behind it (0: the model)
    # the trials it rests on (at the winner: the other one; elsewhere: the first SHOWN_TRIALS)
    trials: tuple[int, ...] = ()
    verdict: str = ""  # what to do, from the interval
    words: str = ""  # the whole line: knob, values, figure, where it comes from, verdict


def _ci_log(t: TrialMetrics) -> float:
    """Half-width of the trial's 95% interval on log $/run."""
    rel = t.cost_ci95_rel if t.cost_ci95_rel is not None else DEFAULT_CI95_REL
    return math.log1p(max(rel, 0.0))


def _usable(trials: Sequence[TrialMetrics]) -> list[TrialMetrics]:
    return [
        t
        for t in trials
        if t.state == "complete"
        and t.cost_per_run_usd is not None
        and math.isfinite(t.cost_per_run_usd)
        and t.cost_per_run_usd > 0
    ]


_PLAIN = (int, float, str, bool, type(None))


def _key(value: Any) -> Hashable:
    """A knob's value as a dictionary key (lists and mappings as their JSON)."""
    return value if type(value) in _PLAIN else json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class _Table:
    """The trials' knob values as keys, one row per trial, read once: the pairing and the
    model index into it (at 10,000 trials, reading each config per knob took seconds)."""

    trials: list[TrialMetrics]
    names: list[str]
    rows: list[tuple[Hashable, ...]]

    @classmethod
    def of(cls, trials: list[TrialMetrics]) -> _Table:
        names = [n for n in KNOB if any(n in t.config for t in trials)]
        rows = [tuple(_key(t.config.get(n)) for n in names) for t in trials]
        return cls(trials, names, rows)

    def column(self, name: str) -> int:
        return self.names.index(name)


def _varied(table: _Table) -> list[str]:
    return [n for i, n in enumerate(table.names) if len({row[i] for row in table.rows}) > 1]


def _flipped(config: Mapping[str, Any], knob: str, values: tuple[Any, Any]) -> frozenset[str]:
    """The knobs whose activity changes when ``knob`` goes from one of ``values`` to the
    other (``prefetch_factor`` with ``num_workers: 0``): they follow it in a pair."""
    with_a, with_b = {**config, knob: values[0]}, {**config, knob: values[1]}
    return frozenset(
        other.name
        for other in KNOB.values()
        if other.active is not None
        and other.name != knob
        and other.is_active(with_a) != other.is_active(with_b)
    )


def _words(e: KnobEffect) -> tuple[str, str]:
    """The verdict and the whole line."""
    name = _label(e.knob)
    value = _value_words(e.value)
    winner = _value_words(e.winner_value)
    figure = f"{e.ratio:.2f}× $/run (95%: {e.low:.2f}–{e.high:.2f})"
    where = {
        "at the winner": "measured at the recommended config",
        "elsewhere": f"from {e.pairs} pair(s) of trials elsewhere in the space",
        "model": "from a model of the study's trials, no pair differs in this knob alone",
    }[e.basis]
    if e.low >= 1 - NEGLIGIBLE and e.high <= 1 + NEGLIGIBLE:
        verdict = f"no difference that matters (within {NEGLIGIBLE:.0%}): either"
    elif e.low > 1:  # "leave it on/off" for a switch, "leave it at sdpa" for a choice
        verdict = (
            f"leave it {winner}" if isinstance(e.winner_value, bool) else f"leave it at {winner}"
        )
    elif e.high < 1:
        verdict = (
            f"{value} was cheaper {'here' if e.basis == 'at the winner' else 'there'}: "
            "it was left out of the recommendation for a reason above, or measure it at the "
            "recommended config"
        )
    else:
        verdict = "no difference this study can tell: either"
    return verdict, f"{name} {value} instead of {winner}: {figure}, {where}: {verdict}"


def _value_words(value: Any) -> str:
    if value is True:
        return "on"
    if value is False:
        return "off"
    return "unset" if value is None else str(value)


class KnobEffects(BaseModel):
    """What the study can say of each knob it varied, at the recommended config."""

    model_config = ConfigDict(frozen=True)

    winner: int  # the recommended trial
    effects: tuple[KnobEffect, ...] = ()
    # varied knobs with a value the study cannot compare with the winner's: no pair of trials
    # differs in it alone and too few trials for the model
    untold: tuple[str, ...] = ()
    # trials left out: every measurement of them was taken on a shared machine, so their
    # $/run is only a bound (sharing slows a run), not a figure to compare (a walk was told
    # "accumulation 2: 6.50x, leave it at 1" from one; side by side it was 1.24x)
    shared: tuple[int, ...] = ()

    def untold_sentence(self, study: str) -> str:
        """The knobs the study cannot tell apart, and how to: one trial that changes one of
        them alone at the winner ("" without any). A walk's 6 trials ran bf16 only with
        checkpointing and fp32 only without: neither could be told from the other."""
        if not self.untold:
            return ""
        return (
            "Not told apart (no trial differs from another in it alone; too few trials to "
            f"model): {', '.join(self.untold)}. To tell one apart, measure trial "
            f"#{self.winner}'s config with that knob alone changed: queue it "
            f"(POST /api/studies/{study}/trials with the config) and launch the study again "
            f"(sweeper launch --study {study})."
        )

    @property
    def shared_sentence(self) -> str:
        """``shared_words`` as a sentence of its own, for the page ("" without any)."""
        words = shared_words(self)
        return f"{words[:1].upper()}{words[1:]}." if words else ""


def knob_effects(trials: Sequence[TrialMetrics], winner: TrialMetrics) -> KnobEffects:
    """Every varied knob's other measured values against the winner's (see the module).
    A trial measured only on a shared machine (``contended``) is left out, the winner aside,
    and named in ``shared``."""
    usable = _usable(trials)
    shared = tuple(sorted(t.number for t in usable if t.contended and t is not winner))
    usable = [t for t in usable if not t.contended or t is winner]
    if winner not in usable:
        usable.append(winner)
    table = _Table.of(usable)
    varied = _varied(table)
    model = _MainEffects.fit(table, varied)
    effects: list[KnobEffect] = []
    untold: list[str] = []
    for knob in varied:
        w = winner.config.get(knob)
        values = {_key(t.config.get(knob)): t.config.get(knob) for t in usable}
        values.pop(_key(w), None)
        others = sorted(values.values(), key=lambda value: json.dumps(value, sort_keys=True))
        pairs = _pairs(table, winner, knob, w, others)
        for v in others:
            effect = _paired(pairs[_key(v)], winner, knob, w, v) or (
                model.effect(knob, w, v) if model is not None else None
            )
            if effect is None:
                untold.append(f"{_label(knob)} {_value_words(v)}")
                continue
            verdict, words = _words(effect)
            effects.append(effect.model_copy(update={"verdict": verdict, "words": words}))
    return KnobEffects(
        winner=winner.number, effects=tuple(effects), untold=tuple(untold), shared=shared
    )


def shared_words(effects: KnobEffects) -> str:
    """The line under the table for ``effects.shared`` ("" without any)."""
    if not effects.shared:
        return ""
    named = ", ".join(f"#{n}" for n in effects.shared[:12])
    more = f" and {len(effects.shared) - 12} more" if len(effects.shared) > 12 else ""
    return (
        f"left out: {named}{more}, measured only while the machine was shared (a shared "
        "machine only slows a run: their $/run is a bound, not a figure to compare); measured "
        "again on a quiet machine, they count"
    )


def _label(knob: str) -> str:
    return KNOB[knob].label if knob in KNOB else knob


def _pairs(
    table: _Table, winner: TrialMetrics, knob: str, w: Any, others: Sequence[Any]
) -> dict[Hashable, list[tuple[TrialMetrics, TrialMetrics]]]:
    """For each of ``others``, the pairs of trials (``w`` first) that differ in ``knob``
    alone: one pass over the trials per set of knobs that follow the change (usually one per
    knob), not one per value."""
    # which knobs follow the change is a matter of the knob's rule, not of the rest: told
    # once, from the winner's config
    by_skip: dict[frozenset[str], list[Any]] = {}
    for v in others:
        by_skip.setdefault(_flipped(winner.config, knob, (w, v)) | {knob}, []).append(v)
    wk, column = _key(w), table.column(knob)
    found: dict[Hashable, list[tuple[TrialMetrics, TrialMetrics]]] = {}
    for skip, values in by_skip.items():
        rest = [i for i, n in enumerate(table.names) if n not in skip]
        signature = operator.itemgetter(*rest) if rest else (lambda row: ())
        wanted = {_key(v) for v in values}
        groups: dict[Any, dict[Hashable, list[TrialMetrics]]] = {}
        for t, row in zip(table.trials, table.rows, strict=True):
            value = row[column]
            if value == wk or value in wanted:
                groups.setdefault(signature(row), {}).setdefault(value, []).append(t)
        for vk in wanted:
            found[vk] = [
                (a, b) for g in groups.values() for a in g.get(wk, ()) for b in g.get(vk, ())
            ]
    return found


def _paired(
    pairs: Sequence[tuple[TrialMetrics, TrialMetrics]],
    winner: TrialMetrics,
    knob: str,
    w: Any,
    v: Any,
) -> KnobEffect | None:
    """From ``pairs`` of trials that differ in ``knob`` alone (``w`` first, then ``v``)."""
    if not pairs:
        return None
    at_winner = [(a, b) for a, b in pairs if a.number == winner.number]
    if at_winner:
        a, b = at_winner[0]
        log_ratio = _log_cost(b) - _log_cost(a)
        half = math.hypot(_ci_log(a), _ci_log(b))
        basis: Basis = "at the winner"
        used: tuple[int, ...] = (b.number,)
        n = 1
    else:
        logs = [_log_cost(b) - _log_cost(a) for a, b in pairs]
        log_ratio = math.fsum(logs) / len(logs)
        n = len(logs)
        if n >= 3:
            spread = math.sqrt(math.fsum((x - log_ratio) ** 2 for x in logs) / (n - 1))
            half = t95(n - 1) * spread / math.sqrt(n)
        else:
            half = math.sqrt(math.fsum(_ci_log(a) ** 2 + _ci_log(b) ** 2 for a, b in pairs) / n)
        basis = "elsewhere"
        used = tuple(sorted({t.number for pair in pairs for t in pair}))[:SHOWN_TRIALS]
    return KnobEffect(
        knob=knob, winner_value=w, value=v, ratio=math.exp(log_ratio),
        low=math.exp(log_ratio - half), high=math.exp(log_ratio + half),
        basis=basis, pairs=n, trials=used,
    )  # fmt: skip


def _log_cost(t: TrialMetrics) -> float:
    return math.log(t.cost_per_run_usd or 1.0)


@dataclass(frozen=True)
class _MainEffects:
    """Least squares of log $/run on every varied knob's values (main effects, no
    interactions), fitted once per study."""

    levels: list[tuple[str, Hashable]]  # one column per knob value but each knob's first
    coef: Any
    cov: Any
    df: int

    @classmethod
    def fit(cls, table: _Table, varied: Sequence[str]) -> _MainEffects | None:
        """None where the trials do not outnumber the terms by two, or some values only ever
        appear together (not told apart)."""
        import numpy as np  # the controller has it (optuna needs it); only this path uses it

        levels: list[tuple[str, Hashable]] = []
        for name in varied:
            column = table.column(name)
            seen = sorted({row[column] for row in table.rows}, key=repr)
            levels.extend((name, value) for value in seen[1:])
        trials = table.trials
        if len(trials) < len(levels) + 3:
            return None
        columns = [(table.column(n), v) for n, v in levels]
        x = np.array([[1.0] + [float(row[i] == v) for i, v in columns] for row in table.rows])
        if np.linalg.matrix_rank(x) < x.shape[1]:
            return None
        y = np.array([_log_cost(t) for t in trials])
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        df = len(trials) - x.shape[1]
        residual = y - x @ coef
        cov = float(residual @ residual) / df * np.linalg.inv(x.T @ x)
        return cls(levels, coef, cov, df)

    def effect(self, knob: str, w: Any, v: Any) -> KnobEffect:
        import numpy as np

        contrast = np.zeros(len(self.levels) + 1)
        for value, sign in ((w, -1.0), (v, 1.0)):
            level = (knob, _key(value))
            if level in self.levels:
                contrast[1 + self.levels.index(level)] = sign
        log_ratio = float(contrast @ self.coef)
        half = t95(self.df) * math.sqrt(max(float(contrast @ self.cov @ contrast), 0.0))
        return KnobEffect(
            knob=knob, winner_value=w, value=v, ratio=math.exp(log_ratio),
            low=math.exp(log_ratio - half), high=math.exp(log_ratio + half),
            basis="model", pairs=0,
        )  # fmt: skip


def study_knob_effects(
    store: Store, study: str, constraints: Constraints | None = None
) -> KnobEffects:
    """``knob_effects`` at the study's recommendation (``recommend.choose``, as ``best``),
    from the completed trials it may pick from: a config that truncates what the coverage
    needs (unless the constraints allow it) trains on less, so its $/run is not the same
    job's."""
    facts = StudyFacts.of(store.get_study(study))
    completed = store.trial_metrics(study, states=["complete"])  # read once, for both
    recommendation = choose(facts, completed, constraints)
    allow = constraints is not None and constraints.allow_truncation
    trials = [
        t
        for t in completed
        if t.number == recommendation.trial_number or allow or not truncates(facts, t.config)
    ]
    winner = next(t for t in trials if t.number == recommendation.trial_number)
    return knob_effects(trials, winner)


def markdown_table(effects: KnobEffects) -> str:
    """The verdicts as a markdown table for bench/RESULTS.md (scripts/gpu-record.sh's summary):
    one row per knob value against the recommended one's, the largest effect first.

    >>> e = KnobEffect(knob="liger_kernel", winner_value=False, value=True, ratio=1.03,
    ...                low=1.01, high=1.05, basis="at the winner", pairs=1, trials=(7,),
    ...                verdict="leave it off")
    >>> print(markdown_table(KnobEffects(winner=3, effects=(e,))).splitlines()[-1])
    | Liger kernels | on | off | 1.03× | 1.01–1.05 | at the winner (#7) | leave it off |
    """
    lines = [
        "| knob | value | recommended | $/run ÷ recommended's | 95% interval | from | verdict |",
        "| --- | --- | --- | ---: | --- | --- | --- |",
    ]
    for e in sorted(effects.effects, key=lambda e: -abs(math.log(e.ratio))):
        shown = ", ".join(f"#{n}" for n in e.trials)
        where = {
            "at the winner": f"at the winner ({shown})",
            "elsewhere": f"{e.pairs} pair(s) elsewhere",
            "model": "a model, no pair",
        }[e.basis]
        lines.append(
            f"| {_label(e.knob)} | {_value_words(e.value)} | {_value_words(e.winner_value)} "
            f"| {e.ratio:.2f}× | {e.low:.2f}–{e.high:.2f} | {where} | {e.verdict} |"
        )
    if effects.untold:
        lines.append(
            f"\nNot told apart (no pair, too few trials to model): {', '.join(effects.untold)}"
        )
    if effects.shared:
        lines.append(f"\n{shared_words(effects).capitalize()}")
    return "\n".join(lines)
