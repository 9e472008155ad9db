"""A finished trial's record, kept on local disk when the database cannot take it.

A trial can finish while the database is away past the sweep's retry window, or while its disk
is full. Its measurement (or its failure: a failure is data too) cost GPU minutes; it is written
here (``<cache>/spool/<study>/<n>.json``, atomically) and the sweep stops. The study's next
launch or worker replays it before anything else: our row is finished as it would have been, and
the reaper then finds nothing of it left to re-run. Optuna is told a measured trial's value here;
a failed one is told by the reaper from our row (``Worker.settle_orphans``), as the loop would
have told it (a failure's value depends on the study's other trials).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import optuna
from pydantic_core import to_jsonable_python

from sweeper.store import Store


def spool_dir(cache_dir: Path, study: str) -> Path:
    return cache_dir / "spool" / study


def keep(
    cache_dir: Path,
    study: str,
    number: int,
    fields: dict[str, Any],
    value: float | None,
    user_attrs: dict[str, Any],
) -> Path:
    """Write trial ``number``'s record (``Store.finish_trial``'s fields, Optuna's value and
    user attributes; no value: the trial failed); raises OSError if even the local disk cannot
    take it, ValueError or TypeError for a value JSON cannot hold."""
    folder = spool_dir(cache_dir, study)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{number}.json"
    record = {
        "number": number,
        "state": "complete" if value is not None else "failed",
        "fields": fields,
        "value": value,
        "user_attrs": user_attrs,
    }
    partial = path.with_suffix(".part")
    # NaN and inf stay as they are (a window with no spread has an infinite interval):
    # Python's json reads them back, and finish_trial stores them as it always does
    partial.write_text(json.dumps(to_jsonable_python(record)))
    os.replace(partial, path)
    return path


def replay(
    store: Store, storage: optuna.storages.BaseStorage, study: str, cache_dir: Path
) -> list[tuple[int, str]]:
    """Write every kept record of ``study`` whose trial is still running in both stores;
    returns the trial numbers written, each with what it was (a measurement, or a failure
    and its kind). A record whose trial has moved on is dropped."""
    folder = spool_dir(cache_dir, study)
    if not folder.is_dir():
        return []
    study_id = storage.get_study_id_from_name(study)
    written = []
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text())
        number = int(record["number"])
        row = store.get_trial(study, number)
        if row is not None and row.state == "running":
            state = record.get("state", "complete")
            store.finish_trial(study, number, state, **record["fields"])
            if record["fields"].get("failure_kind") == "interrupted":
                store.release_claim(study, number)  # nothing was measured: it may run again
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
            told = storage.get_trial(trial_id).state != optuna.trial.TrialState.RUNNING
            if not told:
                for key, value in record["user_attrs"].items():
                    storage.set_trial_user_attr(trial_id, key, value)
            if state == "complete" and not told:
                storage.set_trial_state_values(
                    trial_id, optuna.trial.TrialState.COMPLETE, [float(record["value"])]
                )
            kind = record["fields"].get("failure_kind")
            written.append((number, "measurement" if kind is None else f"failure ({kind})"))
        path.unlink()
    return written
