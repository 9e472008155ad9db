"""A script's own knob values (engine: script, a knob the space does not search and the trial
does not give the program): the row keeps the config asked, the study's key of it, and
records what the script ran beside it (``TrialRow.own_values``, migration 0010); the answer,
the exports, the REST API, the study page and a study file show the config as it ran."""

from __future__ import annotations

import html
import shlex

import pytest
import yaml
from alembic import command
from alembic.config import Config
from fastapi.testclient import TestClient
from sqlalchemy import inspect

from api.app import create_app
from sweeper.console import console, print_leaderboard, print_recommendation
from sweeper.export import render, trainer_kwargs
from sweeper.knob_values import UNREACHED_WHY, as_ran
from sweeper.recommend import best
from sweeper.store import Store
from sweeper.store.store import MIGRATIONS_DIR
from sweeper.studyfile import StudyFileError, export_study, import_study
from tests.helpers import STUDY_FIELDS, TINY_SPACE, tiny_config

# what a TRL script's SFTConfig runs when its space (knobs: env) lists neither precision nor
# checkpointing: bf16, gradient checkpointing, fused AdamW; the config holds sweeper's defaults
ASKED = tiny_config(per_device_batch_size=4).model_dump()
OWN = {"precision": "bf16", "gradient_checkpointing": True, "optim": "adamw_torch_fused"}


def _space(form: str) -> str:
    return TINY_SPACE.read_text().replace(
        "  samples: 10000\n",
        "  samples: 10000\n  engine: script\n"
        f"  script: {{command: [python, train.py, --output_dir, out], knobs: {form}}}\n",
    )


def _record(store: Store, study: str, space_yaml: str, own: dict | None, number: int = 0) -> None:
    if not store.has_study(study):
        store.upsert_study(study, **(STUDY_FIELDS | {"space_yaml": space_yaml}))
    store.start_trial(study, number, ASKED)
    store.finish_trial(study, number, "complete", samples_per_s=50.0, it_per_s=1.5,
                       hours_per_run=10.0, cost_per_run_usd=25.0, own_values=own)  # fmt: skip


def test_the_config_as_it_ran_is_the_config_asked_with_the_scripts_own_values() -> None:
    ran = as_ran(ASKED, OWN)
    assert {k: ran[k] for k in OWN} == OWN
    assert {k: v for k, v in ran.items() if k not in OWN} == {
        k: v for k, v in ASKED.items() if k not in OWN
    }
    assert list(ran) == list(ASKED)  # the knobs' order kept
    assert ASKED["precision"] == "fp32"  # the asked config is left as it was
    assert as_ran(ASKED, None) == ASKED == as_ran(ASKED, {})


@pytest.fixture
def store(storage_url: str) -> Store:
    store = Store(storage_url)
    store.migrate()
    yield store
    store.dispose()


def _alembic(store: Store, action: str, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with store.engine.begin() as connection:
        config.attributes["connection"] = connection
        getattr(command, action)(config, revision)


def test_an_old_database_upgraded_gets_the_column_and_its_rows_read_as_asked(
    store: Store,
) -> None:
    """A database of migration 0009 (no own_values) with a completed trial: migrate() adds
    the column; the old row reads null, so what ran is what was asked."""
    _alembic(store, "downgrade", "0009")
    assert "own_values" not in {c["name"] for c in inspect(store.engine).get_columns(
        "sweeper_trials")}  # fmt: skip
    store.upsert_study("old", **(STUDY_FIELDS | {"space_yaml": _space("env")}))
    store.start_trial("old", 0, ASKED)
    with store.engine.begin() as connection:  # the old schema's finish (no own_values)
        connection.exec_driver_sql(
            "UPDATE sweeper_trials SET state = 'complete', samples_per_s = 50, it_per_s = 1.5, "
            "hours_per_run = 10, cost_per_run_usd = 25"
        )
    store.migrate()
    assert "own_values" in {c["name"] for c in inspect(store.engine).get_columns(
        "sweeper_trials")}  # fmt: skip
    (row,) = store.list_trials("old")
    assert row.own_values is None
    (metrics,) = store.trial_metrics("old")
    assert metrics.own_values is None and as_ran(metrics.config, metrics.own_values) == ASKED
    answer = best(store, "old")
    assert answer.config == ASKED and answer.own_values == {}
    # and a new trial of the upgraded database records its own values
    _record(store, "old", _space("env"), OWN, number=1)
    assert store.get_trial("old", 1).own_values == OWN  # type: ignore[union-attr]


def test_the_answer_exports_api_and_page_show_what_the_script_ran(store: Store) -> None:
    _record(store, "env", _space("env"), OWN)
    (row,) = store.list_trials("env")  # the light listing (no measurement) carries them
    assert row.config == ASKED and row.own_values == OWN
    answer = best(store, "env")
    assert answer.config == as_ran(ASKED, OWN) and answer.own_values == OWN
    space_yaml = store.get_study("env").space_yaml
    # TrainingArguments as the trial's Trainer ran (bf16, checkpointing, fused AdamW)
    kwargs = trainer_kwargs(answer, space_yaml)
    assert kwargs["bf16"] is True and kwargs["gradient_checkpointing"] is True
    assert kwargs["optim"] == "adamw_torch_fused"
    assert yaml.safe_load(render(answer, "yaml", space_yaml))["config"]["precision"] == "bf16"
    # the user's command: knobs: env gives no flag, and the script's own values are said as
    # its own, not as values sweeper.trial_config() gave it
    text = render(answer, "command", space_yaml)
    own_part = text.split("# your script's own values", 1)[1]
    assert "#   precision: bf16" in own_part and "#   gradient_checkpointing: True" in own_part
    assert "precision" not in text.split("# your script's own values", 1)[0]
    assert shlex.split(text.strip().splitlines()[-1]) == [
        "python", "train.py", "--output_dir", "out"]  # fmt: skip

    # the CLI's leaderboard (`sweeper trials`) says them among the config's
    with console.capture() as captured:
        print_leaderboard(store.url, "env")
    shown = captured.get()  # the config column folds on a narrow console: word by word
    assert "bf16" in shown and "ckpt" in shown, shown

    with TestClient(create_app(store.url)) as client:
        (trial,) = client.get("/api/studies/env/trials").json()
        assert trial["config"] == ASKED and trial["own_values"] == OWN
        assert trial["ran_config"] == as_ran(ASKED, OWN)
        assert client.get("/api/studies/env/trials/0").json()["ran_config"]["precision"] == "bf16"
        rest = client.get("/api/studies/env/best").json()
        assert rest["config"]["precision"] == "bf16" and rest["own_values"] == OWN
        page = html.unescape(client.get("/studies/env").text)
        assert 'bf16</code> <span class="muted own"' in page
        assert "(your script's own)" in page


def test_a_knob_the_script_owns_is_not_exported_as_a_flag(store: Store) -> None:
    """knobs: sft_flags: max_seq_length is a flag (--max_length). A trial whose script ran its
    own length (recorded as its own) exports no flag that would override it."""
    _record(store, "flags", _space("sft_flags"), {"max_seq_length": 128})
    answer = best(store, "flags")
    text = render(answer, "command", store.get_study("flags").space_yaml)
    words = shlex.split(text.strip().splitlines()[-1])
    assert "--max_length" not in words and "--per_device_train_batch_size" in words
    assert "#   max_seq_length: 128" in text.split("# your script's own values", 1)[1]
    # the same trial without own values: the flag is the config's
    _record(store, "flags-asked", _space("sft_flags"), None)
    text = render(best(store, "flags-asked"), "command", _space("sft_flags"))
    words = shlex.split(text.strip().splitlines()[-1])
    assert words[words.index("--max_length") + 1] == str(ASKED["max_seq_length"])


def test_a_study_file_keeps_the_scripts_own_values(store: Store) -> None:
    _record(store, "env", _space("env"), OWN)
    _record(store, "env", _space("env"), None, number=1)
    store.set_study_state("env", "finished")
    document = export_study(store, "env")
    assert document.trials[0]["own_values"] == OWN
    assert "own_values" not in document.trials[1]  # only where set: older sweepers read it
    import_study(store, document, name="copy")
    assert [t.own_values for t in store.list_trials("copy")] == [OWN, None]
    assert best(store, "copy").config["precision"] == "bf16"
    bad = document.model_copy(
        update={"trials": [document.trials[0] | {"own_values": {"precision": "bf17"}}]}
    )
    with pytest.raises(StudyFileError, match=r"trials\[0\]\.own_values\.precision: Input should"):
        import_study(store, bad, name="bad")
    unknown = document.model_copy(
        update={"trials": [document.trials[0] | {"own_values": {"bf16": True}}]}
    )
    with pytest.raises(StudyFileError, match=r"trials\[0\]\.own_values: bf16 is not a knob"):
        import_study(store, unknown, name="bad")
    assert not store.has_study("bad")


def test_the_across_hardware_comparison_shows_what_the_script_ran(store: Store) -> None:
    """``best --across-hardware``'s Pareto points (and its offers, which scale a trial by the
    peak of the precision it ran) take the config as it ran, not the asked fp32."""
    from sweeper.compare import compare

    _record(store, "env", _space("env"), OWN)
    result = compare(store, "env")
    (point,) = result.pareto
    assert point.config == as_ran(ASKED, OWN) and point.config["precision"] == "bf16"


@pytest.mark.parametrize("columns", [80, 200])
def test_the_leaderboard_keeps_the_config_on_a_narrow_terminal(store: Store, columns: int) -> None:
    """At 80 columns rich squeezed the config column to nothing (its other columns do not
    wrap): the table then said which trial was cheapest but not what it ran. The figures that
    matter least give way instead, and the table says which."""
    _record(store, "env", _space("env"), OWN)
    width = console.width
    console.width = columns
    try:
        with console.capture() as captured:
            print_leaderboard(store.url, "env")
    finally:
        console.width = width
    shown = captured.get()
    table = [line for line in shown.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= columns, shown
    words = shown.split()
    assert "bs4×ga2" in words and "bf16" in words and "$/run" in words, shown
    if columns == 80:
        assert "it/s" not in words and "left out at this terminal's width (80 columns):" in (
            " ".join(words)
        ), shown
    else:
        assert "it/s" in words and "left out" not in shown, shown


def test_the_leaderboard_shows_a_failed_script_trials_whole_message(store: Store) -> None:
    """A script trial's failure begins with its command; the list after the sweep, which the
    launch's last words point to, cut it at 200 characters: before the error's own words."""
    command = "python train.py " + " ".join(f"--flag{i} value{i}" for i in range(12))
    message = f"{command} exited 1: ModuleNotFoundError: No module named 'x' (raised at t.py:3)"
    assert len(message) > 200
    store.upsert_study("crash", **(STUDY_FIELDS | {"space_yaml": _space("flags")}))
    store.start_trial("crash", 0, ASKED)
    store.finish_trial("crash", 0, "failed", failure_kind="error", failure_message=message)
    width = console.width
    console.width = 200
    try:
        with console.capture() as captured:
            print_leaderboard(store.url, "crash")
    finally:
        console.width = width
    shown = " ".join(captured.get().split())
    assert message in shown, shown


def test_a_knob_that_never_reached_the_script_is_not_shown_as_what_ran(store: Store) -> None:
    """knobs: flags, and a script that never called sweeper.trial_config(): max_seq_length
    reached it by no flag, so the config's value is not what ran (Measurement.unreached). The
    answer, the CLI, the page and the export say so instead of showing it as the winner's."""
    _record(store, "cut", _space("flags"), None)
    store.finish_trial("cut", 0, "complete", measurement={"unreached": ["max_seq_length"]})
    answer = best(store, "cut")
    assert answer.unreached == ("max_seq_length",)
    with console.capture() as captured:
        print_recommendation(answer)
    shown = captured.get()
    line = next(x for x in shown.splitlines() if "max_seq_length:" in x)
    assert line.endswith("# unseen: what your script ran here was not read back"), line
    why = " ".join(shown.split()).split("(max_seq_length: ", 1)[1]
    assert why.startswith("sweeper did not see the value the trials ran: it gave your"), why
    text = render(answer, "command", store.get_study("cut").space_yaml)
    head = text.rsplit("\n", 2)[0]
    assert "#   max_seq_length:" not in head  # not offered as a value to set
    assert f"# not here: max_seq_length, so nothing here changes them: {UNREACHED_WHY}" in head
    with TestClient(create_app(store.url)) as client:
        assert client.get("/api/studies/cut/best").json()["unreached"] == ["max_seq_length"]
        page = html.unescape(client.get("/studies/cut").text)
        assert f'<span class="muted unreached" title="{UNREACHED_WHY}' in page
        assert ">(unseen: what your script ran here was not read back)</span>" in page
