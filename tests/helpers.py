"""Small shared helpers for tests (fixtures live in conftest.py)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sweeper.launcher import ChildRun, ForkServer, run_child
from sweeper.space import Space, TrialConfig
from sweeper.trial.progress import PROGRESS_ENV
from sweeper.trial.protocol import ChildRequest, PreparedData

SPACES = Path(__file__).parent / "spaces"
REPO = Path(__file__).parent.parent
TINY_SPACE = SPACES / "tiny.yaml"
# a new PID namespace, as a container's: its processes do not see ours
UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def can_unshare() -> bool:
    try:
        return subprocess.run([*UNSHARE, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def tiny_space_without_baseline() -> str:
    """The tiny space's text minus its baseline, for tests that rewrite the search lists."""
    return TINY_SPACE.read_text().split("\nbaseline:")[0] + "\n"


# A study row as a sweep of seed 000's job on an H100 would write it.
STUDY_FIELDS: dict[str, object] = {
    "state": "running",
    "hardware_name": "H100 SXM 80GB",
    "usd_per_hour": 2.5,
    "device": "cuda",
    "samples": 600_000,
    "epochs": 3.0,
    "n_trials_planned": 8,
    "space_yaml": "study: llama-1b\nhardware:\n  name: H100 SXM 80GB\n",
    "space_path": None,
}


def run_sweeper(
    *args: str,
    cache_dir: Path | None = None,
    cwd: Path = REPO,
    timeout: float = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``sweeper ARGS`` from this checkout in a child: in ``env`` if given, else with no
    SWEEPER_* setting inherited (but SWEEPER_CACHE_DIR when ``cache_dir`` is given)."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWEEPER_")}
        # this checkout first, then whatever the run put there (transformers at its floor)
        path = [str(REPO), *filter(None, [env.get("PYTHONPATH")])]
        env.update(COLUMNS="200", PYTHONPATH=os.pathsep.join(path))
        if cache_dir is not None:
            env["SWEEPER_CACHE_DIR"] = str(cache_dir)
    return subprocess.run(
        [sys.executable, "-m", "sweeper.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def tiny_config(**overrides: object) -> TrialConfig:
    """A config of the tiny space: batch 4 × accumulation 2, seq 64, sdpa, no workers."""
    values: dict[str, object] = {
        "per_device_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "num_workers": 0,
        "prefetch_factor": None,
        "max_seq_length": 64,
        "compile_mode": "none",
        "attn_implementation": "sdpa",
    }
    return TrialConfig.model_validate(values | overrides)


def trial_request(
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    config: TrialConfig,
    *,
    device: str = "cpu",
    warmup: dict[str, object] | None = None,
    measure: dict[str, object] | None = None,
) -> ChildRequest:
    """A trial request for ``config``; ``warmup``/``measure`` override the space's settings."""
    return ChildRequest(
        kind="trial",
        workload=space.workload,
        device=device,
        cache_dir=str(cache_dir),
        prepared=prepared,
        config=config,
        settings=space.trial.model_copy(
            update={
                "warmup": space.trial.warmup.model_copy(update=warmup or {}),
                "measure": space.trial.measure.model_copy(update=measure or {}),
            }
        ),
    )


def assert_cheapest_or_tied(recommendation: Any, trials: Sequence[Any]) -> Any:
    """The recommendation is the cheapest trial, or, when others tie with the cheapest within
    the noise (sweeper.noise.tie), the baseline if it is among them, else the tied one with
    the least peak memory among those within 5% of the cheapest's figure. ``trials``: rows
    (or dicts) with number, cost_per_run_usd and peak_memory_bytes; returns the chosen one."""

    def get(t: Any, key: str) -> Any:
        return t[key] if isinstance(t, dict) else getattr(t, key)

    cheapest = min(trials, key=lambda t: (get(t, "cost_per_run_usd"), get(t, "number")))
    chosen = next(t for t in trials if get(t, "number") == recommendation.trial_number)
    if chosen is not cheapest:
        assert get(cheapest, "number") in recommendation.ties, recommendation
        assert recommendation.tie_note, recommendation
        if recommendation.trial_number == recommendation.baseline_trial_number:
            assert "picked for being the baseline" in recommendation.tie_note
        else:
            chosen_peak = get(chosen, "peak_memory_bytes") or 0
            assert chosen_peak <= (get(cheapest, "peak_memory_bytes") or 0)
            assert "least peak memory" in recommendation.tie_note
            # memory buys at most recommend.MEMORY_TRADE of the cheapest's figure
            cheapest_cost = get(cheapest, "cost_per_run_usd")
            assert get(chosen, "cost_per_run_usd") <= cheapest_cost * 1.05 + 1e-12
    return chosen


@dataclasses.dataclass(frozen=True)
class FaultTally:
    """What a fault left behind in a study, as an operator would count it."""

    scenario: str
    requested: int  # trials asked for
    complete: int
    lost: int  # trials whose worker died (reaped)
    interrupted: int  # trials a signal stopped
    other_failed: int
    duplicates: int  # runs of a config beyond its first (a lost/interrupted trial's retry excepted)
    duplicate_numbers: int  # trial numbers recorded twice
    stuck: int  # RUNNING in sweeper's or Optuna's table, or a worker still marked alive

    def line(self) -> str:
        return (
            f"{self.scenario}: requested {self.requested}, complete {self.complete}, lost "
            f"{self.lost}, interrupted {self.interrupted}, other failures {self.other_failed}, "
            f"duplicate configs {self.duplicates}, duplicate numbers "
            f"{self.duplicate_numbers}, stuck {self.stuck}"
        )


def tally_study(url: str, study: str, scenario: str, requested: int) -> FaultTally:
    """Count the outcome of every trial of ``study`` in both tables (sweeper's and Optuna's)."""
    import json
    from collections import Counter

    import optuna

    from sweeper.store import Store

    store = Store(url)
    try:
        trials = store.list_trials(study)
        workers = store.list_workers(study)
    finally:
        store.dispose()
    storage = optuna.storages.RDBStorage(url)
    try:
        optuna_trials = optuna.load_study(study_name=study, storage=storage).trials
    finally:
        storage.engine.dispose()
    runs = Counter(json.dumps(t.config, sort_keys=True) for t in trials)
    # a lost or interrupted trial's config runs once more: that retry is no duplicate
    lost = Counter(
        json.dumps(t.config, sort_keys=True)
        for t in trials
        if t.failure_kind in ("lost", "interrupted")
    )
    kinds = Counter(t.failure_kind for t in trials if t.state == "failed")
    return FaultTally(
        scenario=scenario,
        requested=requested,
        complete=sum(t.state == "complete" for t in trials),
        lost=kinds.pop("lost", 0),
        interrupted=kinds.pop("interrupted", 0),
        other_failed=sum(kinds.values()),
        duplicates=sum(max(0, n - 1 - min(lost[key], 1)) for key, n in runs.items()),
        duplicate_numbers=len(trials) - len({t.number for t in trials}),
        stuck=sum(t.state == "running" for t in trials)
        + sum(t.state == optuna.trial.TrialState.RUNNING for t in optuna_trials)
        + sum(w.state == "alive" for w, _ in workers),
    )


class Notes:
    """A sweep observer that keeps the notes it hears (``SweepObserver.note``) and shows
    nothing else."""

    def __init__(self) -> None:
        self.notes: list[str] = []

    def note(self, message: str) -> None:
        self.notes.append(message)

    def __getattr__(self, name: str) -> Any:  # the rest of SweepObserver: nothing to show
        return lambda *args, **kwargs: None


# what a test may change in os.environ without changing what a forked child sees: pytest's
# own, and what run_child sets for every child, spawned or forked (test_oneoff's compile_slot
# tests set the Inductor and Triton caches in this process: a zygote restarted for them)
_TEST_ENV = {
    "PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR", PROGRESS_ENV,
}  # fmt: skip


class SessionForkServer:
    """``run_child`` through one fork server per test process (each pytest-xdist worker has
    its own session): the zygote imports torch, transformers and datasets once, and each child
    is forked from it, as every sweep's prepare, probe and trial children are. A spawned child
    paid those imports each time (2.3 CPU-s here, 4-8 on the CI machine), 50-odd times a run.

    No preload (a sweep's zygote loads its one workload's data and model code; the tests'
    children vary both): a forked child loads its tokenizer, data and model code itself, as a
    spawned one does, in its own trial directory, TMPDIR and Inductor/Triton caches
    (``run_child`` sets them per child). For the tests whose subject is not the spawn itself:
    those that test spawning, ``python=``, a zygote's death or CUDA, or that find the trial's
    processes by their command line, call ``run_child`` directly.

    A forked child starts from the zygote's environment (this process's when the zygote
    started) plus ``env``: when os.environ has changed since (a test's monkeypatch, a package
    that sets a variable at import), a new zygote is started in the environment a spawned
    child would have. A request for another cache directory than the session's (the zygote's
    HF_DATASETS_CACHE is set from it) fails: such a test calls ``run_child``."""

    def __init__(self, cache_dir: Path, workdir: Path) -> None:
        self.cache_dir, self.workdir = str(cache_dir), workdir
        self.server: ForkServer | None = None
        self.environ: dict[str, str] = {}
        self.started = 0  # zygotes started: one, unless the environment changed or one died

    def __call__(self, request: ChildRequest, **kwargs: Any) -> ChildRun:
        assert request.cache_dir == self.cache_dir, (
            f"the session's fork server serves {self.cache_dir}; call run_child for "
            f"{request.cache_dir}"
        )
        run = run_child(request, server=self.server_now(), **kwargs)
        assert run.inherited_startup_s > 0.0, "the session's fork server did not fork it"
        return run

    def server_now(self) -> ForkServer:
        """The zygote, for code that takes one (``run_preflight(server=...)``, as a launch
        passes its own): started, or started again, in this process's environment now."""
        if self.server is None or not self.server.alive or _environ() != self.environ:
            self.close()  # none yet, a dead one, or one started in another environment
            self.environ = _environ()
            self.server = ForkServer(self.cache_dir, workdir=self.workdir).__enter__()
            self.started += 1
            assert self.server.alive, "the session's fork server did not start"
        return self.server

    def close(self) -> None:
        if self.server is not None:
            server, self.server = self.server, None
            server.__exit__(None, None, None)


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _TEST_ENV}


def make_tiny_job(out: Path, records: int) -> Path:
    """The stand-in for a user's own job at ``out`` (``scripts/tiny_job.py``): a tiny Llama
    directory written by save_pretrained, its tokenizer, and ``records`` chat records."""
    made = subprocess.run(
        [sys.executable, "scripts/tiny_job.py", "--out", str(out), "--records", str(records)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return out


def script_space(
    command: list[str], *, search: str = "", form: str = "flags", length: bool = True
) -> Space:
    """A script space (engine: script) running ``command`` with its knobs as ``form``, read
    from the words only (nothing here needs my-job/ to exist); ``length``: it lists
    max_seq_length [256] (without: the data chooses, ``sweeper.seqlen.resolve``)."""
    import json

    from sweeper.space import parse_space

    return parse_space(
        "study: mine\n"
        "hardware: {name: CPU, usd_per_hour: 0.10, device: cpu}\n"
        "workload:\n"
        "  model: {id: my-job/model}\n"
        "  dataset: {path: my-job/chats.jsonl, messages_field: messages}\n"
        "  engine: script\n"
        "  samples: 1000\n"
        "  epochs: 1\n"
        f"  script: {{command: {json.dumps(command)}, knobs: {form}}}\n"
        "search:\n" + ("  max_seq_length: [256]\n" if length else "") + search
    )
