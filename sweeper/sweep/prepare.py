"""Before the first trial: the workload's data and tokenizer made once (and the lengths
``max_seq_length: auto`` stands for read off them), a fork server with them loaded, and the
preflight probes that say which knob values can run here."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sweeper import script_defaults, seqlen
from sweeper.errors import PrepareError
from sweeper.launcher import ForkServer, run_child
from sweeper.preflight import PROBED_KNOBS, PreflightReport, ProbeCache, run_preflight, short_run_of
from sweeper.space import Space
from sweeper.sweep.observer import SilentObserver, SweepObserver
from sweeper.trial.protocol import ChildRequest, PreparedData


def prepare_workload(
    space: Space,
    cache_dir: Path,
    observer: SweepObserver | None = None,
    server: ForkServer | None = None,
) -> PreparedData:
    """Tokenizer, dataset and its token statistics, made once in a child for all trials;
    forked from ``server`` when given (its imports are done: a spawned child imported torch,
    transformers and datasets again, 4-5 CPU-seconds, before its work), else spawned."""
    observer = observer or SilentObserver()
    observer.prepare_started()
    run = run_child(
        ChildRequest.for_space("prepare", space, cache_dir, device="cpu"),
        timeout_s=max(600.0, space.trial.timeout_s),
        server=server,
    )
    if run.result.status != "ok" or run.result.payload is None:
        message = run.result.failure_message or ""
        # sweeper's own verdict on the space (it names the key: workload.dataset.path: ...)
        # says what and where; the child's log then holds only the parser's noise after it
        # (pyarrow's "in row 5", 0-based), so it is added only to a failure sweeper did not name
        said = message.startswith(("workload.", "search.", "hardware."))
        raise PrepareError(
            f"preparing the dataset and tokenizer failed ({run.result.failure_kind}): "
            f"{message}" + ("" if said else f"\n{run.log_tail[-1500:]}")
        )
    prepared = PreparedData.model_validate(run.result.payload)
    observer.prepare_done(prepared, run.wall_s)
    return prepared


def resolve_lengths(
    space: Space, stats: dict[str, Any] | None, observer: SweepObserver | None = None
) -> Space:
    """``space`` with ``max_seq_length: auto`` read off the data (``sweeper.seqlen``)."""
    resolved = seqlen.resolve(space, stats)
    said = seqlen.describe(space, resolved)
    if said is not None and observer is not None:
        observer.note(said)
    script = space.workload.script
    if script is not None and observer is not None:
        from_command = script_defaults.describe(script.command, script.knobs, resolved.search)
        if from_command is not None:
            observer.note(from_command)
        epochs = script_defaults.epochs_note(script.command, script.knobs, resolved.workload.epochs)
        if epochs is not None:
            observer.note(epochs)
        saves = script_defaults.checkpoint_note(
            script.command, script.knobs, resolved.workload.checkpoint.save_steps
        )
        if saves is not None:
            observer.note(saves)
        short = short_run_of(resolved)
        if short is not None and not short[1]:  # one every trial must hit: a preflight problem
            observer.note(short[0])
    return resolved


@contextmanager
def workload_server(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    note: Callable[[str], None] | None = None,
    server: ForkServer | None = None,
) -> Iterator[ForkServer]:
    """A fork server with the workload's tokenizer, data and model code loaded: probes and
    trials forked from it start in milliseconds. ``note`` hears why trials are spawned
    instead, when the zygote cannot fork them (ForkServer.unfit). ``server``: one already
    started (the preparation was forked from it), loaded here and left to its owner to stop;
    else one is started and stopped."""
    with contextlib.ExitStack() as owned:
        if server is None:
            server = owned.enter_context(ForkServer(str(cache_dir)))
        server.preload(ChildRequest.for_space("probe", space, cache_dir, prepared=prepared))
        if server.unfit is not None and note is not None:
            note(server.unfit)
        yield server


def preflight(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    observer: SweepObserver,
    server: ForkServer,
) -> PreflightReport:
    """Probe the knob values that may not run here; says in one note what is kept."""
    started = time.perf_counter()
    report = run_preflight(
        space, prepared, cache_dir, note=observer.note, server=server,
        probe_cache=ProbeCache(cache_dir),
    )  # fmt: skip
    kept = {
        knob: [v for v in space.search.values(knob) if str(v) not in report.dropped.get(knob, {})]
        for knob in (*PROBED_KNOBS, *report.fallbacks)
    }
    kept.update({knob: [value] for knob, value in report.fallbacks.items()})
    observer.note(
        f"preflight ({time.perf_counter() - started:.0f} s, {len(report.outcomes)} probes): "
        + "; ".join(f"{knob} {', '.join(map(str, values))}" for knob, values in kept.items())
    )
    return report
