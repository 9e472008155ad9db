"""Study files: a real sweep exported, imported into SQLite and Postgres, exported again, the
same; the imported study answers `best`, the REST API and the dashboard, and a sweep resumes it.
Bad files and name clashes are clear errors that write nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from sweeper.errors import ConflictError, StorageError
from sweeper.recommend import best
from sweeper.space import parse_space
from sweeper.store import Store
from sweeper.studyfile import (
    StudyDocument,
    StudyFileError,
    export_study,
    import_study,
    model_shape,
    padding_notes,
    read_study_file,
    real_token_mfu,
    write_study_file,
)
from sweeper.sweep.run import run_sweep
from tests.helpers import REPO, TINY_SPACE, assert_cheapest_or_tied, run_sweeper

# The tiny space, where also_try asks for flash_attention_2: a trial that fails (as data).
SPACE_TEXT = (
    TINY_SPACE.read_text().replace("[sdpa, eager]", "[sdpa, eager, flash_attention_2]")
    + """also_try:
  - label: no flash-attn here
    per_device_batch_size: 4
    gradient_accumulation_steps: 1
    num_workers: 0
    max_seq_length: 64
    attn_implementation: flash_attention_2
"""
)


def _content(document: StudyDocument | dict[str, Any]) -> dict[str, Any]:
    data = document.model_dump(mode="json") if isinstance(document, StudyDocument) else document
    return {k: v for k, v in data.items() if k != "exported_at"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """A real sweep of three trials (one fails), exported to a file."""
    folder = tmp_path_factory.mktemp("recorded")
    url = f"sqlite:///{folder / 'source.db'}"
    report = run_sweep(
        parse_space(SPACE_TEXT), storage_url=url, cache_dir=cache_dir, space_text=SPACE_TEXT,
        n_trials=3,
    )  # fmt: skip
    # the baseline runs, flash_attention_2 fails (as data), the sampled third either
    assert report.trials_run == 3 and report.completed >= 1 and report.failed >= 1, report
    store = Store(url)
    path = folder / "tiny.json"
    write_study_file(export_study(store, "tiny"), path)
    store.dispose()
    return path


def test_round_trip_is_lossless(recorded: Path, storage_url: str) -> None:
    original = read_study_file(recorded)
    told = original.optuna.trials  # type: ignore[union-attr]
    # flash_attention_2 failed here: Optuna was told it as a completed, infeasible trial
    assert {t.state for t in told} == {"COMPLETE"}
    assert any(v == 1.0 for t in told for k, v in t.system_attrs.items() if "constraints" in k)
    assert {t["state"] for t in original.trials} == {"complete", "failed"}
    store = Store(storage_url)
    store.migrate()
    assert import_study(store, original) == "tiny"
    again = export_study(store, "tiny")
    store.dispose()
    assert _content(again) == _content(json.loads(recorded.read_text()))


def test_imported_study_answers_best_the_api_and_the_dashboard(
    recorded: Path, storage_url: str
) -> None:
    document = read_study_file(recorded)
    store = Store(storage_url)
    store.migrate()
    import_study(store, document, name="copy")
    recommendation = best(store, "copy")
    store.dispose()
    complete = [t for t in document.trials if t["state"] == "complete"]
    chosen = assert_cheapest_or_tied(recommendation, complete)
    assert recommendation.cost_per_run_usd == chosen["cost_per_run_usd"]
    with TestClient(create_app(storage_url)) as client:
        api_best = client.get("/api/studies/copy/best")
        assert api_best.status_code == 200
        assert api_best.json()["trial_number"] == chosen["number"]
        trials = client.get("/api/studies/copy/trials")
        assert [t["number"] for t in trials.json()] == [t["number"] for t in document.trials]
        page = client.get("/studies/copy")
        assert page.status_code == 200 and "copy" in page.text
        figures = client.get("/studies/copy/figures.json")
        assert figures.status_code == 200 and figures.json()


def test_a_sweep_resumes_an_imported_study(
    recorded: Path, sqlite_url: str, cache_dir: Path
) -> None:
    document = read_study_file(recorded)
    store = Store(sqlite_url)
    store.migrate()
    import_study(store, document)
    report = run_sweep(
        parse_space(SPACE_TEXT), storage_url=sqlite_url, cache_dir=cache_dir,
        space_text=SPACE_TEXT, n_trials=1,
    )  # fmt: skip
    assert report.trials_run == 1
    numbers = [t.number for t in store.list_trials("tiny")]
    store.dispose()
    recorded_numbers = [t["number"] for t in document.trials]
    assert numbers[: len(recorded_numbers)] == recorded_numbers
    # Optuna numbers the new trial after the imported ones (a proposal it skipped as already
    # measured takes a number too)
    assert numbers[-1] >= len(document.optuna.trials)  # type: ignore[union-attr]
    storage = optuna.storages.RDBStorage(sqlite_url)
    trials = optuna.load_study(study_name="tiny", storage=storage).trials
    storage.engine.dispose()
    assert len(trials) == numbers[-1] + 1


def test_export_refuses_a_running_sweep_unless_forced(recorded: Path, sqlite_url: str) -> None:
    store = Store(sqlite_url)
    store.migrate()
    import_study(store, read_study_file(recorded))
    store.set_study_state("tiny", "running")
    with pytest.raises(ConflictError, match="--force"):
        export_study(store, "tiny")
    assert export_study(store, "tiny", allow_running=True).study["state"] == "running"
    store.dispose()


def test_a_failed_import_leaves_nothing_behind(recorded: Path, postgres_url: str) -> None:
    """Postgres refuses a NUL character in JSON after Optuna's part is written: that part is
    removed again, and no row of ours exists."""
    data = json.loads(recorded.read_text())
    data["trials"][0]["measurement"]["env"]["host"] = "bad\u0000host"
    document = StudyDocument.model_validate(data)
    store = Store(postgres_url)
    store.migrate()
    with pytest.raises(StorageError):
        import_study(store, document)
    assert not store.has_study("tiny")
    store.dispose()
    storage = optuna.storages.RDBStorage(postgres_url)
    assert optuna.get_all_study_names(storage) == []
    storage.engine.dispose()


def test_cli_export_import_and_clear_errors(recorded: Path, tmp_path: Path) -> None:
    target = f"sqlite:///{tmp_path / 'target.db'}"
    imported = run_sweeper("study", "import", str(recorded), "--storage", target, cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert "imported study 'tiny' (3 trials)" in imported.stdout
    # the next command it suggests reads this store, not the default sweeper.db
    said = " ".join(imported.stdout.split())
    assert f"see it with `sweeper best --study tiny --storage {target}`" in said, said
    exported = run_sweeper("study", "export", "--study", "tiny", "--storage", target, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr
    written = tmp_path / "studies" / "tiny.json"  # the default place
    assert _content(json.loads(written.read_text())) == _content(json.loads(recorded.read_text()))
    assert oct(written.stat().st_mode & 0o777) == "0o644"
    # a second export keeps the file (studies/ holds recorded sweeps) unless told to replace it
    written.write_text("kept")
    again = run_sweeper("study", "export", "--study", "tiny", "--storage", target, cwd=tmp_path)
    assert again.returncode == 2 and "--overwrite" in again.stderr, again.stderr
    assert written.read_text() == "kept"
    replaced = run_sweeper(
        "study", "export", "--study", "tiny", "--storage", target, "--overwrite", cwd=tmp_path
    )
    assert replaced.returncode == 0, replaced.stderr
    assert _content(json.loads(written.read_text())) == _content(json.loads(recorded.read_text()))

    clash = run_sweeper("study", "import", str(recorded), "--storage", target, cwd=tmp_path)
    assert clash.returncode == 1 and "--as NEW_NAME" in clash.stderr
    renamed = run_sweeper(
        "study", "import", str(recorded), "--storage", target, "--as", "tiny-2", cwd=tmp_path
    )
    assert renamed.returncode == 0, renamed.stderr

    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    data = json.loads(recorded.read_text())
    cases: dict[str, tuple[str, str]] = {
        "not-json.json": ("{ nope", "not valid JSON"),
        "other.json": (json.dumps({"format": "something"}), "not a sweeper study file"),
        "newer.json": (
            json.dumps({**data, "trials": [{**data["trials"][0], "gpu_watts": 700}]}),
            "unknown field(s) gpu_watts",
        ),
        "bad-number.json": (
            json.dumps({**data, "trials": [{**data["trials"][0], "samples_per_s": "fast"}]}),
            "trials[0].samples_per_s: expected a finite number",
        ),
        # what a live write never stores, and what once made every page answer 500
        "bad-state.json": (
            json.dumps({**data, "trials": [{**data["trials"][0], "state": "zombie"}]}),
            "trials[0].state: 'zombie' is not a trial state; expected one of running, complete",
        ),
        "bad-study-state.json": (
            json.dumps({**data, "study": {**data["study"], "state": "sleeping"}}),
            "study.state: 'sleeping' is not a study state",
        ),
        "bad-knob.json": (
            json.dumps(
                {
                    **data,
                    "trials": [
                        {
                            **data["trials"][0],
                            "config": {**data["trials"][0]["config"], "attn_implementation": "x"},
                        }
                    ],
                }
            ),
            "trials[0].config.attn_implementation: Input should be",
        ),
        "bad-batch.json": (
            json.dumps(
                {
                    **data,
                    "trials": [
                        {
                            **data["trials"][0],
                            "config": {**data["trials"][0]["config"], "per_device_batch_size": 0},
                        }
                    ],
                }
            ),
            "trials[0].config.per_device_batch_size: Input should be greater than 0 (got 0)",
        ),
    }
    for name, (text, message) in cases.items():
        bad = tmp_path / name
        bad.write_text(text)
        result = run_sweeper("study", "import", str(bad), "--storage", fresh, cwd=tmp_path)
        assert result.returncode == 2, (name, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    bad_name = run_sweeper(
        "study", "import", str(recorded), "--storage", fresh, "--as", "../x", cwd=tmp_path
    )
    assert bad_name.returncode == 2 and "study name '../x'" in bad_name.stderr
    store = Store(fresh)
    store.migrate()
    assert store.list_studies() == []
    store.dispose()
    missing = run_sweeper("study", "export", "--study", "nope", "--storage", fresh, cwd=tmp_path)
    assert missing.returncode == 1 and "no study named 'nope'" in missing.stderr


def test_a_worker_resumes_a_study_imported_under_another_name(
    recorded: Path, tmp_path: Path, cache_dir: Path
) -> None:
    """The stored space still says ``study: tiny``; the worker sweeps the study it was given
    (it once created a second study under the file's name and measured its configs again)."""
    target = f"sqlite:///{tmp_path / 'target.db'}"
    imported = run_sweeper("study", "import", str(recorded), "--storage", target, "--as", "copy")
    assert imported.returncode == 0, imported.stderr
    worker = run_sweeper(
        "worker", "--study", "copy", "--storage", target, "--n-trials", "1",
        cache_dir=cache_dir, timeout=900,
    )  # fmt: skip
    assert worker.returncode == 0, worker.stdout + worker.stderr
    store = Store(target)
    names = [row.name for row, _ in store.list_studies()]
    trials = store.list_trials("copy")
    store.dispose()
    assert names == ["copy"]
    assert len(trials) == len(read_study_file(recorded).trials) + 1
    storage = optuna.storages.RDBStorage(target)
    assert optuna.get_all_study_names(storage=storage) == ["copy"]
    storage.engine.dispose()
    # launch --fill counts the imported study's trials, not those of the file's name (none):
    # it has every one asked for, so it runs nothing
    filled = run_sweeper(
        "launch", "--study", "copy", "--storage", target, "--fill", "--n-trials", str(len(trials)),
        cache_dir=cache_dir,
    )  # fmt: skip
    assert filled.returncode == 0, filled.stdout + filled.stderr
    said = " ".join(filled.stdout.split())
    assert f"study copy in {target} already has {len(trials)} of its {len(trials)} trials" in said
    for args, message in [
        ([], "pass --space FILE (a space file) or --study NAME (a stored study)"),
        (["--study", "nope"], f"no study named 'nope' in {target} (its studies: copy)"),
        (["--space", str(TINY_SPACE), "--study", "bad name"], "--study 'bad name': a study name"),
    ]:
        refused = run_sweeper("launch", "--storage", target, *args, cache_dir=cache_dir)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert message in " ".join(refused.stderr.split()), refused.stderr


def test_the_committed_demo_study_loads(sqlite_url: str) -> None:
    """studies/cpu-demo.json, recorded on this kind of machine, imports and recommends."""
    path = REPO / "studies" / "cpu-demo.json"
    document = read_study_file(path)
    store = Store(sqlite_url)
    store.migrate()
    import_study(store, document)
    recommendation = best(store, "cpu-demo")
    again = export_study(store, "cpu-demo")
    store.dispose()
    complete = [t for t in document.trials if t["state"] == "complete"]
    assert len(complete) >= 8
    assert recommendation.trial_number in {t["number"] for t in complete}
    assert _content(again) == _content(json.loads(path.read_text()))


@pytest.mark.parametrize("path", sorted((REPO / "studies").glob("*.json")), ids=lambda p: p.stem)
def test_every_committed_study_serves_its_pages_and_api(path: Path, tmp_path: Path) -> None:
    """Each study in studies/ (the CPU demo, the H100 records) as a user who imports it sees it:
    every page and REST answer renders, none is a 5xx. The H100 record of 2026-11-25 once made
    the trials list and the study page 500 (its projections name where their one-off figures
    came from, as strings)."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    store = Store(url)
    store.migrate()
    name = import_study(store, read_study_file(path))
    numbers = [t.number for t in store.list_trials(name)]
    store.dispose()
    with TestClient(create_app(url)) as client:
        for route in ("/", f"/studies/{name}", f"/api/studies/{name}", "/api/studies"):
            response = client.get(route)
            assert response.status_code == 200, (route, response.text[:500])
        trials = client.get(f"/api/studies/{name}/trials")
        assert trials.status_code == 200, trials.text[:500]
        assert sorted(t["number"] for t in trials.json()) == sorted(numbers)
        for number in numbers:
            one = client.get(f"/api/studies/{name}/trials/{number}")
            assert one.status_code == 200, (number, one.text[:500])
        answer = client.get(f"/api/studies/{name}/best")
        # a recommendation, or the documented 'no answer yet' with its reason; never a 5xx
        assert answer.status_code in (200, 404, 409), answer.text[:500]
        assert answer.json()


def test_a_file_that_is_not_a_study_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(StudyFileError, match="not UTF-8"):
        read_study_file(path)
    with pytest.raises(StudyFileError, match="cannot read"):
        read_study_file(tmp_path / "missing.json")


# ---------------------------------------------------------------- MFU of older records

H100_STUDY = REPO / "studies" / "h100-llama-1b.json"  # recorded before real-token MFU


def _h100_trials() -> dict[int, dict[str, Any]]:
    return {t["number"]: t for t in json.loads(H100_STUDY.read_text())["trials"]}


def _expected_real_mfu(trials: dict[int, dict[str, Any]], number: int) -> float:
    """Real-token MFU from the record's own figures, by another road than the code's: the
    attention FLOPs per token of context (12·L·d) read off two trials of different padded row
    lengths, the peak and the real tokens/s as recorded (not the recorded MFU)."""
    a, b = trials[0]["measurement"], trials[3]["measurement"]
    per_context_token = (a["flops_per_token"] - b["flops_per_token"]) / (
        a["mean_row_tokens"] - b["mean_row_tokens"]
    )
    m = trials[number]["measurement"]
    real_length = m["mean_row_tokens"] * m["tokens_per_s"] / m["padded_tokens_per_s"]
    flops_real = m["flops_per_token"] - per_context_token * (m["mean_row_tokens"] - real_length)
    return flops_real * m["tokens_per_s"] / (m["peak_tflops"] * 1e12)


def test_an_old_records_mfu_is_said_to_count_padding_and_the_real_token_one_derived() -> None:
    trials = _h100_trials()
    document = read_study_file(H100_STUDY)
    shape = model_shape(document.study["space_yaml"])
    assert shape == (16, 2048)  # the 1b preset; 12·L·d matches the record's own slope
    for number in (0, 1, 2, 3):  # unpacked: 42-71% of the computed tokens were padding
        m = trials[number]["measurement"]
        accounting = real_token_mfu(m, shape)
        assert accounting is not None and accounting.counts_padding and accounting.derived
        assert accounting.recorded_mfu == m["mfu"]  # the record is read, never rewritten
        assert accounting.mfu == pytest.approx(_expected_real_mfu(trials, number), rel=1e-6)
        assert accounting.mfu < m["mfu"] * (1 - m["padding_share"]) < m["mfu"]
        assert "derived" in accounting.label and not accounting.upper_bound
        # without the model's shape: the padded share off, the attention term left: a bound
        bound = real_token_mfu(m)
        assert bound is not None and bound.upper_bound
        assert bound.mfu == pytest.approx(m["mfu"] * (1 - m["padding_share"]), rel=1e-9)
        assert bound.label.startswith("at most ") and bound.mfu > accounting.mfu
    for number in (4, 5):  # packed: no padding, both accountings agree
        accounting = real_token_mfu(trials[number]["measurement"], shape)
        assert accounting is not None and not accounting.counts_padding
        assert accounting.mfu == trials[number]["mfu"] and not accounting.derived
    # a measurement with real-token accounting (mean_sample_tokens, FLOPs on real tokens)
    m = trials[0]["measurement"]
    new = m | {
        "mean_sample_tokens": 613.0,
        "achieved_tflops": m["flops_per_token"] * m["tokens_per_s"] / 1e12,
    }
    assert real_token_mfu(new, shape) == real_token_mfu(new | {"mean_sample_tokens": None}, shape)
    assert not real_token_mfu(new, shape).counts_padding  # type: ignore[union-attr]
    assert real_token_mfu({"mfu": None}) is None  # a CPU records none
    notes = padding_notes(document)
    assert [n.split(":")[0] for n in notes] == ["trial #0", "trial #1", "trial #2", "trial #3"]
    assert "recorded MFU 25.8% counts padding" in notes[0] and "real-token MFU 7.1%" in notes[0]


def test_the_import_the_rest_api_and_the_dashboard_label_an_old_records_mfu(
    tmp_path: Path,
) -> None:
    trials = _h100_trials()
    url = f"sqlite:///{tmp_path / 'h100.db'}"
    run = run_sweeper("study", "import", str(H100_STUDY), "--storage", url)
    assert run.returncode == 0, run.stderr
    said = " ".join(run.stdout.split())
    for number in (0, 1, 2, 3):
        assert f"trial #{number}: recorded MFU {trials[number]['mfu']:.1%} counts padding" in said
    assert "trial #4" not in said
    with TestClient(create_app(url)) as client:
        for number in (0, 4):
            answer = client.get(f"/api/studies/h100-llama-1b/trials/{number}")
            assert answer.status_code == 200, answer.text
            body = answer.json()
            assert body["mfu"] == trials[number]["mfu"]  # as recorded
            accounting = body["real_token_mfu"]
            assert accounting["recorded_mfu"] == trials[number]["mfu"]
            assert accounting["derived"] is accounting["counts_padding"] is (number == 0)
        assert accounting["mfu"] == trials[4]["mfu"]
        derived = client.get("/api/studies/h100-llama-1b/trials/0").json()["real_token_mfu"]
        assert derived["mfu"] == pytest.approx(_expected_real_mfu(trials, 0), rel=1e-6)
        page = client.get("/studies/h100-llama-1b")
        assert page.status_code == 200
        rows = [r.split("</tr>")[0] for r in page.text.split('<tr class="" data-number="')[1:]]
        labelled = {int(row.split('"')[0]): row for row in rows if "counts padding" in row}
        assert set(labelled) == {0, 1, 2, 3}
        assert "real tokens 7.1%, derived" in labelled[0]
    # bench/RESULTS.md's tables (bench/study_report.py) say it too
    report = subprocess.run(
        [sys.executable, "bench/study_report.py", str(H100_STUDY)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert "| 25.8% (counts padding; real tokens 7.1%, derived) |" in report.stdout
    assert "MFU marked 'counts padding' was recorded before" in report.stdout
