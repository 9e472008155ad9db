"""What a launch runs before the sampler proposes anything: the user's known configs, then the
configs whose trial was interrupted or lost with its worker, once more."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from sweeper.space import Space, TrialConfig, optuna_params
from sweeper.store import Store, TrialRow

LOST_RETRIES = 1  # a config whose worker died, or whose trial was interrupted, runs again once


def json_key(config: Mapping[str, Any]) -> str:
    """A config as a comparable key (its JSON with sorted keys)."""
    return json.dumps(config, sort_keys=True, default=str)


def times_lost(trials: Sequence[TrialRow], config: Mapping[str, Any], kind: str = "lost") -> int:
    """How many of ``trials`` ran ``config`` and were lost with their worker (or ended with
    failure ``kind``: ``interrupted``)."""
    key = json_key(config)
    return sum(t.failure_kind == kind and json_key(t.config) == key for t in trials)


def enqueue_known(study: optuna.Study, space: Space) -> None:
    """The user's current config runs first (every result is compared with it), then
    also_try's, before the sampler proposes anything."""
    for known in space.known_configs():
        study.enqueue_trial(optuna_params(known, space.search), skip_if_exists=True)


def enqueue_interrupted(store: Store, study: optuna.Study, space: Space) -> None:
    """Configs whose trial was interrupted (by the user, or when the time budget ran out) and
    that no other trial has measured run first at this launch, once more."""
    trials = store.list_trials(space.study)
    measured = {json_key(t.config) for t in trials if t.failure_kind != "interrupted"}
    queued = {
        t.user_attrs.get("retry_of")
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    }
    for t in trials:
        key = json_key(t.config)
        if t.failure_kind != "interrupted" or key in measured or t.number in queued:
            continue
        measured.add(key)
        if times_lost(trials, t.config, "interrupted") > LOST_RETRIES:
            continue
        # its claim goes with it: an interrupt that came twice (the terminal's Ctrl-C and
        # `launch --workers` passing it on) could end the trial's recording before the release
        store.release_claim(space.study, t.number)
        config = TrialConfig.model_validate(t.config)
        study.enqueue_trial(optuna_params(config, space.search), user_attrs={"retry_of": t.number})


# failures the user's program causes (a crash, a knob it ignored, a rank that died, a
# DataLoader worker of its own): its config's only for the program that failed
PROGRAM_KINDS = ("error", "mismatch", "collective", "dataloader", "compile")
PROGRAM = "program"  # a failed trial's details: the fingerprint of the program that failed


def program_changed(trial: TrialRow, program: str | None) -> bool:
    """Whether ``trial`` failed in the user's program, and that program has changed since
    (``program``: its fingerprint now, ``preflight_script.program_fingerprint``). ``trial``
    must carry its measurement (``list_trials(include_measurement=True)``) if it failed so."""
    if program is None or trial.state != "failed" or trial.failure_kind not in PROGRAM_KINDS:
        return False
    then = (trial.measurement or {}).get(PROGRAM)
    return then is not None and then != program


def program_failures(store: Store, study: str) -> list[TrialRow]:
    """The study's trials that failed in a way the user's program causes, with what they
    recorded (its fingerprint among it)."""
    return store.list_trials(
        study, states=["failed"], failure_kinds=list(PROGRAM_KINDS), include_measurement=True
    )


def changed_failures(store: Store, study: str, program: str | None) -> set[int]:
    """The numbers of the study's trials that failed in the user's program, since changed."""
    if program is None:
        return set()
    return {t.number for t in program_failures(store, study) if program_changed(t, program)}


def enqueue_changed(
    store: Store, study: optuna.Study, space: Space, program: str | None
) -> list[int]:
    """Configs whose trial failed in the user's program, which has changed since (a walk fixed
    its script's crash and launched again: the config counted as measured, and the sweep
    stopped at once): they run first at this launch, once for this program. Their numbers."""
    changed = changed_failures(store, space.study, program)
    if not changed:
        return []
    trials = store.list_trials(space.study)
    now = {json_key(t.config) for t in trials if t.number not in changed}
    queued = {
        t.user_attrs.get("retry_of")
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    }
    again = []
    for t in trials:
        key = json_key(t.config)
        if t.number not in changed or key in now or t.number in queued:
            continue
        now.add(key)
        store.release_claim(space.study, t.number)  # the config may run again
        config = TrialConfig.model_validate(t.config)
        study.enqueue_trial(optuna_params(config, space.search), user_attrs={"retry_of": t.number})
        again.append(t.number)
    return again


def enqueue_lost(store: Store, study: optuna.Study, space: Space, trial: TrialRow) -> None:
    """``trial`` was lost with its worker: its config runs once more (not a second time)."""
    lost = store.list_trials(space.study, failure_kinds=["lost"])
    if times_lost(lost, trial.config) < LOST_RETRIES + 1:
        config = TrialConfig.model_validate(trial.config)
        study.enqueue_trial(
            optuna_params(config, space.search), user_attrs={"retry_of": trial.number}
        )
