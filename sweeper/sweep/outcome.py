"""What one config gave, as the search loop keeps it."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.noise import Sample
from sweeper.search import INFEASIBLE_KINDS


@dataclass(frozen=True)
class Outcome:
    """What one config gave: its $/run, or how it failed (``failure_kind``: FAILURE_KINDS)."""

    number: int
    cost: float | None = None
    failure_kind: str | None = None
    predicted: bool = False  # not run: known to fail from another trial (out of memory)
    spread: float = 0.0  # half-width of the $/run's 95% interval, relative (0: unknown)
    sample: Sample | None = None  # the measurement (``sweeper.noise``), when it was measured

    @property
    def feasible(self) -> bool:
        return self.cost is not None

    @property
    def infeasible(self) -> bool:
        return self.failure_kind in INFEASIBLE_KINDS
