"""Run one request file and write its result file: shared by ``python -m sweeper.trial`` and
the fork server's children. Always writes a result (atomically) unless killed."""

from __future__ import annotations

import os
import signal
import traceback
from pathlib import Path

from sweeper.trial import progress, runenv
from sweeper.trial.failures import classify
from sweeper.trial.protocol import ChildRequest, ChildResult


def execute(request_path: Path, result_path: Path, process_started_at: float) -> ChildResult:
    runenv.snapshot()  # before an import sets one of them for itself
    progress.mark("started")
    try:
        request = ChildRequest.model_validate_json(request_path.read_text())
        if _leads_ranks(request):
            from sweeper.trial.group import run_group

            return _write(run_group(request, request_path, result_path), result_path)
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
        # the trial is over: a DataLoader's SIGCHLD handler must not raise again while the
        # failure is classified and written (it escaped, and the child left no result)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        kind, message = classify(exc)
        result = ChildResult(
            status="failed",
            failure_kind=kind,
            failure_message=message,
            traceback="".join(traceback.format_exception(exc))[-20000:],
        )
    return _write(result, result_path)


def _leads_ranks(request: ChildRequest) -> bool:
    """A trial on several devices, in the process that starts its ranks (not in a rank)."""
    from sweeper.trial.group import RANK_ENV

    config = request.config
    return (
        request.kind == "trial"
        and config is not None
        and config.devices > 1
        and RANK_ENV not in os.environ
    )


def _write(result: ChildResult, result_path: Path) -> ChildResult:
    partial = result_path.with_suffix(".partial")
    partial.write_text(result.model_dump_json())
    partial.replace(result_path)
    return result
