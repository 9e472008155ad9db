"""Child entry point: ``python -m sweeper.trial REQUEST.json RESULT.json``.

Exit status 0 means a result was written, whatever it says; a failure is a classified result.
"""

from __future__ import annotations

import time

PROCESS_STARTED_AT = time.time()

import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from sweeper.trial.lifeline import die_with_parent  # noqa: E402


def main(argv: list[str]) -> int:
    parent = os.environ.get("SWEEPER_PARENT_PID")
    die_with_parent(int(parent) if parent else None)
    from sweeper.trial.runner import execute

    execute(Path(argv[0]), Path(argv[1]), PROCESS_STARTED_AT)
    sys.stdout.flush()
    sys.stderr.flush()
    # The result is on disk; skip interpreter teardown (torch, DataLoader workers, Arrow maps
    # take a second or more to unwind). Workers die with us through their parent-death signal.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
