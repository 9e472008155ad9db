"""Skip rules: a proposal that cannot teach the sampler anything new is not run.

Each rule looks at a proposed config and says, or not, why it is skipped; the first that
speaks decides. A new rule is a new class here and one entry in ``SearchLoop``'s list.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sweeper.preflight import PreflightReport
from sweeper.search import oom_dominated
from sweeper.space import TrialConfig
from sweeper.space_search import SearchSpace
from sweeper.sweep.outcome import Outcome


@dataclass(frozen=True)
class RuledOut:
    """The config cannot run here: told as infeasible without a trial."""

    reason: str


@dataclass(frozen=True)
class Repeat:
    """The config was measured before: told its earlier result again."""

    earlier: Outcome


@dataclass(frozen=True)
class PredictedOom:
    """The config is at least as heavy as one that ran out of memory: not run."""

    heavier_than: int  # the trial that ran out of memory


@dataclass(frozen=True)
class NoTime:
    """The config's trial would not finish in the sweep's time left: not run, and not held
    against the config (told to Optuna as a failed trial, which samplers do not learn from)."""

    reason: str


Skip = RuledOut | Repeat | PredictedOom | NoTime


class SkipRule(Protocol):
    def check(self, config: TrialConfig) -> Skip | None: ...


class OutsideSpace:
    """The space's own rules (its constraints between knobs) rule the config out."""

    def __init__(self, search: SearchSpace) -> None:
        self.search = search

    def check(self, config: TrialConfig) -> Skip | None:
        reason = self.search.admits(config)
        return None if reason is None else RuledOut(reason)


class FailedPreflight:
    """A knob value of the config failed preflight here (and has no fallback)."""

    def __init__(self, preflight: PreflightReport) -> None:
        self.preflight = preflight

    def check(self, config: TrialConfig) -> Skip | None:
        reason = self.preflight.allows(config)
        return None if reason is None else RuledOut(reason)


class Ineligible:
    """The recommendation could not pick the config (it cuts samples that the workload's
    coverage needs whole: ``sweeper.recommend.recommendable``), so measuring it buys nothing.
    The user's own configs (``exempt``: the baseline, ``also_try``) run all the same: they are
    what the recommendation is compared with."""

    def __init__(
        self,
        eligible: Callable[[TrialConfig], bool],
        coverage_percentile: float,
        exempt: Collection[TrialConfig] = (),
    ) -> None:
        self.eligible, self.coverage, self.exempt = eligible, coverage_percentile, exempt

    def check(self, config: TrialConfig) -> Skip | None:
        if config in self.exempt or self.eligible(config):
            return None
        return RuledOut(
            f"not run: max_seq_length {config.max_seq_length}"
            + ("" if config.packing else " without packing")
            + f" cuts samples that workload.coverage_percentile ({self.coverage:g}) needs "
            "whole, so the recommendation could not pick it; lower coverage_percentile to "
            "measure such configs"
        )


class AlreadyMeasured:
    """The config has a result in this study (proposed again, or a resumed sweep's)."""

    def __init__(self, results: Mapping[TrialConfig, Outcome]) -> None:
        self.results = results

    def check(self, config: TrialConfig) -> Skip | None:
        earlier = self.results.get(config)
        return None if earlier is None else Repeat(earlier)


class OomDominated:
    """The config needs at least the memory of one that ran out of memory
    (``sweeper.search.oom_dominated``)."""

    def __init__(self, results: Mapping[TrialConfig, Outcome]) -> None:
        self.results = results

    def check(self, config: TrialConfig) -> Skip | None:
        oom = oom_dominated(config.model_dump(), oom_configs(self.results))
        return None if oom is None else PredictedOom(oom)


class DoesNotFit:
    """Near the end of a time budget, a config whose trial is expected to take longer than
    the time left (``sweeper.search_cost.fit_seconds``: its compile mode's longest trial so
    far; ``step_seconds_needed``: at least its own steps' time) would be cut by the budget:
    seconds paid, nothing measured. ``bayes`` does not propose one
    (``ImprovementGridSampler.fits``); this rule stops the other samplers' proposals.
    ``expected`` is set by the loop before each ask: the seconds a config needs and the
    seconds it has (None: every config fits)."""

    def __init__(self) -> None:
        self.expected: Callable[[TrialConfig], tuple[float, float]] | None = None

    def check(self, config: TrialConfig) -> Skip | None:
        if self.expected is None:
            return None
        needs, left = self.expected(config)
        if needs <= left:
            return None
        return NoTime(
            f"not run: its trial is expected to take ~{needs:.0f} s (compile mode "
            f"{config.compile_mode}, from the longest trials so far and its step's size) and "
            "the sweep's time "
            f"budget has {left:.0f} s left: the budget would cut it"
        )


def oom_configs(results: Mapping[TrialConfig, Outcome]) -> list[tuple[int, dict[str, Any]]]:
    """The configs that ran out of memory (not those predicted to), with their trial numbers."""
    return [
        (o.number, c.model_dump())
        for c, o in results.items()
        if o.failure_kind == "oom" and not o.predicted
    ]


def first_skip(rules: Sequence[SkipRule], config: TrialConfig) -> Skip | None:
    """What the first rule that speaks says about ``config``; None: run it."""
    for rule in rules:
        skip = rule.check(config)
        if skip is not None:
            return skip
    return None
