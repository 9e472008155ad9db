"""How well a config scales over N devices, measured in one study.

For each completed trial on N > 1 devices: the same config on one device (every other knob
equal; ``data_parallel`` does not apply there) measured in the same study, and

    scaling efficiency = samples/s(N) ÷ (N × samples/s(1))

1.0 is linear; below it, each device of the group does less than it does alone (communication,
the slowest rank, a sharded model's gathers). Without the 1-device measurement the row says it
is missing and how to get it, never a guess. A run on N devices is priced hours × N × the
device's $/h (``sweeper.cost.run_cost``), so a group is cheaper than one device only where
its efficiency beats the ratio of the prices.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from sweeper.cost import device_count


class Scaling(BaseModel):
    """One multi-device trial against the same config on one device."""

    model_config = ConfigDict(frozen=True)

    trial_number: int
    devices: int
    data_parallel: str | None
    samples_per_s: float
    single_trial_number: int | None = None  # the 1-device trial of the same config
    single_samples_per_s: float | None = None
    efficiency: float | None = None  # samples/s(N) ÷ (N × samples/s(1)); None: missing
    note: str = ""

    def text(self) -> str:
        """'#7 on 2 devices (ddp): 1.62× one device's samples/s, 81% scaling efficiency
        (against #3)', or why there is no figure."""
        head = f"#{self.trial_number} on {self.devices} devices ({self.data_parallel or '?'})"
        if self.efficiency is None or self.single_samples_per_s is None:
            return f"{head}: {self.note}"
        ratio = self.samples_per_s / self.single_samples_per_s
        return (
            f"{head}: {ratio:.2f}× one device's samples/s, {self.efficiency:.0%} scaling "
            f"efficiency (against #{self.single_trial_number})"
        )


def single_key(config: Mapping[str, Any]) -> str:
    """The config as it runs on one device: the key its 1-device twin has."""
    from sweeper.knobs import normalize

    one = normalize({**config, "devices": 1, "data_parallel": None})
    return json.dumps(one, sort_keys=True, default=str)


def scaling_of(
    trials: Iterable[Any], study: str | None = None, devices_listed: Sequence[int] | None = None
) -> list[Scaling]:
    """The scaling of each multi-device trial among ``trials`` (completed trials with
    ``number``, ``config`` and ``samples_per_s``: ``TrialMetrics``), fewest devices and
    cheapest-numbered first. Only configs are normalized where a multi-device trial exists.
    ``study`` and its ``devices_listed`` (search.devices) make a missing twin's advice one
    the study can follow."""
    listed = [t for t in trials if t.samples_per_s and t.samples_per_s > 0]
    groups = [t for t in listed if device_count(t.config) > 1]
    if not groups:
        return []
    singles: dict[str, Any] = {}
    for t in listed:
        if device_count(t.config) == 1:
            key = single_key(t.config)
            if key not in singles or t.number < singles[key].number:
                singles[key] = t
    out = []
    for t in sorted(groups, key=lambda t: (device_count(t.config), t.number)):
        n = device_count(t.config)
        one = singles.get(single_key(t.config))
        common = {
            "trial_number": t.number,
            "devices": n,
            "data_parallel": t.config.get("data_parallel"),
            "samples_per_s": t.samples_per_s,
        }
        if one is None:
            out.append(Scaling(**common, note=_missing_note(study, devices_listed, n)))
            continue
        shared = [x for x in (t, one) if getattr(x, "contended", False)]
        out.append(
            Scaling(
                **common,
                single_trial_number=one.number,
                single_samples_per_s=one.samples_per_s,
                efficiency=None if shared else t.samples_per_s / (n * one.samples_per_s),
                note=_shared_note(t, one, shared) if shared else "",
            )
        )
    return out


def _shared_note(group: Any, one: Any, shared: list[Any]) -> str:
    """Why a pair measured on a shared machine gives no efficiency: other work slows each
    trial by its own factor (a walk's 2-core CPU said 1365% from a 1-device trial beside busy
    loops), so their ratio says how busy the machine was, not how the config scales."""
    named = " and ".join(f"#{x.number}" for x in shared)
    ratio = group.samples_per_s / one.samples_per_s
    return (
        f"no scaling efficiency: {named} {'was' if len(shared) == 1 else 'were'} measured only "
        f"while the machine was shared ({ratio:.2f}× #{one.number}'s samples/s on 1 device, a "
        "ratio of how busy the machine was, not of how the config scales); measure both again "
        "on a quiet machine"
    )


def _missing_note(study: str | None, devices_listed: Sequence[int] | None, n: int) -> str:
    """How to measure a group's missing 1-device twin. A study keeps its search lists (a
    changed list is refused), and the API queues only configs of them: a walk followed the
    old advice ("list 1 in search.devices and run it, e.g. `sweeper launch --study NAME`, or
    queue it from the API") down three refused routes."""
    head = "no scaling efficiency: the same config on 1 device is not measured in this study"
    name = study or "NAME"
    if devices_listed is not None and 1 not in devices_listed:
        return (
            f"{head}, and its search.devices {list(devices_listed)} lists no 1, which a study "
            f"keeps: to measure both, launch the space as a new study whose search.devices "
            f"lists 1 and {n} (study: {name}-scaling)"
        )
    return (
        f"{head} yet: queue it (POST /api/studies/{name}/trials with the config at devices 1, "
        f"data_parallel null; the running sweep or the next `sweeper launch --study {name}` "
        "measures it)"
    )
