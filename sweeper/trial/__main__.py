"""Child entry point: ``python -m sweeper.trial REQUEST.json RESULT.json``.

Always writes RESULT.json (atomically) unless killed; a failure is a classified result, not a
crash. Exit status 0 means a result was written, whatever it says.
"""

from __future__ import annotations

import time

PROCESS_STARTED_AT = time.time()

import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

from sweeper.trial.lifeline import die_with_parent  # noqa: E402


def main(argv: list[str]) -> int:
    request_path, result_path = Path(argv[0]), Path(argv[1])
    parent = os.environ.get("SWEEPER_PARENT_PID")
    die_with_parent(int(parent) if parent else None)
    from sweeper.trial.failures import classify
    from sweeper.trial.protocol import ChildRequest, ChildResult

    try:
        request = ChildRequest.model_validate_json(request_path.read_text())
        if request.kind == "prepare":
            from sweeper.trial.corpus import prepare

            payload = prepare(request.workload, Path(request.cache_dir)).model_dump()
        elif request.kind == "probe":
            from sweeper.trial.probe import run_probe

            payload = run_probe(request)
        else:
            from sweeper.trial.measure import run_trial

            payload = run_trial(request, PROCESS_STARTED_AT)
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
