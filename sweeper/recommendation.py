"""The answer ``sweeper.recommend`` gives: one frozen ``Recommendation`` and how it reads.

It is also the REST API's response schema (``api.schemas``); the CLI, the dashboard and the
exports render it with the text methods here (``interval_text``, ``throughput_text``, ...) and
``cost_text``, so a $/run with its 95% interval reads the same everywhere.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, computed_field

from sweeper.cost import money, one_off_text
from sweeper.noise import Basis
from sweeper.scaling import Scaling


class Unmeasured(BaseModel):
    """What the recommendation could not weigh, because no trial measured it: the configs the
    sweep asked for whose every trial ended without a measurement, and the values the space's
    search lists that no completed trial ran (preflight dropped them on this machine, the
    sweep skipped them, or each trial with them failed). They were not ruled out on merit."""

    model_config = ConfigDict(frozen=True)

    configs: int = 0  # distinct configs asked for, none of whose trials completed
    # those configs by how their last trial ended: failed (its kind: oom, error, timeout, ...)
    # or pruned (an out-of-memory predicted from a lighter config's)
    ended: dict[str, int] = {}
    values: dict[str, list[Any]] = {}  # knob → the listed values no completed trial ran
    # of those, the values no trial asked for at all (the budget ended first, or preflight
    # dropped them on this machine): no failure to read about
    untried: dict[str, list[Any]] = {}

    def text(self) -> str:
        """One line, the configs and values the answer could not weigh.

        >>> print(Unmeasured(configs=2, ended={"oom": 1, "error": 1},
        ...     values={"quantization": ["4bit"], "devices": [2]}).text())
        ... # doctest: +NORMALIZE_WHITESPACE
        not measured, so not ruled out on merit: 2 configs the sweep tried whose trials all
        ended without a measurement (1 oom, 1 error), and listed values no completed trial
        ran: quantization 4bit; devices 2 (the study page has each failure's message)
        >>> print(Unmeasured(values={"per_device_batch_size": [4, 8]},
        ...     untried={"per_device_batch_size": [4, 8]}).text())
        ... # doctest: +NORMALIZE_WHITESPACE
        not measured, so not ruled out on merit: listed values no completed trial ran:
        per_device_batch_size 4, 8 (no trial asked for per_device_batch_size 4, 8: the sweep
        ended first, or launch dropped them on this machine and said why; launch the study
        again to measure what this machine can run)
        """
        parts = []
        if self.configs:
            how = ", ".join(f"{n} {kind}" for kind, n in self.ended.items())
            parts.append(
                f"{self.configs} config{'' if self.configs == 1 else 's'} the sweep tried "
                f"whose trials all ended without a measurement" + (f" ({how})" if how else "")
            )
        if self.values:
            said = "; ".join(
                f"{knob} {', '.join(_value_text(v) for v in listed)}"
                for knob, listed in self.values.items()
            )
            parts.append(f"listed values no completed trial ran: {said}")
        tails = []
        failed = {k: [v for v in vs if v not in self.untried.get(k, [])]
                  for k, vs in self.values.items()}  # fmt: skip
        if self.configs or any(failed.values()):
            tails.append("the study page has each failure's message")
        if self.untried:
            said = "; ".join(
                f"{knob} {', '.join(_value_text(v) for v in listed)}"
                for knob, listed in self.untried.items()
            )
            tails.append(
                f"no trial asked for {said}: the sweep ended first, or launch dropped "
                f"{'it' if sum(map(len, self.untried.values())) == 1 else 'them'} on this "
                "machine and said why; launch the study again to measure what this machine "
                "can run"
            )
        return (
            "not measured, so not ruled out on merit: "
            + ", and ".join(parts)
            + (f" ({'; '.join(tails)})" if tails else "")
        )


def _value_text(value: Any) -> str:
    return (
        "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


class Recommendation(BaseModel):
    """The cheapest eligible trial of a study; also the REST API's response schema."""

    model_config = ConfigDict(frozen=True)

    study: str
    hardware_name: str
    usd_per_hour: float  # one device's: a run on N devices costs hours × N × this
    trial_number: int
    # the winner's config as it ran (``knob_values.as_ran``): a script's own values in place
    config: dict[str, Any]
    # of those, the knobs the script ran at its own values (not searched, not given to it)
    own_values: dict[str, Any] = {}
    # the knobs that never reached the script (Measurement.unreached): their values here are
    # the config's, which did not run; the script ran its own, unseen
    unreached: tuple[str, ...] = ()
    # the CPU thread variables (OMP_NUM_THREADS, MKL_NUM_THREADS) the winning trial started
    # with (Measurement.runtime_env): a run without them gets torch's default threads
    thread_env: dict[str, str] = {}
    it_per_s: float | None
    samples_per_s: float
    tokens_per_s: float | None
    hours_per_run: float | None
    cost_per_run_usd: float
    peak_memory_bytes: int | None
    completed_trials: int
    # train hours, one-time seconds (and where they come from: Measurement.one_off_sources)
    projection: dict[str, Any] | None = None
    measured_on: str | None = None
    truncated_samples_share: float | None = None
    truncated_tokens_share: float | None = None
    coverage_length: int | None = None  # tokens a max_seq_length needs to not truncate
    padding_share: float | None = None  # of the tokens computed, the share that is padding
    memory_headroom: float | None = None  # 1 - peak ÷ device memory
    effective_batch: int | None = None
    warnings: tuple[str, ...] = ()
    excluded: tuple[str, ...] = ()  # cheaper configs left out, and why
    baseline_trial_number: int | None = None
    baseline_hours_per_run: float | None = None
    baseline_cost_per_run_usd: float | None = None
    baseline_effective_batch: int | None = None
    speedup_vs_baseline: float | None = None  # baseline hours ÷ recommended hours
    usd_saved_per_run: float | None = None
    learning_rate: float | None = None  # the space's (the baseline's) learning rate
    suggested_learning_rate: float | None = None  # scaled to the new effective batch
    sweep_hours: float | None = None  # device-hours the sweep itself used (N GPUs: N×)
    sweep_cost_usd: float | None = None
    payback_runs: int | None = None  # runs of the job until the sweep has paid for itself
    constraints: str = "no constraint"
    headline: Literal["samples", "tokens"] = "samples"  # the throughput to lead with
    baseline_samples_per_s: float | None = None
    baseline_tokens_per_s: float | None = None
    n_params: int | None = None  # the model's parameters (4-bit weights unpacked)
    trainable_params: int | None = None  # what trains: fewer than n_params with an adapter
    cost_ci95_rel: float | None = None  # half-width of the $/run's 95% interval, relative
    # the winning config's measurements, all taken (``measured_as`` says which count)
    measurements: int = 1
    # contended ones its calm mean left out (0 when every one was contended: the fastest counts)
    measurements_left_out: int = 0
    # other trials whose $/run ties with the cheapest's (``sweeper.noise.tie``)
    ties: tuple[int, ...] = ()
    tie_note: str | None = None  # why the winner was picked among them
    # when the winner ties with a cheaper config and was picked over it: that config's trial
    # and $/run (the cheapest measured that the answer could pick)
    cheapest_trial_number: int | None = None
    cheapest_cost_per_run_usd: float | None = None
    contended: bool = False  # every measurement of the winner was on a shared machine
    # what the winning trial's loss was taken on ("all" tokens or the assistant's "replies"),
    # and whether the chat template marks the replies ({% generation %}), which TRL's
    # assistant_only_loss needs (None: not recorded, or no chat records)
    loss_labels: str | None = None
    reply_markers: bool | None = None
    devices: int = 1  # the winner's (its $/run rents this many devices)
    # each multi-device trial against the same config on one device (``sweeper.scaling``)
    scaling: tuple[Scaling, ...] = ()
    # what no trial measured, so the answer could not weigh it (None: every config asked for
    # and every listed value was measured)
    unmeasured: Unmeasured | None = None

    @property
    def winner_scaling(self) -> Scaling | None:
        """The winner's scaling row, when it runs on several devices."""
        return next((s for s in self.scaling if s.trial_number == self.trial_number), None)

    @property
    def one_off_text(self) -> str:
        """Where the winner's checkpoint and compile figures come from (``cost.one_off_text``)."""
        return one_off_text(self.projection)

    @property
    def keeps_baseline(self) -> bool:
        """The answer is the user's own config: nothing measured beats it beyond the noise."""
        return self.baseline_trial_number == self.trial_number

    KEEP_BASELINE: ClassVar[str] = "no config measured so far beats it beyond the noise: keep it"

    @property
    def keep_baseline_text(self) -> str:
        """Why the answer is the baseline: nothing beat it, or nothing else completed to be
        compared with it (a re-walk's N2: every other trial failed, as a mismatch, and "keep
        it" read as if the baseline had been compared)."""
        if self.completed_trials <= 1:
            return (
                "no other config completed, so nothing has been compared with it yet (the "
                "other trials failed or have not run): it stands only until another is measured"
            )
        return self.KEEP_BASELINE

    @property
    def basis(self) -> Basis:
        """Which of the winner's measurements its figures stand on (``sweeper.noise.Basis``)."""
        return Basis(self.measurements, self.contended, self.measurements_left_out)

    @computed_field(  # type: ignore[prop-decorator]
        description="which of the winner's measurements its throughput and $/run stand on: "
        "'mean of 3 measurements', or 'fastest of 4 measurements, all on a shared machine' "
        "(sharing only slows a run, so the fastest counts; its interval is at least the "
        "measurements' spread)"
    )
    @property
    def measured_as(self) -> str:
        return self.basis.text()

    def interval_text(self) -> str:
        """'$12.50 ±2.1%/run (mean of 3 measurements)': the $/run with its 95% interval and
        what it stands on."""
        return cost_text(self.cost_per_run_usd, self.cost_ci95_rel, self.basis)

    def pick_text(self) -> str:
        """Why this trial, in a few words: 'the cheapest of 3 completed trials', or, when it
        ties with a cheaper one and was picked over it, that it is not the cheapest measured,
        which one is, and that the two tie within the noise (``tie_note`` says why this one).

        >>> rec = Recommendation.model_construct(completed_trials=3, ties=(0,),
        ...     cheapest_trial_number=0, cheapest_cost_per_run_usd=0.0021)
        >>> import textwrap; print(textwrap.fill(rec.pick_text(), 80))
        not the cheapest measured: #0 is, at $0.0021/run, but the two tie within the
        noise (3 completed trials)
        >>> rec.model_copy(update={"ties": (), "cheapest_trial_number": None}).pick_text()
        'the cheapest of 3 completed trials'
        """
        completed = f"{self.completed_trials} completed trial" + (
            "" if self.completed_trials == 1 else "s"
        )
        if not self.ties:
            return f"the cheapest of {completed}"
        others = ", ".join(f"#{n}" for n in self.ties)
        if self.cheapest_trial_number is None or self.cheapest_cost_per_run_usd is None:
            verb = "ties" if len(self.ties) == 1 else "tie"
            return f"the cheapest of {completed}; {others} {verb} with it within the noise"
        together = "the two" if len(self.ties) == 1 else f"the {len(self.ties) + 1}"
        return (
            f"not the cheapest measured: #{self.cheapest_trial_number} is, at "
            f"{money(self.cheapest_cost_per_run_usd)}/run, but {together} tie within the noise "
            f"({completed})"
        )

    def throughput_text(self) -> str:
        """'12,193 tokens/s (1.7 samples/s)' or '17.1 samples/s (12,193 tokens/s)': the
        headline first."""
        return _throughput_text(self.headline, self.samples_per_s, self.tokens_per_s)

    def baseline_throughput_text(self) -> str | None:
        """The baseline's headline throughput and the recommended one: 'tokens/s 22,089 →
        40,310', or None without a baseline."""
        if self.baseline_samples_per_s is None:
            return None
        if self.headline == "tokens" and self.tokens_per_s and self.baseline_tokens_per_s:
            return f"{self.baseline_tokens_per_s:,.0f} → {self.tokens_per_s:,.0f} tokens/s"
        return f"{self.baseline_samples_per_s:,.1f} → {self.samples_per_s:,.1f} samples/s"

    def trainable_text(self) -> str | None:
        """'trains 1.6M of 3.82B parameters (0.04%)' when fewer than all of them train."""
        if self.n_params is None or self.trainable_params is None:
            return None
        if self.trainable_params >= self.n_params:
            return f"trains all {param_count(self.n_params)} parameters"
        share = self.trainable_params / self.n_params
        return (
            f"trains {param_count(self.trainable_params)} of {param_count(self.n_params)} "
            f"parameters ({share:.2%})"
        )


def cost_text(cost: float, ci95_rel: float | None, basis: Basis | None = None) -> str:
    """A $/run with its 95% interval, as the CLI and the dashboard show it, and which
    measurements it stands on (``sweeper.noise.Basis``; one calm measurement goes unsaid).

    An interval of ±100% or more would reach $0: the figure is said to be too noisy to price.

    >>> cost_text(12.5, 0.021, Basis(3)), cost_text(12.5, None)
    ('$12.50 ±2.1%/run (mean of 3 measurements)', '$12.50/run')
    >>> cost_text(0.0015, 0.514, Basis(4, contended=True))
    '$0.0015 ±51.4%/run (fastest of 4 measurements, all on a shared machine)'
    >>> cost_text(0.58, 1.3)
    '$0.58/run (±130%, too noisy to price: measure it again on a calm machine)'
    """
    said = basis is not None and (basis.measured > 1 or basis.contended)
    words = basis.text() if basis is not None and said else ""
    if ci95_rel is not None and ci95_rel >= 1:
        lead = f"{words}, " if words else ""
        return (
            f"{money(cost)}/run ({lead}±{ci95_rel:.0%}, too noisy to price: measure it again "
            "on a calm machine)"
        )
    interval = f" ±{ci95_rel:.1%}" if ci95_rel else ""
    return f"{money(cost)}{interval}/run" + (f" ({words})" if words else "")


def param_count(n: int) -> str:
    """A parameter count in three figures.

    >>> param_count(3_821_079_552), param_count(1_572_864), param_count(950)
    ('3.82B', '1.57M', '950')
    """
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _throughput_text(headline: str, samples_per_s: float, tokens_per_s: float | None) -> str:
    samples = f"{samples_per_s:,.1f} samples/s"
    if tokens_per_s is None:
        return samples
    tokens = f"{tokens_per_s:,.0f} tokens/s"
    return f"{tokens} ({samples})" if headline == "tokens" else f"{samples} ({tokens})"
