"""sweeper's one line in your own training program (``engine: script``).

For a ``transformers.Trainer`` or TRL ``SFTTrainer``::

    import sweeper
    trainer = Trainer(..., callbacks=[sweeper.callback()])

For your own loop, around each optimizer step (a batch, or the list of micro-batches the step
accumulates)::

    for batch in loader:
        with sweeper.step(batch, model=model, optimizer=optimizer, loader=loader) as s:
            loss = model(**batch).loss
            loss.backward(); optimizer.step(); optimizer.zero_grad()
            s.loss(loss)

Outside a sweeper trial both do nothing: the line stays in your code. Inside one they feed
the recorder every built-in engine uses (burn-in, the timed window, compile split, data wait,
memory, MFU, the knobs read back from your objects), and when the measurement is done they
write it for the trial and end the program (exit 0): it need not know how many steps a trial
takes. ``sweeper.trial_config()`` gives the trial's knobs (None outside a trial) for those that
are not TrainingArguments (attn_implementation, max_seq_length, packing).

In a loop, the time from the end of one step to the start of the next (your ``for`` fetching the
batch) counts as waiting for data.

On several devices (``devices: N``) each rank runs your program with torchrun's environment, and
its line records that rank's steps: the ranks agree when burn-in and the window end (a gloo group
of the hook's own, beside your process group), so all of them stop at the same step, and rank 0
writes the group's measurement from every rank's steps (samples/s from the slowest rank's step
times, each rank's peak memory). A rank that reaches its first step without torch.distributed's
process group (the program ignored the launch) fails the trial as a mismatch.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from sweeper.trial.parse_check import PARSE_ENV
from sweeper.trial.program import LoaderTime, loader_rows, peak_learning_rate, program_run
from sweeper.trial.rank import Ranks
from sweeper.trial.script import CONFIG_ENV, REQUEST_ENV, RESULT_ENV

_session: _Session | None = None


def active() -> bool:
    """Whether this process is a sweeper trial."""
    return REQUEST_ENV in os.environ


_config_read = False  # whether the program asked for trial_config() (its knobs beyond flags)


def trial_config() -> dict[str, Any] | None:
    """The trial's knobs (``per_device_batch_size``, ``max_seq_length``...), or None outside
    a trial."""
    global _config_read
    text = os.environ.get(CONFIG_ENV)
    if text is None:
        return None
    _config_read = True
    return dict(json.loads(text))


def callback() -> Any:
    """A ``TrainerCallback`` for ``Trainer(callbacks=[...])``: records the trial inside a
    sweeper trial, does nothing outside one."""
    from transformers import TrainerCallback

    if not active():
        _parse_check_ends()
        return TrainerCallback()
    return _the_session().trainer_callback()


class _NoStep:
    def loss(self, value: Any) -> None:
        pass


def step(
    batch: Any,
    *,
    model: Any = None,
    optimizer: Any = None,
    loader: Any = None,
) -> contextlib.AbstractContextManager[Any]:
    """One optimizer step of your own loop: ``with sweeper.step(batch, model=model,
    optimizer=optimizer, loader=loader):``. ``batch`` is the step's batch (a dict with
    ``input_ids``) or the list of its micro-batches. ``model`` is needed once (read back, MFU,
    the checkpoint cost); ``optimizer`` and ``loader`` let the trial read back what they ran
    (without them, a space that lists a knob read from them fails the trial)."""
    if not active():
        _parse_check_ends()
        return contextlib.nullcontext(_NoStep())
    return _the_session().step(batch, model, optimizer, loader)


def _parse_check_ends() -> None:
    """In ``sweeper doctor``'s parse check (``sweeper.trial.parse_check``) the program got as
    far as this line without a parse to stop at: it starts, and ends here."""
    if PARSE_ENV in os.environ:
        from sweeper.trial.parse_check import stop

        stop("hook")


def _the_session() -> _Session:
    global _session
    if _session is None:
        from sweeper.trial import progress

        progress.mark("script_hook")  # the line is reached: a timeout from here is not its lack
        _session = _Session()
    return _session


def _process_start() -> float:
    import psutil

    return float(psutil.Process().create_time())


class _Session:
    """One trial inside the user's program: the request, the recorder, what ran."""

    def __init__(self) -> None:
        from sweeper.trial.protocol import ChildRequest

        self.request = ChildRequest.model_validate_json(Path(os.environ[REQUEST_ENV]).read_text())
        self.result_path = Path(os.environ[RESULT_ENV])
        self.started_at = _process_start()
        self.ctx: Any = None
        self.model: Any = None
        self.optimizer: Any = None
        self.loader: Any = None
        self.args: Any = None
        self.computed: Any = None
        self.first_step_read = False
        self.micro_batches = 0
        self.first_rows = 0
        self.widest_row = 0
        self.last_step_end: float | None = None
        # LoaderTime's counts at the last step's end
        self.loader_s_at_end, self.loader_calls_at_end = 0.0, 0
        self.loss_seen = False  # the model's output carried a loss in this step
        # this step's micro-batch losses, each with whether the model normalised it over the
        # whole step (Trainer passes num_items_in_batch) or over its own micro-batch only
        self.step_losses: list[tuple[Any, bool]] = []
        self.effective: dict[str, Any] = {}
        # the knobs the program ran at its own values, where they differ from the config's
        # (sweeper.trial.script.own_values)
        self.own_values: dict[str, Any] = {}
        # this process's rank of a multi-device trial (None on one device)
        self.ranks = Ranks.from_env()
        self.wrappers: list[Any] = []  # what wraps the model (DDP), found at the read-back
        self.communication: Any = None  # DDP's wait on its all-reduce (rank.ExposedCommunication)
        self.first_batch: str | None = None  # a digest of the first batch's token ids
        # how long the program's own run is (a Trainer's epochs, max_steps, planned steps)
        self.program_run: dict[str, Any] | None = None
        # the knobs that never reached the program (sweeper.trial.script.unreached)
        self.unreached: list[str] = []
        self.ended_note: str | None = None  # the program's run ended inside the window, kept
        self._loss_hook: Any = None
        self.written = False  # the trial's result is written (a measurement or a failure)
        self._previous_hook = sys.excepthook
        sys.excepthook = self._crashed  # an exception in the program: a classified failure
        # a program whose own run ends inside the timed window (its loop, its epochs) is
        # measured from the steps timed, or failed with their counts, as it exits. By then
        # threading has shut down and a module that registers a threading exit function at
        # import refuses to load: the thread pools' are loaded now (the checkpoint save at the
        # measurement's end imports deepspeed, where installed, which imports them)
        import concurrent.futures.process
        import concurrent.futures.thread  # noqa: F401

        atexit.register(self._program_ended)

    # -- the program's end -------------------------------------------------------------------

    def _write(self, result: Any) -> None:
        partial = self.result_path.with_suffix(".partial")
        partial.write_text(result.model_dump_json())
        partial.replace(self.result_path)
        self.written = True

    def _crashed(
        self, kind: type[BaseException], exc: BaseException, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(Exception):
            self._write_failure(exc, where=True)
        self._previous_hook(kind, exc, tb)

    def _write_failure(self, exc: BaseException, *, where: bool = False) -> tuple[str, str]:
        """The trial's result: ``exc`` classified as the built-in engines' failures are;
        ``where``: an exception of the program's own, whose message then says where in the
        program it was raised (a verdict of sweeper's names no line: its own code raised it)."""
        from sweeper.errors import TrialError
        from sweeper.trial.failures import classify, raised_at
        from sweeper.trial.protocol import ChildResult

        failure, message = classify(exc)
        told = "".join(traceback.format_exception(exc))
        raised = raised_at(told, os.getcwd()) if where and not isinstance(exc, TrialError) else None
        if raised is not None:
            message = f"{message} (raised at {raised})"
        self._write(
            ChildResult(
                status="failed",
                failure_kind=failure,
                failure_message=message,
                traceback=told[-20000:],
            )
        )
        return failure, message

    def _fail(self, kind: str, message: str) -> None:
        from sweeper.errors import TrialError

        self._abort(TrialError(kind, message))

    def _abort(self, exc: BaseException) -> None:
        """sweeper's own verdict on this trial (a knob that did not run as asked, a loss that
        is not finite, a step without the model): written and the program ended here, so a
        script that catches its exceptions cannot turn it into "never measured"."""
        failure, message = self._write_failure(exc)
        print(f"sweeper: the trial failed ({failure}): {message}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        _end_children()
        os._exit(1)

    def _done(self) -> None:
        """The recorder is done: measure the rest, write the result, end the program."""
        self._write_measurement()
        self._end_program()

    def _end_program(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        # the measurement is written; the rest of the program (saving, evaluation) is not
        # the trial's
        _end_children()
        os._exit(0)

    def _run_ended(self, *, end_program: bool) -> None:
        """The program's own run ended (its loop at exit, its Trainer's ``train()``) with the
        timed window open: the window is closed at its last step and kept when it holds the
        steps it needs, as a capped window is, with the interval reached and a note in the
        trial's log; otherwise the trial fails with the window's own counts. Burn-in and
        earlier endings are left to the trial's side (``sweeper.trial.script._ended_early``)."""
        from sweeper.errors import TrialError
        from sweeper.trial.failures import classify
        from sweeper.trial.recipe import ci95_rel
        from sweeper.trial.script import ended_in_window, kept_in_window

        if self.written or self.ctx is None or self.ctx.recorder.phase != "window":
            return
        recorder = self.ctx.recorder
        script = self.request.workload.script
        command = " ".join(script.command) if script is not None else "your program"
        try:
            if self.ranks is None:
                kept = recorder.end_early()
            else:
                # data parallel: every rank's run ends at the same step, each in this call
                # (its Trainer's on_train_end, its loop's exit, or the destroy_process_group
                # before it); one rank short of the window's steps fails them all
                recorder.settle_window()
                short = len(recorder.recording.window) < recorder.min_window_steps
                kept = not self.ranks.agree(short) and recorder.end_early()
            times = recorder.recording.window_times
            seconds, interval = math.fsum(times), ci95_rel(times)
            if not kept:
                self._fail(
                    "error",
                    ended_in_window(
                        command,
                        recorder.measure,
                        burn_in=len(recorder.recording.burn_in),
                        timed=len(times),
                        needed=recorder.min_window_steps,
                        seconds=seconds,
                        interval=interval,
                    ),
                )
            said = kept_in_window(recorder.measure, timed=len(times), seconds=seconds,
                                  interval=interval)  # fmt: skip
            print(said, file=sys.stderr)
            self.ended_note = said.removeprefix("sweeper: ")  # recorded with the measurement
            self._write_measurement()
        except TrialError as exc:  # a verdict on what was measured (a loss that is not finite)
            self._abort(exc)
        except Exception as exc:  # noqa: BLE001 - every failure here is the trial's result
            _, message = classify(exc)
            self._abort(
                TrialError(
                    "error",
                    f"{command} ended inside the timed window, and sweeper could not finish "
                    f"the measurement as the program ended ({message}); let the run go on "
                    "longer, so that the window closes while it trains",
                )
            )
        if self.ranks is not None:  # the last exchange is done and the program goes on
            with contextlib.suppress(Exception):  # the group's end is not the measurement's
                self.ranks.close()
        if end_program:
            self._end_program()

    def _before_group_ends(self) -> None:
        """A loop that ends its run with ``torch.distributed.destroy_process_group()`` (as
        torch's own examples do) ends the ranks' exchanges with it: its run's end inside the
        window is settled before the group goes, not at the interpreter's exit."""
        import torch.distributed as dist

        destroy = dist.destroy_process_group

        def destroy_process_group(group: Any = None) -> None:
            if group is None:  # the default group, and with it every group of this run
                self._run_ended(end_program=False)
            destroy(group)

        dist.destroy_process_group = destroy_process_group

    def _program_ended(self) -> None:
        # at the interpreter's exit the program's own exit status stands (the trial keeps a
        # measurement only from a program that exits 0)
        self._run_ended(end_program=False)

    def _write_measurement(self) -> None:
        from sweeper.trial.engines import EngineRun, optimizer_name
        from sweeper.trial.measure import finish
        from sweeper.trial.protocol import ChildResult

        if self._loss_hook is not None:
            self._loss_hook.remove()
        model = _unwrap(self.model)
        run = EngineRun(
            model=model,
            optimizer=self.optimizer,
            optimizer_name=optimizer_name(self.optimizer) if self.optimizer is not None else "?",
            effective=self.effective,
            notes={
                "first_batch": self.first_batch,
                "own_values": self.own_values,
                "program_run": self.program_run,
                "unreached": self.unreached,
                "ended_in_window": self.ended_note,
                "communication_s": None
                if self.communication is None
                else self.communication.per_step_s(),
            },
        )
        if self.ranks is None:
            payload = finish(self.ctx, run, None, self.started_at, self.started_at)
        else:
            payload = self._finish_group(run)
        if "phases_s" in payload:
            payload["phases_s"]["imports"] = None  # the program's own start-up, not told apart
        self._write(ChildResult(status="ok", payload=payload))

    def _finish_group(self, run: Any) -> dict[str, Any]:
        """Every rank's figures to rank 0, which measures the group as the built-in engines'
        ranks do (``sweeper.trial.measure.run_trial``); the other ranks' result is their rank."""
        from sweeper.trial.engines.readback import sharded_share
        from sweeper.trial.measure import _rank_figures, _sharded_checkpoint_cost, finish
        from sweeper.trial.recipe import merge

        ranks, workload = self.ranks, self.request.workload
        assert ranks is not None
        window_end = time.time()
        sharded = None
        if sharded_share(run.model) is not None and workload.checkpoint.save_steps is not None:
            sharded = _sharded_checkpoint_cost(run.model, run.optimizer, workload, self.ctx, ranks)
        group = ranks.gather(_rank_figures(self.ctx, run))
        if ranks.rank != 0:
            return {"rank": ranks.rank}
        self.ctx.recorder.recording = merge([figures.pop("recording") for figures in group])
        return dict(
            finish(
                self.ctx,
                run,
                None,
                self.started_at,
                self.started_at,
                group=group,
                checkpoint=None if sharded is None else (sharded, time.time() - window_end),
            )
        )

    # -- the recorder ------------------------------------------------------------------------

    def _start(self, model: Any) -> None:
        from sweeper.trial import progress
        from sweeper.trial.contention import HostWatch
        from sweeper.trial.engines import TrialContext, timer_for
        from sweeper.trial.engines.readback import ComputeDtype
        from sweeper.trial.recipe import Recorder

        if model is None or self.optimizer is None:
            self._fail(
                "error",
                "sweeper.step needs the model and the optimizer (model=..., optimizer=...) "
                "at the first step: the trial reads back what ran from them, counts the "
                "model's FLOPs and times a checkpoint of both",
            )
        request = self.request
        assert request.settings is not None and request.prepared is not None
        self.model = model
        base = _unwrap(model)
        device = next(base.parameters()).device
        index = (device.index or 0) if device.type == "cuda" else None
        agree = None
        if self.ranks is not None:
            problem = self.ranks.adopt(request.settings.collective_timeout_s)
            if problem is not None:
                self._fail("mismatch", problem)
            agree = self.ranks.agree
            self._before_group_ends()
        self.ctx = TrialContext(
            request=request,
            device=device,
            tokenizer=None,
            recorder=Recorder(
                request.settings.warmup,
                request.settings.measure,
                timer_for(device),
                HostWatch(index),
                on_phase=progress.mark,
                agree=agree,
            ),
            cache_dir=Path(request.cache_dir),
            loss_labels="replies" if request.prepared.completion_only else "all",
            ranks=self.ranks,
        )
        self.ctx.startup_s = time.time() - self.started_at
        self.computed = ComputeDtype(base)
        self._loss_hook = base.register_forward_hook(self._seen_loss, with_kwargs=True)
        self.ctx.recorder.start()

    def _seen_loss(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        loss = getattr(output, "loss", None)
        if loss is not None and self.ctx is not None and self.ctx.recorder.phase != "done":
            self.loss_seen = True
            whole_step = kwargs.get("num_items_in_batch") is not None
            self.step_losses.append((loss.detach().float(), whole_step))

    def _step_loss(self) -> None:
        """The step's loss as training took it: the sum of micro-batch losses the model
        normalised over the whole step (Trainer), else their mean (TRL's SFTTrainer calls the
        model without num_items_in_batch; a plain loop's model(**batch))."""
        if not self.step_losses:
            return
        over_step = [loss for loss, whole in self.step_losses if whole]
        if over_step:
            self.ctx.recorder.loss(sum(over_step))
        else:
            self.ctx.recorder.loss(
                sum(loss for loss, _ in self.step_losses) / len(self.step_losses)
            )
        self.step_losses = []

    def _batch(self, batch: Any, waited: float) -> None:
        from sweeper.trial.engines import count_batch, widest_row

        counts = count_batch(batch)
        self.ctx.recorder.batch(**counts, data_wait_s=waited)
        if not self.first_step_read:
            if self.first_batch is None and isinstance(batch, Mapping) and "input_ids" in batch:
                ids = batch["input_ids"].detach().cpu().contiguous()
                self.first_batch = hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]
            self.micro_batches += 1
            self.first_rows = self.first_rows or int(counts["rows"])
            self.widest_row = max(self.widest_row, widest_row(batch))

    def _step_end(self) -> None:
        try:
            if not self.first_step_read:
                self._read_back()
            self._step_loss()
            self.loss_seen = False
            done = self.ctx.recorder.step_end()
            if done:
                self._done()
            if self.communication is not None and self.ctx.recorder.phase == "window":
                self.communication.window_started()
        except Exception as exc:  # noqa: BLE001 - every failure here is the trial's result
            self._abort(exc)

    def _read_back(self) -> None:
        from sweeper.errors import TrialError
        from sweeper.trial.engines.readback import Running, check
        from sweeper.trial.script import (
            form_hint,
            not_shown,
            own_values,
            owned,
            ran_config,
            unreached,
        )

        self.first_step_read = True
        if self.computed is not None:
            self.computed.remove()
        config = self.request.config
        assert config is not None
        if self.ranks is not None:
            self.wrappers = _wrappers_of(_unwrap(self.model))
            ddp = next((w for w in [self.model, *self.wrappers] if _is_ddp(w)), None)
            if ddp is not None:
                from sweeper.trial.rank import ExposedCommunication

                self.communication = ExposedCommunication(ddp)
        running = Running(
            device=self.ctx.device,
            model=_unwrap(self.model),
            runnables=[self.model, getattr(self.model, "module", None), *self.wrappers],
            optimizer=self.optimizer,
            loader=self.loader,
            args=self.args,
            micro_batches=self.micro_batches,
            widest_row=self.widest_row,
            compute_dtype=None if self.computed is None else self.computed.dtype,
            first_rows=self.first_rows,
        )
        # the knobs the program runs at its own values are read back and recorded, not
        # compared with sweeper's defaults (None: recorded, not compared)
        own = owned(self.request)
        asked = {k: None if k in own else v for k, v in config.model_dump().items()}
        try:
            self.effective = check("script", running, asked)
        except TrialError as e:
            hint = form_hint(self.request, self.args) if e.kind == "mismatch" else ""
            if not hint:
                raise
            raise TrialError(e.kind, f"{e.message}{hint}") from e
        self.effective, self.unreached = unreached(self.request, self.effective, _config_read)
        self.unreached += not_shown(self.request, self.effective)
        # what the measurement derives from the config, it derives from what ran; the
        # program's own values are recorded beside the config asked (the study's key of it)
        self.ctx.request = ran_config(self.request, self.effective)
        self.own_values = own_values(self.request, self.ctx.request)
        peak = peak_learning_rate(self.args, self.optimizer)
        if peak is not None:
            self.program_run = (self.program_run or {}) | {"learning_rate": peak}

    # -- your loop ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self, batch: Any, model: Any, optimizer: Any, loader: Any) -> Iterator[Any]:
        entered = time.perf_counter()
        self.optimizer = optimizer if optimizer is not None else self.optimizer
        self.loader = loader if loader is not None else self.loader
        if self.ctx is None:
            LoaderTime.install()
            if self.loader is not None and self.program_run is None:
                rows = loader_rows(self.loader)  # a loop tells its epoch's rows, not its length
                self.program_run = None if rows is None else {"train_rows": rows}
            self._start(model)
        waited = 0.0 if self.last_step_end is None else entered - self.last_step_end
        if self.last_step_end is not None and LoaderTime.calls > self.loader_calls_at_end:
            # a torch DataLoader gave batches since the last step: the wait is the time its
            # iterators took, not the script's own code between two steps (its logging, an
            # eval, a save), which stays in the step's time but is no data wait (a walk's
            # sleep after each step read as 44% data wait, pointing at the loader)
            waited = min(waited, LoaderTime.seconds - self.loader_s_at_end)
        micro = batch if isinstance(batch, list | tuple) else [batch]
        for index, one in enumerate(micro):
            self._batch(one, waited if index == 0 else 0.0)
        yield _Step(self)
        self._step_end()
        self.last_step_end = time.perf_counter()
        self.loader_s_at_end, self.loader_calls_at_end = LoaderTime.seconds, LoaderTime.calls

    # -- a Trainer ---------------------------------------------------------------------------

    def _check_trainers(self, made_at: str) -> None:
        """A Trainer whose train() starts without the callback ``sweeper.callback()`` made
        fails the trial there: no step of it would reach the recorder, so the trial would
        train the program's whole run to fail at its end (a walk's script made the callback
        and gave the Trainer its own logging callback only: three trials trained all their
        epochs, then were told to run longer)."""
        from transformers import Trainer

        if getattr(Trainer.train, "sweeper_checks", False):
            return
        train = Trainer.train
        session = self

        def checked_train(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            handler = getattr(trainer, "callback_handler", None)
            given = getattr(handler, "callbacks", None)
            if given is not None and not any(
                getattr(c, "sweeper_session", None) is session for c in given
            ):
                where = f" (at {made_at})" if made_at else ""
                session._fail(
                    "error",
                    f"sweeper.callback() was made{where}, but the {type(trainer).__name__} "
                    "that trains was not given it, so the trial cannot see one step of it: "
                    "pass it as Trainer(..., callbacks=[sweeper.callback()]) (beside your "
                    "own callbacks), or trainer.add_callback(sweeper.callback()) before "
                    "train()",
                )
            return train(trainer, *args, **kwargs)

        checked_train.sweeper_checks = True  # type: ignore[attr-defined]
        checked_train.__wrapped__ = train  # type: ignore[attr-defined]
        setattr(Trainer, "train", checked_train)  # noqa: B010 - a method, patched for the trial

    def trainer_callback(self) -> Any:
        from transformers import TrainerCallback

        session = self
        self._check_trainers(_caller())

        class SweeperCallback(TrainerCallback):  # type: ignore[misc]
            sweeper_session = session  # what the Trainer's train() looks for (_check_trainers)

            def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                session.args = args
                session.program_run = program_run(args, state, kwargs.get("train_dataloader"))
                session.optimizer = kwargs.get("optimizer")
                session.loader = kwargs.get("train_dataloader")
                session._start(kwargs.get("model"))
                if session.loader is not None:
                    _time_batches(session.loader, session)

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                session._step_end()

            def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                # its run (epochs, max_steps) ended before the window did
                session._run_ended(end_program=True)

        return SweeperCallback()


def _caller() -> str:
    """'train.py:42' of the user's code that called into sweeper (the first frame outside
    sweeper's own package), or "" when there is none."""
    package = str(Path(__file__).resolve().parents[1])
    for frame in reversed(traceback.extract_stack()):
        if not str(Path(frame.filename).resolve()).startswith(package):
            return f"{Path(frame.filename).name}:{frame.lineno}"
    return ""


class _Step:
    def __init__(self, session: _Session) -> None:
        self._session = session

    def loss(self, value: Any) -> None:
        """The step's loss, for a loss computed outside the model (one whose output carries
        ``.loss`` is recorded already, and this call is then ignored)."""
        session = self._session
        if not session.loss_seen and session.ctx.recorder.phase != "done":
            session.ctx.recorder.loss(value.detach().float() if hasattr(value, "detach") else value)


def _end_children() -> None:
    """End the program's own processes (DataLoader workers, multiprocessing's resource
    tracker) with it. Left alone, a worker notices its parent is gone only at its next
    watchdog check (torch's 5 s), and holds the trial's stderr open until then: every script
    trial with workers took 5-6 s longer than its measurement."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


def _is_ddp(module: Any) -> bool:
    from torch.nn.parallel import DistributedDataParallel

    return isinstance(getattr(module, "_orig_mod", module), DistributedDataParallel)


def _wrappers_of(model: Any) -> list[Any]:
    """The DistributedDataParallel objects that wrap ``model``: a Trainer's callbacks see the
    model itself, while accelerate trains the DDP around it (``Trainer.model_wrapped``), which
    no callback argument shows; found once, at the read-back, among the live objects."""
    from torch.nn.parallel import DistributedDataParallel

    return [
        obj
        for obj in gc.get_objects()
        if isinstance(obj, DistributedDataParallel) and _unwrap(obj.module) is model
    ]


def _unwrap(model: Any) -> Any:
    """The transformers model under DDP's and torch.compile's wrappers."""
    for attribute in ("module", "_orig_mod"):
        model = getattr(model, attribute, model)
    return model


def _time_batches(loader: Any, session: _Session) -> None:
    """Make the Trainer's own DataLoader report each batch and the wait for it: the Trainer
    iterates this very object, so its class gains a timed ``__iter__``."""
    base = type(loader)

    def __iter__(self: Any) -> Iterator[Any]:  # noqa: N807
        from sweeper.trial.engines import timed

        for batch, waited_s in timed(base.__iter__(self)):
            if session.ctx is not None and session.ctx.recorder.phase != "done":
                session._batch(batch, waited_s)
            yield batch

    timed = type(f"Timed{base.__name__}", (base,), {"__iter__": __iter__})
    # object's own __class__ setter: accelerate's DataLoaderShard shadows __class__ with a
    # read-only property (it proxies the torch DataLoader's)
    object.__dict__["__class__"].__set__(loader, timed)
