"""Optuna's storage, in the same database as our tables: the one place where Optuna's database
errors (SQLAlchemy's) become ``StorageError``.

Optuna owns the search state (its tables); ``sweeper.store.store`` owns ours. Everything that
opens Optuna's storage, creates, loads or deletes one of its studies, or changes a trial
behind a study's back comes through here.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from sqlalchemy.exc import SQLAlchemyError

from sweeper.errors import StorageError
from sweeper.store.bounds import bound_engine
from sweeper.store.retry import retried
from sweeper.store.store import redact, schema_lock


@contextmanager
def mapped_errors(doing: str) -> Iterator[None]:
    """Raise Optuna's database errors inside the block as ``StorageError("{doing}: ...")``.

    >>> with mapped_errors("cannot read Optuna's study 'x'"):
    ...     raise SQLAlchemyError("gone")
    Traceback (most recent call last):
    ...
    sweeper.errors.StorageError: cannot read Optuna's study 'x': gone
    """
    try:
        yield
    except SQLAlchemyError as e:
        raise StorageError(f"{doing}: {e}") from e
    except optuna.exceptions.StorageInternalError as e:  # what Optuna makes of a database error
        raise StorageError(f"{doing}: {e.__cause__ or e}") from e


class _RetryingRDBStorage(optuna.storages.RDBStorage):
    """Optuna's RDB storage whose calls ride out a lost connection for ``retry_s`` seconds
    (``sweeper.store.retry``); its pooled connections are checked before use."""

    retry_s = 0.0


for _name in [n for n in vars(optuna.storages.BaseStorage) if not n.startswith("_")]:
    _method = getattr(optuna.storages.RDBStorage, _name, None)
    if inspect.isfunction(_method):

        def _call(self: _RetryingRDBStorage, *args: Any, _m: Any = _method, **kwargs: Any) -> Any:
            return retried(_m, lambda: self.retry_s, f"optuna.{_m.__name__}")(self, *args, **kwargs)

        setattr(_RetryingRDBStorage, _name, functools.wraps(_method)(_call))


def optuna_storage(storage_url: str, retry_s: float = 0.0) -> optuna.storages.RDBStorage:
    """Optuna's storage in the same database as our tables (dispose its engine when done);
    ``retry_s`` as ``Store``'s."""
    optuna.logging.set_verbosity(logging.WARNING)
    with (
        mapped_errors(f"Optuna cannot use the storage {redact(storage_url)}"),
        schema_lock(storage_url),  # Optuna creates its tables here
    ):
        storage = _RetryingRDBStorage(storage_url, engine_kwargs={"pool_pre_ping": True})
    # Optuna builds its engine (and connects) in the constructor: bound it, and drop the
    # connection it made so that every later one is bounded (sweeper.store.bounds)
    bound_engine(storage.engine)
    storage.engine.dispose()
    storage.retry_s = retry_s
    return storage


def create_or_load_study(
    name: str, storage: optuna.storages.RDBStorage, seed: int | None
) -> optuna.Study:
    """The study ``name`` (minimizing $/run), created on a sweep's first launch."""
    with mapped_errors(f"Optuna cannot create the study {name!r}"):
        return optuna.create_study(
            study_name=name,
            storage=storage,
            direction="minimize",
            # the search loop sets the space's sampler once preflight says what can run
            sampler=optuna.samplers.RandomSampler(seed=seed),
            load_if_exists=True,
        )


def stored_choices(storage: optuna.storages.RDBStorage, name: str) -> dict[str, tuple[Any, ...]]:
    """The choices each parameter of study ``name``'s trials was asked with (Optuna keeps one
    list per parameter for a study: a launch that asks another one fails). {}: no such study."""
    with mapped_errors(f"Optuna cannot read the study {name!r}"):
        try:
            study_id = storage.get_study_id_from_name(name)
        except KeyError:
            return {}
        choices: dict[str, tuple[Any, ...]] = {}
        for trial in storage.get_all_trials(study_id, deepcopy=False):
            for param, distribution in trial.distributions.items():
                if isinstance(distribution, optuna.distributions.CategoricalDistribution):
                    choices.setdefault(param, tuple(distribution.choices))
        return choices


def enqueue(storage_url: str, name: str, params: dict[str, Any]) -> None:
    """Queue ``params`` in Optuna's study ``name`` (a no-op if the same params are queued)."""
    storage = optuna_storage(storage_url)
    try:
        study = optuna.load_study(study_name=name, storage=storage)
        study.enqueue_trial(params, skip_if_exists=True)
    except (KeyError, SQLAlchemyError) as e:
        raise StorageError(f"cannot queue a trial in Optuna's study {name!r}: {e}") from e
    finally:
        storage.engine.dispose()


def fail_trial(storage: optuna.storages.BaseStorage, study_name: str, number: int) -> None:
    """Mark trial ``number`` of ``study_name`` failed, unless Optuna never had it running or
    it already ended (a worker died with it: its process cannot tell the study any more)."""
    try:
        study_id = storage.get_study_id_from_name(study_name)
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        storage.set_trial_state_values(trial_id, optuna.trial.TrialState.FAIL)
    except (KeyError, RuntimeError, optuna.exceptions.UpdateFinishedTrialError):
        pass


def delete_optuna_study(storage: optuna.storages.RDBStorage, name: str) -> None:
    """Delete Optuna's part of a study; nothing to do if it never reached Optuna."""
    try:
        with mapped_errors(f"cannot delete Optuna's study {name!r}"):
            optuna.delete_study(study_name=name, storage=storage)
    except KeyError:
        pass  # never reached Optuna (e.g. failed while preparing): only our rows exist


def delete_study_at(storage_url: str, name: str) -> None:
    """``delete_optuna_study`` with a storage of its own."""
    storage = optuna_storage(storage_url)
    try:
        delete_optuna_study(storage, name)
    finally:
        storage.engine.dispose()
