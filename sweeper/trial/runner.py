"""Run one request file and write its result file: shared by ``python -m sweeper.trial`` and
the fork server's children. Always writes a result (atomically) unless killed."""

from __future__ import annotations

import traceback
from pathlib import Path

from sweeper.trial import progress
from sweeper.trial.failures import classify
from sweeper.trial.protocol import ChildRequest, ChildResult


def execute(request_path: Path, result_path: Path, process_started_at: float) -> None:
    progress.mark("started")
    try:
        request = ChildRequest.model_validate_json(request_path.read_text())
        if request.kind == "prepare":
            from sweeper.trial.corpus import prepare

            payload = prepare(request.workload, Path(request.cache_dir)).model_dump()
        elif request.kind == "probe":
            from sweeper.trial.probe import run_probe

            payload = run_probe(request)
        elif request.kind == "facts":
            from sweeper.trial.facts import machine_facts

            payload = machine_facts(request)
        elif request.workload.engine == "script":
            from sweeper.trial.script import run_script

            payload = run_script(request, request_path)
        else:
            from sweeper.trial.measure import run_trial

            payload = run_trial(request, process_started_at)
        result = ChildResult(status="ok", payload=payload)
    except Exception as exc:
        kind, message = classify(exc)
        result = ChildResult(
            status="failed",
            failure_kind=kind,
            failure_message=message,
            traceback="".join(traceback.format_exception(exc))[-20000:],
        )
    partial = result_path.with_suffix(".partial")
    partial.write_text(result.model_dump_json())
    partial.replace(result_path)
