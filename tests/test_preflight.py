"""Preflight: what cannot run here is dropped before any trial spends budget."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from sweeper.job import ScriptSpec
from sweeper.preflight import PreflightError, PreflightReport, ProbeCache, run_preflight
from sweeper.preflight_precision import check_precision
from sweeper.preflight_script import script_imports, script_problems
from sweeper.space import Space
from sweeper.store import Store
from sweeper.trial.protocol import ChildRequest, ChildResult, PreparedData
from tests.helpers import REPO, SessionForkServer, tiny_config, tiny_space_without_baseline


def _space(space: Space, *, attn: list[str] | None = None, precision: str | None = None) -> Space:
    updates: dict[str, object] = {}
    if attn is not None:
        updates["search"] = space.search.model_copy(update={"attn_implementation": attn})
    if precision is not None:
        search = updates.get("search", space.search)
        updates["search"] = search.model_copy(update={"precision": [precision]})  # type: ignore[union-attr]
    return space.model_copy(update=updates)


def _launch(
    space: Path, sqlite_url: str, cache_dir: Path, *args: str
) -> subprocess.CompletedProcess:
    env = {**os.environ, "SWEEPER_CACHE_DIR": str(cache_dir), "COLUMNS": "200"}
    env.pop("SWEEPER_STORAGE", None)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "sweeper.cli",
            "launch",
            "--space",
            str(space),
            "--storage",
            sqlite_url,
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )


def test_report_allows_only_what_passed() -> None:
    report = PreflightReport(dropped={"attn_implementation": {"flex_attention": "unsupported: no"}})
    assert report.allows(tiny_config(attn_implementation="sdpa")) is None
    reason = report.allows(tiny_config(attn_implementation="flex_attention"))
    assert reason == "attn_implementation=flex_attention failed preflight: unsupported: no"


def test_unimportable_attention_is_dropped(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    notes: list[str] = []
    space = _space(tiny_space, attn=["sdpa", "flash_attention_2"])
    report = run_preflight(
        space, tiny_prepared, cache_dir, note=notes.append, server=run_forked.server_now()
    )
    assert set(report.dropped) == {"attn_implementation"}
    assert "flash_attention_2" in report.dropped["attn_implementation"]
    assert report.dropped["attn_implementation"]["flash_attention_2"].startswith("unsupported:")
    assert any("drops attn_implementation=flash_attention_2" in n for n in notes)
    (sdpa,) = [o for o in report.outcomes if o.value == "sdpa"]
    assert sdpa.ok and sdpa.step_s and sdpa.step_s > 0


def test_nothing_runnable_is_an_error(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    with pytest.raises(PreflightError, match="no attention implementation"):
        run_preflight(
            _space(tiny_space, attn=["flash_attention_2"]),
            tiny_prepared,
            cache_dir,
            server=run_forked.server_now(),
        )


def test_a_sweep_does_not_autotune_ahead(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    """Seen on a fresh H100: the max-autotune probe took 360 s of an 8-minute sweep, and the
    first trial was killed when the budget ran out. A sweep checks that inductor compiles here
    (default, as a stand-in when the space does not list it) and leaves max-autotune to its
    trials; ``sweeper doctor`` (collect=True) still probes it."""
    notes: list[str] = []
    space = _space(tiny_space, attn=["sdpa"])
    space = space.model_copy(
        update={
            "search": space.search.model_copy(update={"compile_mode": ["none", "max-autotune"]}),
            # the default-mode probe compiles with inductor: on 2 loaded cores (CI, load 6)
            # that once took more than the tiny space's 120 s, the probe timed out, and the
            # sweep (rightly) probed max-autotune itself. This test is about which probes run.
            "trial": space.trial.model_copy(update={"timeout_s": 900}),
        }
    )
    report = run_preflight(
        space, tiny_prepared, cache_dir, note=notes.append, server=run_forked.server_now()
    )
    probed = [(o.knob, o.value) for o in report.outcomes]
    said = [(o.knob, o.value, o.ok, o.reason) for o in report.outcomes]
    assert ("compile_mode", "default") in probed, said
    assert ("compile_mode", "max-autotune") not in probed, said
    assert "compile_mode" not in report.dropped
    assert report.allows(tiny_config(compile_mode="max-autotune")) is None
    assert any("does not compile max-autotune ahead" in n for n in notes), notes


def test_precision_probe_times_both_precisions(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    space = _space(tiny_space, attn=["sdpa"], precision="bf16")
    space = space.model_copy(
        update={"trial": space.trial.model_copy(update={"slow_precision_factor": 1000.0})}
    )
    (probe,) = run_preflight(
        space, tiny_prepared, cache_dir, server=run_forked.server_now()
    ).outcomes
    assert probe.ok and probe.step_s and probe.fp32_step_s and probe.fp32_step_s > 0


@pytest.mark.parametrize(
    ("step_s", "fp32_step_s", "refused"), [(1.0, 0.1, True), (0.2, 0.1, False), (0.05, 0.1, False)]
)
def test_precision_slower_than_the_limit_is_refused(
    tiny_space: Space, step_s: float, fp32_step_s: float, refused: bool
) -> None:
    space = _space(tiny_space, precision="bf16")  # slow_precision_factor defaults to 3
    payload = {"step_s": step_s, "fp32_step_s": fp32_step_s, "device_type": "cpu"}
    verdict = check_precision(space, "bf16", payload)
    if refused:
        assert verdict is not None
        assert "bf16 trains 10.0x slower than fp32 on this CPU" in verdict
        assert "set 'precision: fp32'" in verdict
    else:
        assert verdict is None


@pytest.mark.torch
def test_sweep_never_runs_what_preflight_dropped(
    tmp_path: Path, sqlite_url: str, cache_dir: Path
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        tiny_space_without_baseline()
        .replace("[sdpa, eager]", "[sdpa, flash_attention_2]")
        .replace("preflight: false", "preflight: true")
    )
    result = _launch(space, sqlite_url, cache_dir, "--n-trials", "3")
    assert result.returncode == 0, result.stderr + result.stdout
    assert "preflight drops attn_implementation=flash_attention_2" in result.stdout
    store = Store(sqlite_url)
    trials = store.list_trials("tiny")
    study_row = store.get_study("tiny")
    store.dispose()
    assert len(trials) == 3
    assert {t.config["attn_implementation"] for t in trials} == {"sdpa"}
    assert "flash_attention_2" in study_row.preflight["dropped"]["attn_implementation"]
    storage = optuna.storages.RDBStorage(sqlite_url)
    told = optuna.load_study(study_name="tiny", storage=storage).trials
    storage.engine.dispose()
    # a dropped value the sampler still proposes is told as infeasible (never "pruned", which
    # would rank it below every measured config without saying why)
    for trial in told:
        assert trial.state == optuna.trial.TrialState.COMPLETE, trial
        if trial.params.get("attn_implementation") == "flash_attention_2":
            assert "skipped" in trial.user_attrs and trial.constraints == {"runs_here": 1.0}


@pytest.mark.torch
def test_nothing_runnable_exits_2_before_any_trial(
    tmp_path: Path, sqlite_url: str, cache_dir: Path
) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        tiny_space_without_baseline()
        .replace("[sdpa, eager]", "[flash_attention_2]")
        .replace("preflight: false", "preflight: true")
    )
    result = _launch(space, sqlite_url, cache_dir)
    assert result.returncode == 2, result.stderr
    assert "preflight: no attention implementation" in result.stderr
    store = Store(sqlite_url)
    assert not store.has_study("tiny")  # no trial, and no empty study left behind
    store.dispose()


def test_probes_are_reused_on_the_same_machine_and_software(
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """doctor --space, then launch: the second does not pay for the same probes again."""
    cache = ProbeCache(tmp_path)
    space = _space(tiny_space, attn=["sdpa", "flash_attention_2"])
    first = run_preflight(
        space, tiny_prepared, cache_dir, probe_cache=cache, server=run_forked.server_now()
    )
    assert [o.cached_at for o in first.outcomes] == [None, None]
    notes: list[str] = []
    second = run_preflight(
        space,
        tiny_prepared,
        cache_dir,
        note=notes.append,
        probe_cache=cache,
        server=run_forked.server_now(),
    )
    assert all(o.cached_at is not None for o in second.outcomes)
    assert (
        second.dropped == first.dropped
        and "flash_attention_2" in second.dropped["attn_implementation"]
    )
    assert [o.step_s for o in second.outcomes] == [o.step_s for o in first.outcomes]
    assert any("reused 2 of 2 probe results" in n for n in notes), notes
    # another workload is another probe
    eager = run_preflight(_space(tiny_space, attn=["eager"]), tiny_prepared, cache_dir,
                          probe_cache=cache, server=run_forked.server_now())  # fmt: skip
    assert eager.outcomes[0].cached_at is None
    # past its time to live, a result is measured again
    for entry in cache.folder.iterdir():
        os.utime(entry, (0, 0))
    third = run_preflight(
        space, tiny_prepared, cache_dir, probe_cache=cache, server=run_forked.server_now()
    )
    assert [o.cached_at for o in third.outcomes] == [None, None]


def test_only_stable_results_are_kept_and_only_for_this_software(
    tiny_space: Space, tiny_prepared: PreparedData, tmp_path: Path
) -> None:
    cache = ProbeCache(tmp_path)
    request = ChildRequest.for_space("probe", tiny_space, tmp_path, prepared=tiny_prepared)
    cache.put(request, ChildResult(status="failed", failure_kind="oom", failure_message="x"))
    assert cache.get(request) is None  # an OOM may not happen again
    unsupported = ChildResult(status="failed", failure_kind="unsupported", failure_message="y")
    cache.put(request, unsupported)
    cached = cache.get(request)
    assert cached is not None and cached[0].failure_message == "y"
    other = ProbeCache(tmp_path)
    other.fingerprint["packages"]["flash-attn"] = "2.8.3"  # flash-attn installed since
    assert other.get(request) is None


_HOOKED = "import sweeper\n\n\ndef main(trainer):\n    trainer.add_callback(sweeper.callback())\n"


def test_a_script_that_cannot_start_is_said_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """engine: script: the program, the Python file and sweeper's importability in the
    script's python are checked by preflight (and so by doctor), each named with its fix."""
    (tmp_path / "train.py").write_text(_HOOKED)
    fine = ScriptSpec(command=[sys.executable, "train.py", "--x", "1"], cwd=str(tmp_path))
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        assert script_problems(fine) == []
    else:  # the controller's environment: a python without torch cannot run the trials
        said = script_problems(fine)
        assert any("cannot import torch (ModuleNotFoundError" in p for p in said), said
    # a script without sweeper's line would train to its end unmeasured in every trial. The
    # line is read, never run: an `accelerate` on PATH is all it needs (the controller's
    # environment, where this runs in CI, has no accelerate; CI at f4782ae)
    launcher = tmp_path / "bin" / "accelerate"
    launcher.parent.mkdir()
    launcher.write_text("#!/bin/sh\nexit 1\n")
    launcher.chmod(0o755)
    monkeypatch.setenv("PATH", f"{launcher.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    (tmp_path / "plain.py").write_text("from transformers import Trainer\nTrainer().train()\n")
    (unhooked,) = script_problems(ScriptSpec(command=["accelerate", "launch", "plain.py"],
                                             cwd=str(tmp_path)))  # fmt: skip
    assert "plain.py never calls sweeper's recorder" in unhooked, unhooked
    assert "callbacks=[sweeper.callback()]" in unhooked and "sweeper.step(" in unhooked
    # the line in a module of its own that it imports (its package) counts; a hooked file
    # beside it that it does not import does not (train.py above)
    (tmp_path / "mylib").mkdir()
    (tmp_path / "mylib" / "__init__.py").write_text("")
    (tmp_path / "mylib" / "loop.py").write_text(_HOOKED)
    (tmp_path / "run.py").write_text("from mylib import loop\nloop.main(None)\n")
    assert script_problems(ScriptSpec(command=["accelerate", "launch", "run.py"],
                                      cwd=str(tmp_path))) == []  # fmt: skip
    (missing,) = script_problems(ScriptSpec(command=["no-such-python-here", "train.py"]))
    assert "'no-such-python-here' is not a program here" in missing and sys.executable in missing
    # (first: where torch is missing, the python's problem follows)
    elsewhere = script_problems(ScriptSpec(command=[sys.executable, "trian.py"],
                                           cwd=str(tmp_path)))[0]  # fmt: skip
    assert f"trian.py is not a file in {tmp_path}" in elsewhere
    # a python that has no sweeper: a venv of its own, without site-packages from ours (and
    # no PYTHONPATH, through which the script, like this check, would find it)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True,
                   timeout=120)  # fmt: skip
    (cannot,) = script_problems(
        ScriptSpec(command=[str(bare / "bin" / "python"), "train.py"], cwd=str(tmp_path))
    )
    assert "cannot import sweeper (ModuleNotFoundError" in cannot, cannot


def test_a_script_that_would_crash_at_its_start_is_said_with_its_line(tmp_path: Path) -> None:
    """The script's own python reads the program before any trial loads a model: a file that
    does not parse, or an import it runs whenever it starts of a module that python cannot
    find, is a problem with its 1-based line (every trial would fail there: the 3 alike
    failures a sweep stops after, each paying a start); the same import inside a function or a
    condition is a note; a guarded one (try, TYPE_CHECKING) and a module of its own folder are
    the script's business. Nothing of the script runs: the marker file is never written."""
    (tmp_path / "mylocal.py").write_text("value = 1\n")
    (tmp_path / "train.py").write_text(
        "import os\n"
        "import sweeper\n"
        "import nonexistent_pkg_for_sweeper\n"
        "from mylocal import value\n"
        "open('ran', 'w').write('ran')\n"
        "try:\n    import wandb_not_here\nexcept ImportError:\n    pass\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import stubs_not_here\n"
        "\n\ndef main():\n    import optional_not_here\n    sweeper.callback()\n"
        "\n\nif __name__ == '__main__':\n    import also_not_here.sub\n    main()\n"
    )
    script = ScriptSpec(command=[sys.executable, "train.py"], cwd=str(tmp_path))
    problems, notes = script_imports(script)
    assert [p.split(": ", 2)[1] for p in problems] == ["train.py:3", "train.py:21"], problems
    assert "finds no module named 'nonexistent_pkg_for_sweeper'" in problems[0]
    assert "import also_not_here.sub" in problems[1] and "'also_not_here'" in problems[1]
    assert "install it in that environment" in problems[0]
    assert len(notes) == 1 and "train.py:16: import optional_not_here" in notes[0], notes
    assert not (tmp_path / "ran").exists()
    # a file that does not parse: its line, the trials' python named
    (tmp_path / "broken.py").write_text("import sweeper\n\ndef main(:\n    pass\n")
    broken = ScriptSpec(command=[sys.executable, "broken.py"], cwd=str(tmp_path))
    (syntax,) = script_imports(broken)[0]
    assert syntax.startswith("workload.script.command: broken.py:3: ") and sys.executable in syntax
    # a script whose imports are all there says nothing
    (tmp_path / "fine.py").write_text(_HOOKED)
    assert script_imports(ScriptSpec(command=[sys.executable, "fine.py"], cwd=str(tmp_path))) == (
        [],
        [],
    )


def test_a_scripts_own_python_runs_the_probes(
    tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path, tmp_path: Path
) -> None:
    """engine: script in a python other than sweeper's: attention, precision and compile are
    probed in that python (its torch and kernels are what the trials run on), found from the
    command or from a launcher's #! line. The python here is a real program that notes each
    start and runs this environment's interpreter."""
    from sweeper.job import ScriptSpec
    from sweeper.preflight_script import script_python

    started = tmp_path / "started"
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    python.write_text(f'#!/bin/sh\necho "$*" >> {started}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    launcher = tmp_path / "bin" / "mytorchrun"  # a console script of that environment
    launcher.write_text(f"#!{python}\nimport sys\n")
    launcher.chmod(0o755)
    (tmp_path / "train.py").write_text(_HOOKED)
    script = ScriptSpec(command=[str(python), "train.py"], cwd=str(tmp_path))
    assert script_python(script) == str(python)
    assert script_python(script.model_copy(update={"command": [str(launcher), "train.py"]})) == (
        str(python)
    )
    assert script_python(script.model_copy(update={"command": ["/bin/sh", "train.py"]})) is None
    space = _space(tiny_space, attn=["sdpa"], precision="fp32")
    space = space.model_copy(
        update={
            "workload": space.workload.model_copy(update={"engine": "script", "script": script})
        }
    )
    notes: list[str] = []
    report = run_preflight(space, tiny_prepared, cache_dir, note=notes.append)
    assert f"preflight probes in the script's python, {python}" in notes
    assert report.dropped == {} and report.outcomes, report
    probes = [line for line in started.read_text().splitlines() if "-m sweeper.trial" in line]
    assert len(probes) == len(report.outcomes), (probes, report.outcomes)


def test_a_data_file_the_command_names_and_is_not_there_is_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A walk's `--dataset_path` named a file not there: doctor said the space can run, and
    each trial failed at the program's load. It is said before (a note: an output the program
    writes may end so too)."""
    from sweeper.preflight_script import absent_inputs
    from tests.helpers import script_space

    monkeypatch.chdir(tmp_path)
    (tmp_path / "here.jsonl").write_text("{}\n")
    space = script_space(
        ["python", "train.py", "--dataset_path", "commonsense_300.json", "--eval", "here.jsonl",
         "--output_dir", "out"]
    )  # fmt: skip
    (note,) = absent_inputs(space.workload.script)
    assert note.startswith(
        f"workload.script.command: commonsense_300.json is not a file in {tmp_path}"
    )
    assert "fails at its start" in note
