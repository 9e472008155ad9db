"""``sweeper study``: list the studies of a storage, export one to a study file, import one
anywhere (``sweeper.studyfile``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from sweeper.cli_common import HELP_CONTEXT, StorageOption, fail, reading_store, with_storage
from sweeper.console import console
from sweeper.errors import SweeperError

study_app = typer.Typer(
    help="Studies: list those in a storage, export one to studies/NAME.json, import one anywhere.",
    no_args_is_help=True,
    context_settings=HELP_CONTEXT,
)


@study_app.command(
    "list",
    short_help="List the studies in a storage: state, machine, trials, the cheapest trial's "
    "$/run, last change.",
)
def study_list(
    storage: StorageOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """List the studies in a storage: state, machine, trials, the cheapest trial's $/run and
    when each last changed, oldest first."""
    from sweeper.console import print_study_list
    from sweeper.settings import Settings
    from sweeper.store.models import TRIAL_STATES, ended_without_answer
    from sweeper.store.store import as_utc

    store = reading_store(storage)
    try:
        store.migrate()
        studies = store.list_studies(Settings().worker_grace_s)
    except SweeperError as e:
        raise fail(with_storage(e, store)) from None
    finally:
        store.dispose()
    rows = [
        {
            "name": row.name,
            "state": row.state,
            "hardware_name": row.hardware_name,
            "usd_per_hour": row.usd_per_hour,
            "trials": (trials := {s: totals["trials"].get(s, 0) for s in TRIAL_STATES}),
            "none_completed": ended_without_answer(row.state, trials),
            "remeasuring": totals["remeasuring"],
            "n_trials_planned": row.n_trials_planned,
            "best_cost_per_run_usd": totals["best_cost_per_run_usd"],
            "updated_at": as_utc(totals["updated_at"]).isoformat(),
        }
        for row, totals in studies
    ]
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        print_study_list(rows, store.redacted_url)


@study_app.command(
    "export",
    short_help="Write a study (every trial's measurement, Optuna's record, the space) to a "
    "JSON file that `sweeper study import` loads anywhere.",
)
def study_export(
    study: Annotated[str, typer.Option("--study", help="study name")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="file to write (default studies/NAME.json)")
    ] = None,
    storage: StorageOption = None,
    force: Annotated[
        bool, typer.Option("--force", help="export a study whose sweep is still running")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="replace the file if it exists")
    ] = False,
) -> None:
    """Write a study (every trial's measurement, fingerprint and projection, Optuna's record,
    the space) to a JSON file that `sweeper study import` loads into any storage. An existing
    file is kept unless --overwrite says to replace it (studies/ holds recorded sweeps)."""
    from sweeper.studyfile import export_study, write_study_file

    path = out or Path("studies") / f"{study}.json"
    if path.exists() and not overwrite:
        raise fail(
            f"{path} exists and was left as it is; write elsewhere with --out FILE, or replace "
            "it with --overwrite",
            code=2,
        )
    store = reading_store(storage)
    try:
        store.migrate()
        document = export_study(store, study, allow_running=force)
    except SweeperError as e:
        raise fail(with_storage(e, store)) from None
    finally:
        store.dispose()
    try:
        write_study_file(document, path)
    except OSError as e:
        raise fail(f"cannot write {path}: {e.strerror or e}") from None
    completed = sum(1 for t in document.trials if t["state"] == "complete")
    console.print(
        f"wrote {path}: study {study!r}, {len(document.trials)} trials ({completed} complete)",
        highlight=False,
    )


@study_app.command("import")
def study_import(
    file: Annotated[Path, typer.Argument(help="a study file, e.g. studies/cpu-demo.json")],
    storage: StorageOption = None,
    as_name: Annotated[
        str | None, typer.Option("--as", help="import under this name instead")
    ] = None,
) -> None:
    """Load a study file into a storage, so `best`, `serve` and the REST API work on it."""
    from sweeper.settings import resolve_storage
    from sweeper.store import Store
    from sweeper.studyfile import StudyFileError, import_study, padding_notes, read_study_file

    try:
        document = read_study_file(file)
    except StudyFileError as e:
        raise fail(str(e), code=2) from None
    store = Store(resolve_storage(storage))
    try:
        store.migrate()
        name = import_study(store, document, name=as_name)
    except StudyFileError as e:
        raise fail(str(e), code=2) from None
    except SweeperError as e:
        raise fail(str(e)) from None
    finally:
        store.dispose()
    # the next commands read this store: named when a plain one would read another
    import shlex

    where = (
        ""
        if store.url == resolve_storage(None)
        else f" --storage {shlex.quote(store.redacted_url)}"
    )
    console.print(
        f"imported study {name!r} ({len(document.trials)} trials) into {store.redacted_url}; "
        f"see it with `sweeper best --study {shlex.quote(name)}{where}` or "
        f"`sweeper serve{where}`",
        highlight=False,
    )
    for note in padding_notes(document):  # figures kept as recorded, read beside them
        console.print(f"  {escape(note)}", highlight=False)
