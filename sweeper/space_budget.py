"""The ``budget:`` section of a space: what a sweep may spend, when it stops early, and when it
measures a config again.

``sweeper.sweep.stopping`` enforces the limits and ``patience``/``planned_runs``;
``sweeper.sweep.remeasure`` runs the re-measures ``Remeasure`` asks for.
"""

from __future__ import annotations

from pydantic import Field

from sweeper.job import Frozen as _Frozen


class Remeasure(_Frozen):
    """Measuring configs again (``sweeper.noise``): a config measured once knows its window's
    noise, not the run-to-run noise of the machine, nor whether the machine drifted."""

    rounds: int = Field(
        default=2,
        ge=0,
        description="at the end, re-measure the best configs whose $/run intervals overlap, "
        "interleaved (A, B, A, B ...), at most this many rounds, until they separate (0: never)",
    )
    top: int = Field(default=3, ge=2, description="at most this many configs take part")
    drift_every: int | None = Field(
        default=10,
        gt=0,
        description="re-measure the reference config (the baseline, else the first measured) "
        "after every this many measured trials, to see whether the machine drifted (null: never)",
    )
    contended_reruns: int = Field(
        default=1,
        ge=0,
        description="measure a config again, at once, up to this many times while the machine "
        "was shared during its window (other processes' CPU, steal, another GPU process)",
    )
    contended_later: int = Field(
        default=2,
        ge=0,
        description="a config still contended after its reruns is measured again later, up to "
        "this many times, each right after a trial that measured calm (the machine is quiet "
        "again); one such measurement per calm trial",
    )


class Budget(_Frozen):
    """What the sweep may spend: trials, minutes, device-hours or dollars (the first spent
    stops it), and when it stops early: no trial beyond noise has improved for ``patience``
    trials."""

    n_trials: int = Field(default=12, gt=0, description="trials to measure (launch --n-trials)")
    max_minutes: float | None = Field(
        default=None,
        gt=0,
        description="stop starting trials after this many minutes (preparation and preflight "
        "count); no trial starts with less time left than the longest so far took",
    )
    max_device_hours: float | None = Field(
        default=None, gt=0, description="the same limit in device-hours (N devices spend N)"
    )
    max_usd: float | None = Field(
        default=None,
        gt=0,
        description="the same limit in dollars, each device a trial holds priced at "
        "hardware.usd_per_hour",
    )
    patience: int | None = Field(
        default=None,
        gt=0,
        description="stop after this many measured trials in a row without a $/run better "
        "than the best so far by more than both trials' 95% intervals",
    )
    planned_runs: int | None = Field(
        default=None,
        gt=0,
        description="how many times the real job will run: stop when the next trial is expected "
        "to cost more than it would save over these runs (null: no such stop)",
    )
    remeasure: Remeasure = Remeasure()
    seed: int = 0

    def minutes(self, usd_per_hour: float) -> float | None:
        """The tightest of the time limits, in minutes (None: no limit).

        >>> Budget(n_trials=9, max_minutes=90, max_usd=2.5).minutes(2.5)
        60.0
        """
        limits = [
            self.max_minutes,
            None if self.max_device_hours is None else 60 * self.max_device_hours,
            None if self.max_usd is None else 60 * self.max_usd / usd_per_hour,
        ]
        known = [m for m in limits if m is not None]
        return min(known) if known else None
