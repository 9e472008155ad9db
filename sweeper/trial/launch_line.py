"""Which launcher a command starts with, read from its words alone: ``torchrun`` (or ``python
-m torch.distributed.run``), ``accelerate launch``, or none (a program run as it is).

One answer for every place that asks it: the trial that starts the command
(``sweeper.trial.script``), the space's checks of the command (``sweeper.space_script``,
``sweeper.script_defaults``) and the export of the winner's line (``sweeper.launch_export``).
Nothing is imported here, so reading a script space stays light (no torch, no subprocess).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from sweeper.trial import accelerate_line

Launcher = Literal["torchrun", "accelerate"]


def launcher(command: Sequence[str]) -> Launcher | None:
    """The launcher ``command`` starts with, or None for a program run as it is.

    >>> launcher(["torchrun", "--nproc-per-node", "2", "train.py"])
    'torchrun'
    >>> launcher(["/venv/bin/python3", "-m", "torch.distributed.run", "train.py"])
    'torchrun'
    >>> launcher(["accelerate", "launch", "train.py"])
    'accelerate'
    >>> launcher(["python", "train.py"]) is None
    True
    """
    words = list(command)
    if Path(words[0]).name == "torchrun" or words[1:3] == ["-m", "torch.distributed.run"]:
        return "torchrun"
    if accelerate_line.is_line(words):
        return "accelerate"
    return None
