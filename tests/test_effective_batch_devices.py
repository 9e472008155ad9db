"""``effective_batch: {fixed: K}`` with ``devices`` > 1: accumulation is K ÷ (batch × devices),
derived once the device count is chosen; a pair K does not divide is skipped saying why, and a
device count no listed batch can serve is refused when the space loads."""

from __future__ import annotations

import re

import optuna
import pytest

from sweeper.errors import SpaceError
from sweeper.space import optuna_params, parse_space, suggest
from tests.helpers import tiny_config
from tests.test_space import _search


def test_fixed_effective_batch_counts_the_devices() -> None:
    # the tiny space's batches are [2, 4]
    space = parse_space(_search("  effective_batch: {fixed: 8}\n  devices: [1, 2, 4]\n", ""))
    grid = list(space.search.grid())
    assert {(c.per_device_batch_size, c.devices, c.gradient_accumulation_steps) for c in grid} == {
        (2, 1, 4),
        (4, 1, 2),
        (2, 2, 2),
        (4, 2, 1),
        (2, 4, 1),
    }  # 4 × 4 > 8: no accumulation
    assert {c.effective_batch for c in grid} == {8}
    assert all(space.search.runnable(c) is None for c in grid)

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen_skip = False
    for _ in range(40):
        trial = study.ask()
        config = suggest(trial, space.search)
        assert "gradient_accumulation_steps" not in trial.params
        assert optuna_params(config, space.search) == trial.params
        reason = space.search.runnable(config)
        if (config.per_device_batch_size, config.devices) == (4, 4):
            seen_skip = True
            assert reason is not None and reason.startswith(
                "effective_batch.fixed 8 is not a multiple of per_device_batch_size 4 × "
                "devices 4: no gradient accumulation makes it"
            ), reason
        else:
            assert reason is None and config.effective_batch == 8, (config, reason)
        study.tell(trial, 1.0)
    assert seen_skip  # 40 random draws over 6 (batch, devices) pairs


def test_the_batch_guard_no_longer_refuses_every_multi_device_config() -> None:
    """What happened before: accumulation K ÷ batch, then devices × that: 2 × 4 × 2 = 16."""
    space = parse_space(_search("  effective_batch: {fixed: 8}\n  devices: [1, 2]\n", ""))
    two = tiny_config(per_device_batch_size=2, gradient_accumulation_steps=2, devices=2)
    assert space.search.admits(two) is None and space.search.runnable(two) is None
    doubled = tiny_config(per_device_batch_size=2, gradient_accumulation_steps=4, devices=2)
    assert space.search.admits(doubled) == "effective batch 16 is not fixed at 8"


def test_a_device_count_no_batch_divides_is_refused() -> None:
    with pytest.raises(
        SpaceError,
        match=re.escape(
            "effective_batch.fixed 8 is not a multiple of batch × devices for any "
            "per_device_batch_size [2, 4] with devices 3"
        ),
    ):
        parse_space(_search("  effective_batch: {fixed: 8}\n  devices: [1, 3]\n", ""), "s.yaml")
