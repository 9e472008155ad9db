"""What the REST API writes to a study from outside its sweep: queue a config, delete a study.

(Stopping is one row update, ``Store.request_stop``: the running sweep reads it between
trials.)
"""

from __future__ import annotations

from typing import Any

from sweeper.errors import ConflictError, SpaceError
from sweeper.space import TrialConfig, optuna_params, parse_space
from sweeper.store import Store
from sweeper.store import optuna as optuna_store
from sweeper.sweep.prepare import resolve_lengths


def enqueue_config(store: Store, name: str, config: TrialConfig) -> dict[str, Any]:
    """Queue ``config`` as a trial of study ``name``: the running sweep (or the next
    ``sweeper launch`` of it) runs it before asking the sampler. Returns Optuna's params.

    Raises SpaceError if the study's space cannot run it, ConflictError if it was measured.
    """
    row = store.get_study(name)
    try:
        space = parse_space(row.space_yaml, f"the stored space of study {name!r}")
        space = resolve_lengths(space, row.dataset_stats)  # auto: the lengths the sweep has
    except SpaceError as e:
        raise ConflictError(f"cannot check the config against the study's space: {e}") from e
    reason = space.search.runnable(config)
    if reason is not None:
        raise SpaceError(f"config: {reason}")
    dumped = config.model_dump()
    for trial in store.list_trials(name, states=["complete", "failed", "running"]):
        if TrialConfig.model_validate(trial.config).model_dump() == dumped:
            raise ConflictError(
                f"trial {trial.number} of study {name!r} already ran this config "
                f"({trial.state}); a repeat would measure nothing new"
            )
    params = optuna_params(config, space.search)
    optuna_store.enqueue(store.url, name, params)
    return params


def delete_study(store: Store, name: str, *, grace_s: float) -> None:
    """Delete a study that is not running: our rows and Optuna's. A worker silent for
    ``grace_s`` seconds is dead (``SWEEPER_WORKER_GRACE_S``)."""
    store.get_study(name)  # StudyNotFoundError before anything else
    store.reap(name, grace_s)  # workers that died mark their trials lost first
    alive = store.live_workers(name, grace_s)
    if alive:
        raise ConflictError(
            f"study {name!r} has {len(alive)} live worker(s) "
            f"({', '.join(f'{w.host} pid {w.pid}' for w in alive)}); stop the study first "
            "(POST .../stop) and delete it once they have ended"
        )
    row = store.get_study(name)
    if row.state in ("running", "stopping"):
        raise ConflictError(
            f"study {name!r} is {row.state}; stop it first (POST .../stop) and delete it "
            "once its running trial has ended"
        )
    optuna_store.delete_study_at(store.url, name)
    store.delete_study(name)
