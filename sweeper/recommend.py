"""The decision: which measured config to run, at what price — for the CLI and the REST API.

``choose`` is a pure function of a study's facts and its trial rows:

1. only completed trials with a finite, positive projection count (failed, pruned, running and
   NaN/inf rows never do); hours per run do not depend on the price, so a new $/h re-prices
   without a new measurement;
2. constraints filter: max hours, max $, minimum memory headroom;
3. the training-semantics guard: a config whose max_seq_length is below the dataset's coverage
   length (the longest sample, or the space's coverage percentile) truncates, and is left out
   unless truncation is allowed — the answer then says what it left out and why;
4. the cheapest per run wins, unless other configs tie with it (``sweeper.noise.tie``: the
   95% interval of their $/run ratio holds 1 or lies within 2% of it; intervals that merely
   overlap do not tie): the baseline wins if it is among them (nothing beats it beyond the
   noise), else the one with the least peak memory among those within 5% of the cheapest's
   figure, then the cheaper; the answer names the
   ties, and, when it picks another, the cheapest it passed over;
5. it is compared with the baseline (speedup, $ saved, effective batch and learning rate) and
   with what the sweep itself cost (payback in runs); ``sweeper.caveats`` words its warnings.

The answer is a ``sweeper.recommendation.Recommendation``.

``sweeper.compare`` does the same across studies of the same workload on different hardware.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from sweeper import caveats
from sweeper.cost import device_count, hours_figure, money, run_cost
from sweeper.errors import (
    NoResultError,
    SpaceError,
    TruncatesOnlyError,
)
from sweeper.knob_values import as_ran
from sweeper.knobs import KNOB
from sweeper.noise import Basis, tie
from sweeper.recommendation import Recommendation, cost_text
from sweeper.scaling import scaling_of
from sweeper.store import Store, StudyRow, TrialMetrics


@dataclass(frozen=True, kw_only=True)
class Constraints:
    """What the user can live with; ``usd_per_hour`` re-prices without re-running."""

    usd_per_hour: float | None = None
    max_hours: float | None = None
    max_cost_usd: float | None = None
    min_memory_headroom: float | None = None  # e.g. 0.1: at least 10% of device memory free
    allow_truncation: bool = False

    def describe(self) -> str:
        parts = []
        if self.max_hours is not None:
            parts.append(f"within {self.max_hours:g} h")
        if self.max_cost_usd is not None:
            # the user's own limit: cents as cents, a finer one as given ($0.0695, never $0.07)
            cost = self.max_cost_usd
            parts.append(
                f"at most ${cost:,.2f}" if round(cost, 2) == cost else f"at most ${cost:g}"
            )
        if self.min_memory_headroom is not None:
            parts.append(f"at least {self.min_memory_headroom:.0%} memory headroom")
        return " and ".join(parts) or "no constraint"


@dataclass(frozen=True, kw_only=True)
class StudyFacts:
    """What the decision needs to know about a study besides its trials."""

    name: str
    hardware_name: str
    usd_per_hour: float
    baseline: dict[str, Any] | None = None
    dataset_stats: dict[str, Any] | None = None
    coverage_percentile: float = 100.0
    learning_rate: float | None = None
    # where learning_rate comes from, said beside the advice where it is not what the trials
    # trained with: a script's run has its own, which sweeper reads from what ran
    # (ProgramRun.learning_rate) where the program shows it
    learning_rate_source: str = ""
    sweep_seconds: float = 0.0
    # TRL's default packing (best-fit decreasing) cuts a sample longer than max_length, where
    # sweeper's own packing (loop, trainer) continues it in the next block: what a packed config
    # stored before the packing_strategy knob ran
    packing_truncates: bool = False
    headline: Literal["samples", "tokens"] = "samples"
    # the space's max_seq_length choices (auto: what the data made of it); () if unknown
    listed_lengths: tuple[int, ...] = ()
    # the run hours and $/run price: workload.samples × workload.epochs (None: not known)
    samples: int | None = None
    epochs: float | None = None
    # the space's loss over chat records (workload.dataset.loss), None: not chat records
    chat_loss: str | None = None
    # the words of a script's command that gave the length, where search: lists none
    # ("--max_seq_length 1536"; sweeper.script_defaults.said)
    length_words: str | None = None
    # a script's command saving otherwise than the space prices (script_defaults.checkpoint_note)
    saves_note: str | None = None
    # a script's command giving its own parser's epochs other than the priced ones
    # (script_defaults.own_epochs_note)
    epochs_note: str | None = None
    # each knob's values the space's search lists (max_seq_length: listed_lengths), for what
    # no trial measured (caveats.unmeasured); empty if the space does not parse here
    listed: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, row: StudyRow) -> StudyFacts:
        coverage, learning_rate, packing_truncates = 100.0, None, False
        headline: Literal["samples", "tokens"] = "samples"
        listed_lengths: tuple[int, ...] = ()
        samples: int | None = None
        epochs: float | None = None
        chat_loss: str | None = None
        length_words: str | None = None
        saves_note: str | None = None
        epochs_note: str | None = None
        lr_source = ""
        listed: dict[str, tuple[Any, ...]] = {}
        try:
            from sweeper import seqlen
            from sweeper.space import parse_space

            space = parse_space(row.space_yaml)
            workload = space.workload
            coverage, learning_rate = workload.coverage_percentile, workload.learning_rate
            packing_truncates = workload.engine == "sft"
            headline = workload.headline
            samples, epochs = workload.samples, workload.epochs
            if workload.dataset.messages_field is not None:
                chat_loss = workload.dataset.loss
            length_words = _length_from_command(row.space_yaml, workload.script)
            if workload.script is not None:
                from sweeper import script_defaults

                lr_source = (
                    "workload.learning_rate, not read from your program: set it to your run's"
                )

                saves_note = script_defaults.checkpoint_note(
                    workload.script.command, workload.script.knobs, workload.checkpoint.save_steps
                )
                epochs_note = script_defaults.own_epochs_note(
                    workload.script.command, workload.epochs
                )
            if row.dataset_stats:
                lengths = seqlen.resolve(space, row.dataset_stats).search.values("max_seq_length")
                listed_lengths = tuple(lengths)
            listed = {name: tuple(space.search.values(name)) for name in KNOB}
            listed["max_seq_length"] = listed_lengths
        except SpaceError:
            pass  # a study written by another version, or by hand: use the defaults
        return cls(
            name=row.name,
            hardware_name=row.hardware_name,
            usd_per_hour=row.usd_per_hour,
            baseline=row.baseline,
            dataset_stats=row.dataset_stats,
            coverage_percentile=coverage,
            learning_rate=learning_rate,
            learning_rate_source=lr_source,
            sweep_seconds=row.sweep_seconds or 0.0,
            packing_truncates=packing_truncates,
            headline=headline,
            listed_lengths=listed_lengths,
            samples=samples,
            epochs=epochs,
            chat_loss=chat_loss,
            length_words=length_words,
            saves_note=saves_note,
            epochs_note=epochs_note,
            listed=listed,
        )


def _length_from_command(space_yaml: str, script: Any) -> str | None:
    """The words of a script's command that gave max_seq_length, where the space's own
    search: lists none (``StudyFacts.length_words``)."""
    if script is None:
        return None
    import yaml

    from sweeper import script_defaults

    raw = yaml.safe_load(space_yaml)
    search = raw.get("search") if isinstance(raw, dict) else None
    if isinstance(search, dict) and "max_seq_length" in search:
        return None
    said = script_defaults.said(script.command, script.knobs).get("max_seq_length")
    return None if said is None else said[1]


def truncates(facts: StudyFacts, config: Mapping[str, Any]) -> bool:
    """Whether ``config`` cuts samples that the study's coverage percentile needs whole (the
    training-semantics guard: such a config is cheaper partly because it trains on less text).

    >>> facts = StudyFacts(name="s", hardware_name="H100", usd_per_hour=2.5,
    ...                    dataset_stats={"token_percentiles": [99] * 101, "tokens_max": 99})
    >>> truncates(facts, {"max_seq_length": 64}), truncates(facts, {"max_seq_length": 128})
    (True, False)
    """
    if config.get("packing") and not packing_cuts(facts, config):
        return False  # packed blocks continue a long sample instead of cutting it
    seq = config.get("max_seq_length")
    cover = coverage_length(facts.dataset_stats, facts.coverage_percentile)
    return cover is not None and isinstance(seq, int) and seq < cover


def recommendable(row: StudyRow) -> Callable[[BaseModel], bool]:
    """Which configs of the study ``row`` the recommendation may pick (those that do not
    truncate): what a sweep measures again at its end (``run_sweep(eligible_for=...)``)."""
    facts = StudyFacts.of(row)
    return lambda config: not truncates(facts, config.model_dump())


def packing_cuts(facts: StudyFacts, config: Mapping[str, Any]) -> bool:
    """Whether ``config``'s packing drops what overflows a row: TRL's ``bfd`` does, ``wrapped``
    and ``bfd_split`` continue a long sample in another row (a config stored before the
    ``packing_strategy`` knob packed as its engine did: ``facts.packing_truncates``).

    >>> facts = StudyFacts(name="s", hardware_name="H100", usd_per_hour=2.5)
    >>> [packing_cuts(facts, {"packing": True, "packing_strategy": s})
    ...  for s in ("bfd", "bfd_split", "wrapped")]
    [True, False, False]
    """
    strategy = config.get("packing_strategy")
    return facts.packing_truncates if strategy is None else strategy == "bfd"


def truncation(stats: dict[str, Any] | None, max_seq_length: int) -> tuple[float, float] | None:
    """(share of samples, share of tokens) cut off at ``max_seq_length``, or None if unknown.

    Estimated from the dataset's token-length percentiles (0..100) measured by the prepare
    step; one EOS token per sample is counted, as the trial appends it.

    >>> samples, tokens = truncation({"token_percentiles": [99] * 50 + [199] * 51}, 100)
    >>> round(samples, 3), round(tokens, 3)  # the longer half loses 100 of its 200 tokens
    (0.505, 0.336)
    """
    points = (stats or {}).get("token_percentiles")
    if not points:
        return None
    lengths = [p + 1 for p in points]  # + EOS
    cut = [max(0, n - max_seq_length) for n in lengths]
    samples_share = sum(1 for c in cut if c > 0) / len(lengths)
    tokens_share = sum(cut) / max(1, sum(lengths))
    return samples_share, tokens_share


def coverage_length(stats: dict[str, Any] | None, percentile: float) -> int | None:
    """Tokens (with EOS) a sequence needs to hold ``percentile`` % of the samples whole.

    >>> coverage_length({"token_percentiles": list(range(101)), "tokens_max": 100}, 99)
    100
    >>> coverage_length({"token_percentiles": list(range(101)), "tokens_max": 100}, 100)
    101
    """
    stats = stats or {}
    points = stats.get("token_percentiles")
    if not points:
        return None
    if percentile >= 100:
        return int(stats.get("tokens_max", points[-1])) + 1
    return int(points[min(100, math.ceil(percentile))]) + 1


def truncation_fix(facts: StudyFacts, cover: int | None) -> str:
    """The one change to the space that gives a config that truncates nothing, never one the
    space already has: a length that covers the data where none is listed, else a trial at
    the listed length that does.

    >>> facts = StudyFacts(name="s", hardware_name="H100", usd_per_hour=2.5,
    ...                    listed_lengths=(256, 512))
    >>> truncation_fix(facts, 700)[:48]
    'add 704 to search.max_seq_length (it lists [256,'
    """
    from sweeper.seqlen import hardware_friendly

    if cover is None:
        return "list a max_seq_length at least as long as the longest sample"
    whole = [n for n in facts.listed_lengths if n >= cover]
    if facts.length_words and not whole:  # the user's command, not a list of the space's
        return (
            f"list search.max_seq_length: [{hardware_friendly(cover)}] in the space, or auto, "
            f"which reads the lengths off the data (your command's {facts.length_words} is "
            "the one length run while search: lists none; each trial then gives your script "
            "the listed length as that flag)"
        )
    if facts.listed_lengths and not whole:
        return (
            f"add {hardware_friendly(cover)} to search.max_seq_length (it lists "
            f"{list(facts.listed_lengths)}), or write max_seq_length: auto, which reads the "
            "lengths off the data"
        )
    if whole:
        return (
            f"measure a config at max_seq_length {min(whole)}, which the space lists but no "
            "completed trial used: run `sweeper launch` again (it resumes the study) with more "
            "trials"
        )
    return f"list a max_seq_length of at least {cover} tokens (or max_seq_length: auto)"


def padding_share(tokens_per_s: float | None, padded_tokens_per_s: float | None) -> float | None:
    """Of the tokens a config computes, the share that is padding (None if unknown).

    >>> padding_share(300.0, 1200.0)
    0.75
    """
    if not _finite(tokens_per_s) or not _finite(padded_tokens_per_s) or not padded_tokens_per_s:
        return None
    return max(0.0, 1 - (tokens_per_s or 0.0) / padded_tokens_per_s)


@dataclass(frozen=True)
class Candidate:
    """A completed trial as the decision sees it: its projected hours and $ at the price asked,
    what it cuts, its memory headroom and its $/run's spread."""

    trial: TrialMetrics
    hours: float
    cost: float
    truncated: tuple[float, float] | None  # (samples, tokens) cut, when it truncates at all
    headroom: float | None
    spread: float = 0.0  # half-width of the $/run's 95% interval, relative (0: unknown)

    @property
    def key(self) -> tuple[float, int]:
        return (self.cost, self.trial.number)


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _candidates(facts: StudyFacts, trials: Iterable[TrialMetrics], price: float) -> list[Candidate]:
    """Completed trials with a usable projection, re-priced at ``price``."""
    # what a config cuts depends on its length and packing only: a space has few of those
    cuts: dict[tuple[Any, Any, Any], tuple[float, float] | None] = {}
    out = []
    for t in trials:
        hours = t.hours_per_run
        if t.state != "complete" or not _finite(t.samples_per_s) or not _finite(hours):
            continue
        assert hours is not None and t.samples_per_s is not None
        if hours <= 0 or t.samples_per_s <= 0:
            continue
        config = _ran(t)
        seq = config.get("max_seq_length")
        key = (seq, config.get("packing"), config.get("packing_strategy"))
        if key not in cuts:
            cuts[key] = None
            if truncates(facts, config) and isinstance(seq, int):
                cuts[key] = truncation(facts.dataset_stats, seq) or (math.nan, math.nan)
        truncated = cuts[key]
        headroom = None
        if t.peak_memory_bytes is not None and t.device_memory_bytes:
            headroom = 1 - t.peak_memory_bytes / t.device_memory_bytes
        spread = t.cost_ci95_rel if _finite(t.cost_ci95_rel) else 0.0
        cost = run_cost(hours, price, device_count(config))
        out.append(Candidate(t, hours, cost, truncated, headroom, spread or 0.0))
    return out


def _meets(c: Candidate, constraints: Constraints) -> bool:
    if constraints.max_hours is not None and c.hours > constraints.max_hours:
        return False
    if constraints.max_cost_usd is not None and c.cost > constraints.max_cost_usd:
        return False
    floor = constraints.min_memory_headroom
    return floor is None or (c.headroom is not None and c.headroom >= floor)


def _ran(t: TrialMetrics) -> dict[str, Any]:
    """The trial's config as it ran (a script's own values in place: ``as_ran``); its
    ``config`` is the one asked, the study's key of it."""
    return as_ran(t.config, t.own_values)


def _describe(config: dict[str, Any]) -> str:
    return (
        f"bs{config.get('per_device_batch_size')}×ga{config.get('gradient_accumulation_steps')} "
        f"seq{config.get('max_seq_length')}"
    )


def _eligible(
    facts: StudyFacts, candidates: list[Candidate], constraints: Constraints, price: float
) -> tuple[list[Candidate], list[str]]:
    """Candidates the answer may pick, and sentences about cheaper ones it had to leave out."""
    meets = [c for c in candidates if _meets(c, constraints)]
    if not meets:
        fastest = min(candidates, key=lambda c: (c.hours, c.trial.number))
        cheapest = min(candidates, key=lambda c: c.key)
        raise NoResultError(
            f"no completed trial of {facts.name!r} meets {constraints.describe()} at "
            f"${price:.2f}/h: the fastest takes {hours_figure(fastest.hours)} h, the cheapest "
            f"costs {money(cheapest.cost)}"
        )
    if constraints.allow_truncation:
        return meets, []
    whole = [c for c in meets if c.truncated is None]
    cover = coverage_length(facts.dataset_stats, facts.coverage_percentile)
    if not whole:
        fix = truncation_fix(facts, cover)
        raise TruncatesOnlyError(
            f"every completed trial of {facts.name!r} that meets {constraints.describe()} "
            f"truncates the data ({cover} tokens hold {facts.coverage_percentile:g}% of its "
            f"samples whole). To get an answer, {fix}",
            fix=fix,
        )
    best_whole = min(whole, key=lambda c: c.key)
    notes = []
    for c in sorted(meets, key=lambda c: c.key):
        if c.key >= best_whole.key:
            break
        if c.truncated is None:
            continue
        share = c.truncated[1]
        notes.append(
            f"trial #{c.trial.number} ({_describe(_ran(c.trial))}) costs {money(c.cost)} but "
            f"truncates {'some' if math.isnan(share) else f'{share:.1%} of the'} tokens (it "
            f"needs {cover} tokens for {facts.coverage_percentile:g}% of samples); allow "
            "truncation to consider it"
        )
    return whole, notes


def choose(
    facts: StudyFacts, trials: Sequence[TrialMetrics], constraints: Constraints | None = None
) -> Recommendation:
    """The cheapest eligible trial, compared with the baseline; see the module docstring.

    Raises NoResultError when nothing is eligible, saying what the closest trials would take.
    """
    return decide(facts, trials, constraints or Constraints())[0]


def decide(
    facts: StudyFacts, trials: Sequence[TrialMetrics], constraints: Constraints
) -> tuple[Recommendation, list[Candidate]]:
    """The recommendation and the eligible candidates it was chosen from."""
    price = constraints.usd_per_hour or facts.usd_per_hour
    candidates = _candidates(facts, trials, price)
    if not candidates:
        raise NoResultError(f"study {facts.name!r} has no completed trial yet")
    try:
        eligible, excluded = _eligible(facts, candidates, constraints, price)
    except TruncatesOnlyError as e:
        allowed = dataclasses.replace(constraints, allow_truncation=True)
        e.fallback = fallback = decide(facts, trials, allowed)[0]
        cut = fallback.truncated_tokens_share
        e.args = (
            f"{e}. Until then the cheapest config, trial #{fallback.trial_number} "
            f"({_describe(fallback.config)}), costs {money(fallback.cost_per_run_usd)}/run and "
            f"cuts {'some' if cut is None else f'{cut:.1%} of the'} tokens "
            f"({(fallback.truncated_samples_share or 0):.1%} of samples); "
            "--allow-truncation (allow_truncation=true) takes it",
        )
        raise
    baseline = _baseline(facts, candidates)
    winner, ties, tie_note = _pick(eligible, baseline)
    cheapest = min(eligible, key=lambda c: c.key)
    passed_over = cheapest if ties and cheapest is not winner else None
    t = winner.trial
    basis = Basis.stored(t.remeasures, t.contended)
    config = _ran(t)
    effective_batch = caveats.effective_batch(config)
    warnings: list[str] = []
    warnings += caveats.contention(t)
    warnings += caveats.rivals_contended(
        t.number,
        sorted(c.trial.number for c in eligible if c is not winner and c.trial.contended),
        len(eligible),
    )
    warnings += caveats.drift_warnings(c.trial for c in candidates)
    if winner.truncated is not None:
        share = winner.truncated[1]
        warnings.append(
            f"max_seq_length {config.get('max_seq_length')} truncates "
            f"{'some' if math.isnan(share) else f'{share:.1%} of the'} tokens of this dataset "
            "(allowed by request): it is cheaper partly because it trains on less text"
        )
    mismatch = caveats.device_mismatch(facts.hardware_name, t.device_name)
    if mismatch:
        warnings.append(mismatch)

    baseline_batch = suggested_lr = None
    if baseline is not None:
        baseline_batch = caveats.effective_batch(_ran(baseline.trial))
        if (
            baseline_batch is not None
            and effective_batch is not None
            and baseline_batch != effective_batch
            and facts.learning_rate is not None
        ):
            suggested_lr, advice = caveats.learning_rate_advice(
                facts.learning_rate, baseline_batch, effective_batch, facts.learning_rate_source
            )
            warnings.append(advice)
        warnings += caveats.knob_caveats(_ran(baseline.trial), config)
    saved = None if baseline is None else baseline.cost - winner.cost
    sweep_hours = facts.sweep_seconds / 3600 if facts.sweep_seconds > 0 else None
    sweep_cost = None if sweep_hours is None else sweep_hours * price
    payback = None
    if sweep_cost is not None and saved is not None and saved > 0:
        payback = max(1, math.ceil(sweep_cost / saved))
    padding = padding_share(t.tokens_per_s, t.padded_tokens_per_s)
    shares = _cut(facts, config)
    assert t.samples_per_s is not None
    recommendation = Recommendation(
        study=facts.name,
        hardware_name=facts.hardware_name,
        usd_per_hour=price,
        trial_number=t.number,
        config=config,
        own_values=dict(t.own_values or {}),
        it_per_s=t.it_per_s,
        samples_per_s=t.samples_per_s,
        tokens_per_s=t.tokens_per_s,
        hours_per_run=winner.hours,
        cost_per_run_usd=winner.cost,
        peak_memory_bytes=t.peak_memory_bytes,
        completed_trials=len(candidates),
        projection=t.projection,
        measured_on=t.device_name,
        truncated_samples_share=None if shares is None else shares[0],
        truncated_tokens_share=None if shares is None else shares[1],
        coverage_length=coverage_length(facts.dataset_stats, facts.coverage_percentile),
        padding_share=padding,
        memory_headroom=winner.headroom,
        effective_batch=effective_batch,
        warnings=tuple(warnings),
        excluded=tuple(excluded),
        baseline_trial_number=None if baseline is None else baseline.trial.number,
        baseline_hours_per_run=None if baseline is None else baseline.hours,
        baseline_cost_per_run_usd=None if baseline is None else baseline.cost,
        baseline_effective_batch=baseline_batch,
        speedup_vs_baseline=None if baseline is None else baseline.hours / winner.hours,
        usd_saved_per_run=saved,
        learning_rate=facts.learning_rate,
        suggested_learning_rate=suggested_lr,
        sweep_hours=sweep_hours,
        sweep_cost_usd=sweep_cost,
        payback_runs=payback,
        constraints=constraints.describe()
        + (" (truncation allowed)" if constraints.allow_truncation else ""),
        headline=facts.headline,
        baseline_samples_per_s=None if baseline is None else baseline.trial.samples_per_s,
        baseline_tokens_per_s=None if baseline is None else baseline.trial.tokens_per_s,
        cost_ci95_rel=winner.spread or None,
        measurements=basis.measured,
        measurements_left_out=basis.left_out,
        ties=tuple(c.trial.number for c in ties if c is not winner),
        tie_note=tie_note,
        cheapest_trial_number=None if passed_over is None else passed_over.trial.number,
        cheapest_cost_per_run_usd=None if passed_over is None else passed_over.cost,
        contended=basis.contended,
        devices=device_count(config),
        scaling=tuple(
            scaling_of((c.trial for c in candidates), facts.name, facts.listed.get("devices"))
        ),
    )
    return recommendation, eligible


# how much dearer by its figure a tied config may be and still win for its lower peak memory
MEMORY_TRADE = 0.05


def _pick(
    eligible: list[Candidate], baseline: Candidate | None = None
) -> tuple[Candidate, list[Candidate], str | None]:
    """The winner, the candidates that tie with the cheapest (``noise.tie``: the interval of
    their $/run ratio to it holds 1 or lies within 2% of it, as the knob table reads an
    effect), and why the winner was picked among them: the baseline when it ties (no
    measured config beats the user's own beyond the noise: switching buys nothing known),
    else the least peak memory among the ties whose $/run figure is within ``MEMORY_TRADE``
    of the cheapest's, then the lower $/run. Wide intervals can tie configs far apart by their
    figures; the figure is still the best guess, so memory does not buy more than 5% of it."""
    cheapest = min(eligible, key=lambda c: c.key)
    ties = sorted(
        (c for c in eligible if tie(cheapest.cost, cheapest.spread, c.cost, c.spread)),
        key=lambda c: c.key,
    )
    if len(ties) < 2:
        return cheapest, [], None
    # memory is worth a little of the figure, not any of it: a tie of wide (contended)
    # intervals held configs 1.8x the cheapest's figure, and the least memory among them won
    # on a CPU with 98% headroom (a re-walk's N3)
    close = [c for c in ties if c.cost <= cheapest.cost * (1 + MEMORY_TRADE)]
    if baseline is not None and baseline in ties:
        winner = baseline
    else:
        winner = min(
            close,
            key=lambda c: (
                c.trial.peak_memory_bytes if c.trial.peak_memory_bytes is not None else math.inf,
                *c.key,
            ),
        )
    others = ", ".join(
        f"#{c.trial.number} ({cost_text(c.cost, c.spread or None)}"
        + (", the cheapest measured" if c is cheapest else "")
        + (f", {_gb(c.trial.peak_memory_bytes)} peak" if c.trial.peak_memory_bytes else "")
        + ")"
        for c in ties
        if c is not winner
    )
    if winner is baseline:
        why = "being the baseline: no config measured so far beats it beyond the noise"
    elif winner is not cheapest and winner.trial.peak_memory_bytes is not None:
        why = f"the least peak memory ({_gb(winner.trial.peak_memory_bytes)})"
        if len(close) < len(ties):
            why += f" among those within {MEMORY_TRADE:.0%} of the cheapest's figure"
    else:
        why = "the lowest $/run"
    lighter = [
        c
        for c in ties
        if c not in close
        and c.trial.peak_memory_bytes is not None
        and c.trial.peak_memory_bytes < (winner.trial.peak_memory_bytes or math.inf)
    ]
    if lighter and winner is not baseline:
        names = ", ".join(f"#{c.trial.number} ({c.cost / cheapest.cost:.2f}x)" for c in lighter)
        why += (
            f"; {names} {'needs' if len(lighter) == 1 else 'need'} less memory but "
            f"{'costs' if len(lighter) == 1 else 'cost'} more by its figure than the "
            f"{MEMORY_TRADE:.0%} less memory may buy"
        )
    return winner, ties, f"ties within the noise with {others}; picked for {why}"


def _gb(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e9:.2f} GB"


def _cut(facts: StudyFacts, config: dict[str, Any]) -> tuple[float, float] | None:
    """(samples, tokens) shares ``config`` cuts off the dataset, or None if unknown."""
    if config.get("packing") and not packing_cuts(facts, config):
        return 0.0, 0.0  # packed blocks continue a long sample instead of cutting it
    seq = config.get("max_seq_length")
    return None if not isinstance(seq, int) else truncation(facts.dataset_stats, seq)


def _baseline(facts: StudyFacts, candidates: list[Candidate]) -> Candidate | None:
    if not facts.baseline:
        return None
    from sweeper.knobs import KNOBS, normalize

    # configs stored before a knob existed lack it: both take the knob's default
    baseline = normalize(facts.baseline)
    # a required knob is stored as it ran (never defaulted): most configs differ there, and
    # only the rest are normalized (once each; at 10,000 trials this took half of best())
    required = [(k.name, baseline.get(k.name)) for k in KNOBS if k.required]

    def same(config: dict[str, Any]) -> bool:
        if any(config.get(name) != value for name, value in required):
            return False
        normal = normalize(config)
        return all(normal.get(k) == v for k, v in baseline.items())

    matches = [c for c in candidates if same(c.trial.config)]
    return min(matches, key=lambda c: c.trial.number) if matches else None


def _own_loss(measured: Mapping[str, Any], facts: StudyFacts) -> list[str]:
    """A program that took the loss on the replies only where the space says every token
    (read from its batches' labels: ``Measurement.loss_labels``): the figures are its own,
    and the exports follow what ran (a walk's script masked its prompts under loss: all)."""
    if facts.chat_loss != "all" or measured.get("loss_labels") != "replies":
        return []
    return [
        "your program took the loss on the assistant's replies only (its labels mask the "
        "prompts), while the space says workload.dataset.loss: all: the figures and the "
        "exports are your program's (replies only); set loss: completion in the space to say "
        "so, or label every token in your program if that is what the run should do"
    ]


def _own_length(measured: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """No truncation shares, and the warning why, where the program cut its rows at a length
    of its own, unseen (``max_seq_length`` among ``Measurement.unreached``): the config's
    length never ran, so what it cuts is not the config's (a walk's script kept its own 1536
    and the answer said "truncates 0.0%" of 2432)."""
    if "max_seq_length" not in (measured.get("unreached") or ()):
        return {}, []
    return {"truncated_samples_share": None, "truncated_tokens_share": None}, [
        "your script cut its rows at a length of its own, which sweeper never saw (no flag of "
        "the trials gave it max_seq_length, and it never called sweeper.trial_config()): what "
        "the run truncates is not known, and the length shown is not what ran. Give the "
        "length on the command (--max_seq_length N, which the trials then set), or read it "
        "from sweeper.trial_config()"
    ]


def best(store: Store, study: str, constraints: Constraints | None = None) -> Recommendation:
    """The recommendation for ``study`` from the store (see ``choose``)."""
    facts = StudyFacts.of(store.get_study(study))
    trials = store.trial_metrics(study, states=["complete"])
    try:
        recommendation = choose(facts, trials, constraints)
    except NoResultError as e:
        if not str(e).endswith("has no completed trial yet"):
            raise
        raise NoResultError(f"{e}{caveats.why_none(store, study)}") from None
    winner = store.get_trial(study, recommendation.trial_number)
    measured = (winner.measurement if winner is not None else None) or {}
    ran_lr = (measured.get("program_run") or {}).get("learning_rate")
    if ran_lr is not None:
        # a script's own learning rate, as it ran, is what the advice scales (a walk's
        # `--lr 3e-4` was told to go from the space's default 1e-4 to 2.8e-4)
        facts = dataclasses.replace(
            facts, learning_rate=ran_lr, learning_rate_source="your program's, as it ran"
        )
        recommendation = (  # the pick does not depend on the rate: only the advice is redone
            choose(facts, trials, constraints)
            if recommendation.suggested_learning_rate is not None
            else recommendation.model_copy(update={"learning_rate": ran_lr})
        )
    unweighed = caveats.unmeasured(facts.listed, store.trial_metrics(study))
    n_params, trainable = measured.get("n_params"), measured.get("trainable_params")
    unseen_cut, unseen_said = _own_length(measured)
    recommendation = recommendation.model_copy(
        update={
            "loss_labels": measured.get("loss_labels"),
            "unreached": tuple(measured.get("unreached") or ()),
            "thread_env": {
                name: value
                for name, value in ((measured.get("env") or {}).get("runtime_env") or {}).items()
                if name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
            },
            **unseen_cut,
            "reply_markers": measured.get("reply_markers"),
            "unmeasured": unweighed,
            # read off the trial that ran (sweeper.measurement.Measurement)
            "warnings": (
                *recommendation.warnings,
                *caveats.ran_warnings(measured, winner.config if winner is not None else None),
                *caveats.mismatched(store, study),
                *unseen_said,
                *_own_loss(measured, facts),
                # said at launch; the answer prices it too (a walk saw it at launch only)
                *([facts.saves_note] if facts.saves_note else []),
                *([facts.epochs_note] if facts.epochs_note else []),
                *caveats.program_run_warnings(
                    measured,
                    epochs=facts.epochs,
                    samples=facts.samples,
                    dataset_rows=(facts.dataset_stats or {}).get("dataset_rows"),
                    projection=recommendation.projection,
                    usd_per_hour=recommendation.usd_per_hour,
                    devices=recommendation.devices,
                ),
            ),
        }
    )
    if not isinstance(n_params, int):
        return recommendation
    return recommendation.model_copy(
        update={
            "n_params": n_params,
            "trainable_params": trainable if isinstance(trainable, int) else n_params,
        }
    )
