"""The recipe's recorder, driven by a fake clock: every timing rule without torch or a device.

A fake engine advances the clock by each step's duration and pushes what happened; the
recorder decides burn-in, window and stop. Device timing (marks the device has not reached yet)
is simulated by a timer whose marks resolve only after a sync.
"""

from __future__ import annotations

import threading

import pytest

from sweeper.space_trial import MeasureSettings, WarmupSettings
from sweeper.trial.recipe import HostTimer, Recorder, merge


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0
        self.syncs = 0

    def __call__(self) -> float:
        return self.t

    def sync(self) -> None:
        self.syncs += 1


def _recorder(
    clock: FakeClock, warmup: dict | None = None, measure: dict | None = None
) -> Recorder:
    return Recorder(
        WarmupSettings(**({"min_steps": 2, "max_steps": 20, "max_seconds": 60} | (warmup or {}))),
        MeasureSettings(
            **(
                {
                    "min_steps": 5,
                    "max_steps": 200,
                    "min_seconds": 0,
                    "max_seconds": 100,
                    "target_ci": 0.02,
                    "warmup_multiple": 0,
                }
                | (measure or {})
            )  # fmt: skip
        ),
        HostTimer(clock=clock, sync=clock.sync),
    )


def _run(recorder: Recorder, clock: FakeClock, durations, wait_s: float = 0.0) -> int:
    """Feed steps of the given durations until the recorder is done; the steps fed."""
    recorder.start()
    for count, seconds in enumerate(durations, start=1):
        clock.t += wait_s
        recorder.batch(rows=4, real_tokens=300, padded_tokens=400, data_wait_s=wait_s)
        clock.t += seconds
        recorder.loss(2.0)
        if recorder.step_end():
            return count
    raise AssertionError("the recorder never finished")


def test_compile_steps_are_burn_in_and_never_enter_throughput() -> None:
    clock = FakeClock()
    recorder = _recorder(clock)
    fed = _run(recorder, clock, [30.0, 5.0] + [0.2] * 500)
    recording = recorder.recording
    summary = recording.summary()
    # burn-in ends once the median of the last 3 is within 5% of the 3 before: step 7
    assert recording.burn_in_times[:2] == [30.0, 5.0] and recording.steady
    assert len(recording.burn_in) == 7 and fed == 7 + len(recording.window)
    assert summary["step_time_p50_s"] == pytest.approx(0.2)
    assert summary["it_per_s"] == pytest.approx(5.0)
    assert summary["rows_per_s"] == pytest.approx(20.0)
    assert summary["tokens_per_s"] == pytest.approx(1500.0)
    assert summary["padding_share"] == pytest.approx(0.25)
    # what burn-in cost beyond steady steps: compile, reported apart
    assert summary["warmup_excess_s"] == pytest.approx(30.0 + 5.0 + 5 * 0.2 - 7 * 0.2)
    assert summary["first_step_s"] == 30.0


def test_window_stops_at_the_interval_target_after_min_steps_and_seconds() -> None:
    clock = FakeClock()
    recorder = _recorder(clock, measure={"min_steps": 10, "min_seconds": 3})
    _run(recorder, clock, [0.1] * 6 + [0.2, 0.21, 0.19] * 200)
    window = recorder.recording.window
    summary = recorder.recording.summary()
    assert summary["ci_met"] and summary["throughput_ci95_rel"] <= 0.02
    # min_seconds 3 at 0.2 s per step: 15 steps or more, not the 10 of min_steps
    assert len(window) >= 15 and recorder.recording.window_s >= 3


def test_window_stops_at_its_caps_and_reports_the_interval_it_reached() -> None:
    clock = FakeClock()
    recorder = _recorder(clock, measure={"max_steps": 12})
    noisy = [0.1, 0.3] * 400  # never within ±2%
    _run(recorder, clock, [0.2] * 6 + noisy)
    summary = recorder.recording.summary()
    assert summary["measured_steps"] == 12 and not summary["ci_met"]
    clock = FakeClock()
    recorder = _recorder(clock, measure={"max_seconds": 2.45})
    _run(recorder, clock, [0.2] * 6 + noisy)
    assert (
        recorder.recording.window_s == pytest.approx(2.5)
        and not recorder.recording.summary()["ci_met"]
    )


def test_a_run_that_ends_inside_the_window_keeps_it_only_with_the_steps_it_needs() -> None:
    """The program's own run ended first (``end_early``): a window of at least
    ``min_window_steps`` is kept as a capped one is, its time its steps' own; a shorter one is
    not closed, and its counts are there to say so."""

    def fed(steps: int, multiple: float) -> tuple[Recorder, FakeClock]:
        clock = FakeClock()
        recorder = _recorder(clock, measure={"warmup_multiple": multiple})
        recorder.start()
        for seconds in [0.2] * 6 + [0.1, 0.3] * steps:  # burn-in: 6 steps; never within ±2%
            recorder.batch(rows=4, real_tokens=300, padded_tokens=400, data_wait_s=0.0)
            clock.t += seconds
            assert not recorder.step_end()
        clock.t += 30.0  # what the program did after its loop (saving, printing)
        return recorder, clock

    recorder, _ = fed(20, multiple=4.0)  # 40 window steps, 24 needed
    assert recorder.min_window_steps == 24 and recorder.end_early() and recorder.done
    summary = recorder.recording.summary()
    assert summary["measured_steps"] == 40 and not summary["ci_met"]
    assert summary["window_s"] == pytest.approx(8.0) and summary["it_per_s"] == pytest.approx(5)
    assert summary["throughput_ci95_rel"] > 0.02  # the interval reached, as is
    recorder, _ = fed(5, multiple=4.0)  # 10 window steps, 24 needed
    assert not recorder.end_early() and recorder.phase == "window"
    assert len(recorder.recording.window_times) == 10 and recorder.min_window_steps == 24


def test_burn_in_is_capped_by_steps_and_seconds_and_says_it_never_settled() -> None:
    clock = FakeClock()
    recorder = _recorder(clock, warmup={"max_steps": 7})
    _run(recorder, clock, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0] + [0.2] * 100)
    assert len(recorder.recording.burn_in) == 7 and not recorder.recording.steady
    clock = FakeClock()
    recorder = _recorder(clock, warmup={"max_seconds": 10})
    _run(recorder, clock, [4.0, 1.0, 6.0] + [0.2] * 100)
    assert len(recorder.recording.burn_in) == 3  # 11 s > 10 s after the third step


def test_the_window_holds_a_multiple_of_burn_in_steps() -> None:
    clock = FakeClock()
    recorder = _recorder(clock, measure={"warmup_multiple": 4.0})
    _run(recorder, clock, [0.2] * 400)
    assert len(recorder.recording.window) >= 4 * len(recorder.recording.burn_in)


def test_data_wait_is_inside_step_time_and_kept_apart() -> None:
    clock = FakeClock()
    recorder = _recorder(clock)
    _run(recorder, clock, [0.1] * 300, wait_s=0.1)
    summary = recorder.recording.summary()
    assert summary["step_time_p50_s"] == pytest.approx(0.2)  # end to end: the wait is inside
    assert summary["data_wait_share"] == pytest.approx(0.5)


def test_burn_in_syncs_every_step_the_window_only_at_its_edges() -> None:
    clock = FakeClock()
    recorder = _recorder(clock)
    _run(recorder, clock, [0.2] * 300)
    burn_in, window = len(recorder.recording.burn_in), len(recorder.recording.window)
    assert window >= 5
    assert clock.syncs == 1 + burn_in + 1  # start, each burn-in step, the window's end


class LaggingTimer(HostTimer):
    """Device marks that resolve only once the host synchronizes (a queue on a GPU)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock=clock, sync=self._sync_all)
        self.pending: list[list] = []

    def _sync_all(self) -> None:
        for mark in self.pending:
            mark[1] = True
        self.pending.clear()

    def mark(self) -> list:
        mark = [self.now(), False]
        self.pending.append(mark)
        return mark

    def between(self, start: list, end: list) -> float | None:
        return end[0] - start[0] if end[1] else None


def test_device_marks_not_yet_reached_are_read_after_the_final_sync() -> None:
    clock = FakeClock()
    recorder = Recorder(
        WarmupSettings(min_steps=2, max_steps=10),
        MeasureSettings(min_steps=5, max_steps=30, min_seconds=0, warmup_multiple=0),
        LaggingTimer(clock),
    )
    _run(recorder, clock, [0.2] * 100)
    # no window step was known before the end (marks lag), so the window ran to its cap
    times = recorder.recording.window_times
    assert len(times) == 30 and times == pytest.approx([0.2] * 30)


def test_misuse_is_an_error_not_a_silent_measurement() -> None:
    clock = FakeClock()
    recorder = _recorder(clock)
    with pytest.raises(RuntimeError, match="before start"):
        recorder.step_end()
    recorder.start()
    with pytest.raises(RuntimeError, match="twice"):
        recorder.start()


def test_losses_are_summed_over_micro_batches_and_kept_per_step() -> None:
    clock = FakeClock()
    recorder = _recorder(clock)
    recorder.start()
    for _ in range(3):
        recorder.loss(0.5)
        recorder.loss(0.25)
        clock.t += 1
        recorder.step_end()
    assert recorder.losses() == [0.75, 0.75, 0.75]


def test_progress_marks_come_at_phase_edges_and_are_never_timed() -> None:
    """The recorder tells where it is at each burn-in step and the window's edges; a slow mark
    (a progress file on a slow disk) costs the measurement nothing."""
    clock = FakeClock()
    marks: list[tuple[str, dict]] = []

    def slow_mark(phase: str, **detail: object) -> None:
        marks.append((phase, detail))
        clock.t += 7.0  # far longer than any step: it would show in any timed figure

    recorder = _recorder(clock)
    recorder.on_phase = slow_mark
    _run(recorder, clock, [30.0, 5.0] + [0.2] * 500)
    recording = recorder.recording
    phases = [phase for phase, _ in marks]
    burn_in = len(recording.burn_in)
    # burn_in at start and after each burn-in step but the last, then the window, then done
    assert phases == ["burn_in"] * burn_in + ["window", "finishing"]
    assert [d["step"] for p, d in marks if p == "burn_in"] == list(range(burn_in))
    assert marks[-2][1] == {"steps": burn_in}
    # no mark inside the window: its steps and its wall time are the steps' own
    assert recording.burn_in_times[:2] == [30.0, 5.0]
    assert recording.window_times == pytest.approx([0.2] * len(recording.window))
    assert recording.window_s == pytest.approx(0.2 * len(recording.window))


class _AllReduce:
    """The group's verdict as an all-reduce (MAX) of the ranks' gives it: each rank's thread
    waits for the others' verdicts."""

    def __init__(self, ranks: int) -> None:
        self.verdicts = [False] * ranks
        self.barrier = threading.Barrier(ranks)

    def for_rank(self, rank: int):
        def agree(verdict: bool) -> bool:
            self.verdicts[rank] = verdict
            self.barrier.wait()
            group = any(self.verdicts)
            self.barrier.wait()  # every rank has read it before the next round writes
            return group

        return agree


def test_ranks_end_each_phase_together_and_merge_into_the_slowest_steps() -> None:
    """Two ranks of a multi-device trial: each phase ends for both when one rank's rule says
    so (``agree``), though their own rules would end them apart; the merged recording sums
    their rows and takes each step's slowest time."""
    group = _AllReduce(2)
    clocks = [FakeClock(), FakeClock()]
    recorders = [_recorder(c, measure={"min_steps": 3, "max_steps": 50}) for c in clocks]
    for rank, recorder in enumerate(recorders):
        recorder.agree = group.for_rank(rank)
    # rank 0 settles after its compile step; rank 1's steps jitter (its interval is wide)
    durations = [
        [30.0] + [1.0] * 200,
        [30.0] + [1.0, 1.5, 1.0, 1.2] * 50,
    ]
    fed = [0, 0]

    def train(rank: int) -> None:
        fed[rank] = _run(recorders[rank], clocks[rank], durations[rank])

    threads = [threading.Thread(target=train, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert fed[0] == fed[1] and fed[0] > 0  # the same steps, though rank 0 alone stops sooner
    own = FakeClock()
    alone = _run(_recorder(own, measure={"min_steps": 3, "max_steps": 50}), own, durations[1])
    assert fed[0] < alone  # rank 1 alone would have gone on to its caps
    merged = merge([r.recording for r in recorders])
    assert len(merged.window) == len(recorders[0].recording.window) > 0
    assert [s.rows for s in merged.window] == [8] * len(merged.window)
    slowest = [
        max(a, b) for a, b in zip(*(r.recording.window_times for r in recorders), strict=True)
    ]
    assert merged.window_times == slowest
    assert merged.window_s == max(r.recording.window_s for r in recorders)
