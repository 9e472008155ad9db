"""What the user's own program runs, read from its objects for ``sweeper.trial.hook``: the
run its Trainer plans (``ProgramRun``), its peak learning rate, the rows of its DataLoader, and
the time its torch DataLoaders take to give batches (a loop's data wait)."""

from __future__ import annotations

import math
import time
from typing import Any


def program_run(args: Any, state: Any, loader: Any) -> dict[str, Any] | None:
    """The run the program trains, as its Trainer planned it when training began: epochs and
    max_steps after TrainingArguments' defaults (a command silent on them trains 3 epochs),
    the optimizer steps of the whole run, the rows of its training set."""
    try:
        epochs, max_steps = float(args.num_train_epochs), int(args.max_steps)
    except (AttributeError, TypeError, ValueError):
        return None
    planned = getattr(state, "max_steps", None)
    return {
        "num_train_epochs": epochs,
        "max_steps": max_steps,
        "planned_steps": int(planned) if isinstance(planned, int) and planned > 0 else None,
        "train_rows": loader_rows(loader),
        "arguments": arguments_class(args),
    }


class LoaderTime:
    """The time this process spent in torch DataLoader iterators' ``__next__`` and how many
    batches they gave, counted from the loop's first step (``install``): a loop's data wait
    is that time between two steps, where a torch DataLoader gave its batches."""

    seconds = 0.0
    calls = 0
    installed = False

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        cls.installed = True
        from torch.utils.data import dataloader

        base = getattr(dataloader, "_BaseDataLoaderIter", None)
        original = getattr(base, "__next__", None)
        if base is None or original is None:  # another torch: the gap between steps it is
            return

        def timed(iterator: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(iterator)
            finally:
                cls.seconds += time.perf_counter() - started
                cls.calls += 1

        base.__next__ = timed  # type: ignore[method-assign]


def peak_learning_rate(args: Any, optimizer: Any) -> float | None:
    """The program's peak learning rate as it runs (``ProgramRun.learning_rate``): its
    TrainingArguments' after their defaults, else its optimizer's first parameter group's as
    its scheduler started it (OneCycleLR's ``max_lr``, any scheduler's ``initial_lr``), else
    the group's ``lr``.

    >>> import torch
    >>> w = [torch.nn.Parameter(torch.zeros(1))]
    >>> opt = torch.optim.AdamW(w, lr=3e-4)
    >>> _ = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-4, total_steps=10)
    >>> opt.param_groups[0]["lr"] < 3e-4, peak_learning_rate(None, opt)
    (True, 0.0003)
    """
    value = getattr(args, "learning_rate", None)
    groups = getattr(optimizer, "param_groups", None) if value is None else None
    if groups:
        group = groups[0]
        value = group.get("max_lr", group.get("initial_lr", group.get("lr")))
    try:
        peak = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return peak if math.isfinite(peak) and peak > 0 else None


def arguments_class(args: Any) -> str:
    """The class of the program's TrainingArguments by the name its export takes: SFTConfig
    for TRL's or any subclass of it (an SFTTrainer script whatever its knobs form), else the
    class's own name.

    >>> class SFTConfig: pass
    >>> class MyConfig(SFTConfig): pass
    >>> arguments_class(MyConfig()), arguments_class(object())
    ('SFTConfig', 'object')
    """
    classes = type(args).__mro__
    return "SFTConfig" if any(c.__name__ == "SFTConfig" for c in classes) else classes[0].__name__


def loader_rows(loader: Any) -> int | None:
    """The rows of ``loader``'s dataset (one epoch's), or None (an IterableDataset)."""
    dataset = getattr(loader, "dataset", None)
    try:
        return len(dataset) if dataset is not None else None
    except TypeError:  # an IterableDataset: no length
        return None
