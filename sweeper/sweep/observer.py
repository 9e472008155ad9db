"""What the CLI (or a test) hears while a sweep runs."""

from __future__ import annotations

from typing import Protocol

from sweeper.space import TrialConfig
from sweeper.store import TrialRow
from sweeper.trial.protocol import PreparedData


class SweepObserver(Protocol):
    """Told each step of a sweep as it happens; ``sweeper.console.RichObserver`` draws them."""

    def prepare_started(self) -> None: ...
    def prepare_done(self, prepared: PreparedData, wall_s: float) -> None: ...
    def trial_started(self, number: int, config: TrialConfig) -> None: ...
    def trial_done(self, row: TrialRow) -> None: ...
    def remeasuring(self, number: int | None) -> None:
        """Trial ``number``'s config is being measured again (None: that ended)."""

    def note(self, message: str) -> None: ...
    def planned(self, trials: int) -> None:
        """This launch can run only ``trials`` (the space's configs not yet measured)."""


class SilentObserver:
    """Hears everything and says nothing (benches, tests, ``sweeper doctor``)."""

    def prepare_started(self) -> None:
        pass

    def prepare_done(self, prepared: PreparedData, wall_s: float) -> None:
        pass

    def trial_started(self, number: int, config: TrialConfig) -> None:
        pass

    def trial_done(self, row: TrialRow) -> None:
        pass

    def remeasuring(self, number: int | None) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def planned(self, trials: int) -> None:
        pass
