"""Space files: valid ones load; every kind of mistake names the file, line and field."""

from __future__ import annotations

import re
from pathlib import Path

import optuna
import pytest

from sweeper.errors import SpaceError
from sweeper.space import TrialConfig, load_space, optuna_params, parse_space, suggest
from tests.helpers import REPO, TINY_SPACE, tiny_config, tiny_space_without_baseline


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "spaces").glob("*.yaml")))
def test_shipped_spaces_load(name: str) -> None:
    space = load_space(REPO / "spaces" / name)
    assert space.budget.n_trials > 0
    grid = list(space.search.grid())
    assert len(grid) == len(set(grid)) > 0  # every config once


def test_h100_space_is_seed_000_job() -> None:
    space = load_space(REPO / "spaces" / "h100.yaml")
    assert (space.workload.samples, space.workload.epochs) == (600_000, 3)
    assert space.hardware.usd_per_hour == 2.5
    # bf16 as seed 000 trained; fp8 is the lever issue 36 measures beside it
    assert space.search.precision == ["bf16", "fp8"] and space.search.tf32 == [True]
    assert space.workload.engine == "trainer"  # seeds 000/001 train with Trainer
    assert set(space.search.optim) == {"adamw_torch", "adamw_torch_fused"}
    assert (space.workload.model.arch, space.workload.model.size) == ("llama", "1b")


def _broken(replace: str, by: str) -> str:
    text = TINY_SPACE.read_text()
    assert replace in text
    return text.replace(replace, by, 1)


@pytest.mark.parametrize(
    ("replace", "by", "expected"),
    [
        (
            "  num_workers: [0]",
            "  num_workers: [0]\n  num_wokers: [2]",
            ":24: search.num_wokers: unknown key",
        ),
        (
            "  usd_per_hour: 0.10",
            "  usd_per_hour: cheap",
            ":5: hardware.usd_per_hour: Input should be a valid number",
        ),
        ("[2, 4]", "[]", ":21: search.per_device_batch_size: List should have at least 1 item"),
        ("[sdpa, eager]", "[sdpa, flash]", ":27: search.attn_implementation[1]: Input should be"),
        (
            "    window: 2",
            "    window: 2\n    window: 3",
            ":33: trial.warmup.window: key appears twice",
        ),
        (
            "    size: tiny",
            "    size: huge",
            ":10: workload.model.size: unknown size for llama; use one of tiny",
        ),
        ("[2, 4]", "[2, 2]", ":21: search.per_device_batch_size: choices repeat 2"),
        (
            "    min_steps: 3",
            '    min_steps: "3"',
            ":34: trial.measure.min_steps: Input should be a valid integer",
        ),
        (  # the budget's keys, its heading gone, fall under trial: said where they go
            "budget:\n  n_trials: 3\n",
            "",
            ":41: trial.remeasure: not a key of trial: 'remeasure' belongs under budget; "
            "move it there",
        ),
        (  # the baseline's own line, not the study's (issue 18)
            'baseline:              # the "current" config: trial #0 of every sweep of this space\n'
            "  per_device_batch_size: 2",
            "baseline:\n  per_device_batch_size: 3",
            ":45: baseline.per_device_batch_size: per_device_batch_size = 3 is not among",
        ),
    ],
)
def test_errors_name_file_line_and_field(replace: str, by: str, expected: str) -> None:
    with pytest.raises(SpaceError) as info:
        parse_space(_broken(replace, by), source="tiny.yaml")
    assert f"tiny.yaml{expected}" in str(info.value)


@pytest.mark.parametrize(
    ("lengths", "said"),
    [
        ("[auto, 100000]", "[0]: auto stands alone, not in a list: write `max_seq_length: auto`"),
        (
            "[512, x]",
            "[1]: Input should be a valid integer (got 'x'): write `max_seq_length: auto`",
        ),
        ("autoo", ": Input should be a valid list (got 'autoo'): write `max_seq_length: auto`"),
    ],
)
def test_a_length_list_or_auto_is_one_line_with_both_forms(lengths: str, said: str) -> None:
    """A walk's `max_seq_length: [auto, 100000]` gave pydantic's two branches ("a valid
    integer (got 'auto')", "Input should be 'auto' (got [...])") and no word of what to
    write: one line a mistake, saying both forms."""
    with pytest.raises(SpaceError) as info:
        parse_space(_broken("  max_seq_length: [64]", f"  max_seq_length: {lengths}"), "t.yaml")
    told = str(info.value).splitlines()
    assert told == [f"t.yaml:25: search.max_seq_length{said} (the lengths picked from the "
                    "data), or a list of whole numbers, e.g. [512, 1024]"], told  # fmt: skip


def test_several_errors_are_said_in_the_file_s_line_order(tmp_path: Path) -> None:
    """pydantic reports a space's errors in its fields' order (hardware before search); a
    walk's file with search: above hardware: read line 7 before line 3. The CLI says them by
    line, exit 2, no traceback."""
    import subprocess
    import sys

    space = tmp_path / "bad.yaml"
    space.write_text(
        "study: x\n"
        "search:\n"
        "  per_device_batch_size: [0]\n"
        "  num_workers: [banana]\n"
        "hardware:\n"
        "  name: H100\n"
        "  usd_per_hour: -1\n"
        "workload:\n"
        "  model: {arch: llama, size: tiny}\n"
        "  dataset: {generate: {samples: 1000}}\n"
        "  samples: 100\n"
        "  epochs: -3\n"
    )
    with pytest.raises(SpaceError) as info:
        load_space(space)
    said = str(info.value).splitlines()
    numbers = [int(line.split(":")[1]) for line in said]
    assert numbers == [3, 4, 7, 12], said
    assert said[0].endswith(
        "search.per_device_batch_size[0]: Input should be greater than 0 (got 0)"
    )
    assert said[2].endswith("hardware.usd_per_hour: Input should be greater than 0 (got -1)")
    ran = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "doctor", "--space", str(space)],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
    printed = [int(m) for m in re.findall(rf"{re.escape(str(space))}:(\d+):", ran.stderr)]
    assert printed == [3, 4, 7, 12], ran.stderr


def test_not_yaml_and_not_a_mapping() -> None:
    with pytest.raises(SpaceError, match=r"x.yaml:2: not valid YAML"):
        parse_space("study: a\n  bad: [\n", source="x.yaml")
    with pytest.raises(SpaceError, match="is a mapping"):
        parse_space("- a\n- b\n", source="x.yaml")


def test_unclosed_yaml_says_where_the_broken_structure_began() -> None:
    """YAML notices an unclosed [ on a later line; the error names the line it opened on."""
    text = _broken("  per_device_batch_size: [", "  per_device_batch_size: [2, 4\n  x: [")
    with pytest.raises(SpaceError) as info:
        parse_space(text, source="tiny.yaml")
    opened = next(i for i, line in enumerate(text.splitlines(), 1) if "[2, 4" in line)
    said = str(info.value)
    assert said.startswith(f"tiny.yaml:{opened + 1}: not valid YAML: "), said
    assert f"(while parsing a flow sequence, which starts on line {opened})" in said


def _script_space(command: str) -> str:
    text = TINY_SPACE.read_text()
    assert "\nworkload:\n" in text
    return text.replace(
        "\nworkload:\n", f"\nworkload:\n  engine: script\n  script:\n    command: {command}\n", 1
    )


def test_a_script_command_written_as_a_string_or_with_bare_numbers_says_how_to_write_it(
    tmp_path: Path,
) -> None:
    train = tmp_path / "train.py"
    train.write_text("import sweeper\nsweeper.callback()\n")
    # one string: the list it should be, split as a shell would, quoted where YAML needs it
    text = _script_space(f"python {train} --output_dir 'my out' --max_steps 100")
    with pytest.raises(SpaceError) as info:
        parse_space(text, source="tiny.yaml")
    said = str(info.value)
    line = next(i for i, line in enumerate(text.splitlines(), 1) if "command:" in line)
    assert f"tiny.yaml:{line}: workload.script.command: give the command as a list of words" in said
    assert f'command: [python, {train}, --output_dir, "my out", --max_steps, "100"]' in said
    # a list whose number or boolean YAML reads as no string: which word, and the quotes
    for word, what in (("100", "a number"), ("True", "a boolean")):
        with pytest.raises(SpaceError) as info:
            parse_space(_script_space(f"[python, {train}, --flag, {word}]"), source="tiny.yaml")
        said = str(info.value)
        assert f"word [3] is {word}, which YAML reads as {what}, not a string; " in said, said
        assert f'quote it: "{word}"' in said
    # quoted, it loads
    space = parse_space(_script_space(f'[python, {train}, --flag, "100"]'), source="tiny.yaml")
    assert space.workload.script is not None
    assert space.workload.script.command == ["python", str(train), "--flag", "100"]


def test_missing_file() -> None:
    with pytest.raises(SpaceError, match="cannot read space file"):
        load_space("/nonexistent/space.yaml")


def test_a_file_that_is_not_utf8_names_line_column_and_byte(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"study: a\nhardware:\n  name: Caf\xe9\n")
    with pytest.raises(SpaceError, match=r"latin1.yaml:3:12: not UTF-8 text \(byte 0xe9\)"):
        load_space(path)


def test_space_is_frozen() -> None:
    space = load_space(TINY_SPACE)
    with pytest.raises(Exception, match="frozen"):
        space.budget.n_trials = 5  # type: ignore[misc]


def test_suggest_only_asks_prefetch_with_workers() -> None:
    space = load_space(REPO / "spaces" / "cpu-demo.yaml")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    seen: list[TrialConfig] = []
    for _ in range(30):
        trial = study.ask()
        config = suggest(trial, space.search)
        seen.append(config)
        # prefetch_factor is asked for only with workers; a knob with one choice never is
        assert "prefetch_factor" not in trial.params or config.num_workers > 0
        assert set(trial.params) == set(space.search.searched()) - (
            {"prefetch_factor"} if config.num_workers == 0 else set()
        )
        assert config in set(space.search.grid())
        study.tell(trial, 1.0)
    assert {c.num_workers for c in seen} == {0, 1}
    assert all(c.prefetch_factor is None for c in seen if c.num_workers == 0)
    assert all(
        c.prefetch_factor == 2 and c.persistent_workers is False for c in seen if c.num_workers
    )


def test_readme_example_space_is_valid() -> None:
    readme = (REPO / "README.md").read_text()
    example = readme[readme.index("study: my-finetune") :]
    space = parse_space(example[: example.index("```")], source="README.md")
    assert space.baseline is not None and space.workload.tokenize == "on_the_fly"


GA = "  gradient_accumulation_steps: [1, 2]\n"


def _search(extra: str, accumulation: str = GA) -> str:
    """The tiny space with ``extra`` search keys and ``accumulation`` as its GA line."""
    text = tiny_space_without_baseline().replace(GA, accumulation)
    return text.replace("search:\n", "search:\n" + extra)


def test_fixed_effective_batch_derives_accumulation() -> None:
    space = parse_space(_search("  effective_batch: {fixed: 8}\n", accumulation=""))
    grid = list(space.search.grid())
    assert {(c.per_device_batch_size, c.gradient_accumulation_steps) for c in grid} == {
        (2, 4),
        (4, 2),
    }
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(10):
        trial = study.ask()
        config = suggest(trial, space.search)
        assert config.effective_batch == 8 and "gradient_accumulation_steps" not in trial.params
        assert optuna_params(config, space.search) == trial.params
        study.tell(trial, 1.0)


@pytest.mark.parametrize(
    ("extra", "accumulation", "expected"),
    [
        (
            "  effective_batch: {fixed: 8}\n",
            GA,
            "gradient_accumulation_steps is derived from effective_batch.fixed",
        ),
        (
            "  effective_batch: {fixed: 6}\n",
            "",
            "fixed 6 is not a multiple of per_device_batch_size [4]",
        ),
        ("  effective_batch: {min: 64}\n", GA, "no batch × accumulation of the space"),
        ("  effective_batch: {min: 8, max: 4}\n", GA, "min 8 exceeds max 4"),
        ("  effective_batch: {fixed: 8, max: 8}\n", "", "set either 'fixed' or 'min'/'max'"),
    ],
)
def test_effective_batch_mistakes(extra: str, accumulation: str, expected: str) -> None:
    with pytest.raises(SpaceError, match=re.escape(expected)):
        parse_space(_search(extra, accumulation=accumulation), source="s.yaml")


def test_bounded_effective_batch_keeps_configs_inside() -> None:
    space = parse_space(_search("  effective_batch: {min: 4, max: 4}\n"))
    assert {c.effective_batch for c in space.search.grid()} == {4}
    outside = tiny_config(per_device_batch_size=4, gradient_accumulation_steps=2)
    assert space.search.admits(outside) == "effective batch 8 is not within [4, 4]"


def test_also_try_must_be_in_the_space() -> None:
    text = TINY_SPACE.read_text() + (
        "also_try:\n  - per_device_batch_size: 4\n    gradient_accumulation_steps: 1\n"
        "    num_workers: 0\n    max_seq_length: 128\n"
    )
    with pytest.raises(
        SpaceError, match=r"also_try\[0\]\.max_seq_length: max_seq_length = 128 is not among"
    ):
        parse_space(text, source="s.yaml")
    space = parse_space(text.replace("max_seq_length: 128", "max_seq_length: 64"))
    assert [c.per_device_batch_size for c in space.known_configs()] == [2, 4]


def test_workload_hash_ignores_hardware_and_price() -> None:
    text = TINY_SPACE.read_text()
    a = parse_space(text)
    b = parse_space(
        text.replace("usd_per_hour: 0.10", "usd_per_hour: 3.0").replace("name: CPU", "name: H100")
    )
    c = parse_space(text.replace("epochs: 1", "epochs: 2"))
    assert a.workload_hash() == b.workload_hash() != c.workload_hash()


def test_the_minimal_space_needs_no_guess(tmp_path: Path) -> None:
    """What `sweeper init` writes: model, data, engine, machine, price, job size. The rest is
    defaulted: the lengths come from the data, a few batch sizes, 12 trials."""
    import json

    from sweeper import seqlen
    from sweeper.starter import minimal_space

    chats = tmp_path / "chats.jsonl"
    record = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    }
    chats.write_text(json.dumps(record) + "\n\n" + json.dumps(record) + "\n")
    text = minimal_space(
        study="mine", model="org/model", data=chats, engine="sft", hardware="H100 SXM 80GB",
        usd_per_hour=2.5,
    )  # fmt: skip
    space = parse_space(text)
    assert space.workload.samples == 2 and space.workload.dataset.messages_field == "messages"
    # which tokens are labels is written out for chat data, with the other choice beside it
    assert space.workload.dataset.loss == "all" and "completion: the replies only" in text
    assert space.search.max_seq_length == "auto" and space.budget.n_trials == 12
    assert space.search.values("per_device_batch_size") == [4, 8, 16]
    assert list(space.search.grid()) == []  # nothing runs before the data says the lengths
    stats = {"token_percentiles": [10] * 100 + [700], "tokens_max": 700}
    resolved = seqlen.resolve(space, stats)
    assert resolved.search.values("max_seq_length") == [704]
    assert {c.max_seq_length for c in resolved.search.grid()} == {704}
    packed = parse_space(text + "search:\n  packing: [false, true]\n")
    assert seqlen.resolve(packed, stats).search.values("max_seq_length") == [192, 384, 704]

    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"body": "some text"}\n')
    text = minimal_space(
        study="p", model="m", data=plain, engine="loop", hardware="CPU", usd_per_hour=1,
        device="cpu",
    )  # fmt: skip
    assert parse_space(text).workload.dataset.text_field == "body"


@pytest.mark.torch  # the training stack's environment: datasets brings pyarrow (step 2's has none)
def test_init_reads_json_parquet_and_dotted_jsonl_names_as_the_sweep_reads_them(
    tmp_path: Path,
) -> None:
    """Chat records in a .json list, a .parquet file or train.v2.jsonl: init wrote
    ``text_field: text`` (or asked for --samples) for each, and the sweep then found no 'text'
    column; each is read as chat data, counted, and a bad record named by its place."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from sweeper.starter import minimal_space

    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    dotted = tmp_path / "train.v2.jsonl"
    dotted.write_text(f"{json.dumps(chat)}\n" * 3)
    listed = tmp_path / "chats.json"
    listed.write_text(json.dumps([chat] * 4))
    parquet = tmp_path / "chats.parquet"
    pq.write_table(pa.Table.from_pylist([chat] * 5), parquet)
    for data, rows in ((dotted, 3), (listed, 4), (parquet, 5)):
        text = minimal_space(
            study="m", model="org/m", data=data, engine="sft", hardware="H", usd_per_hour=1
        )
        dataset = parse_space(text).workload
        assert dataset.dataset.messages_field == "messages", data
        assert dataset.samples == rows, data
    listed.write_text(json.dumps([chat, {"messages": "oops"}]))
    with pytest.raises(SpaceError, match=r"chats.json: record 2: 'messages' is str"):
        minimal_space(study="m", model="org/m", data=listed, engine="sft", hardware="H",
                      usd_per_hour=1)  # fmt: skip
    pq.write_table(pa.Table.from_pylist([chat, {"messages": []}]), parquet)
    with pytest.raises(SpaceError, match=r"chats.parquet: row 2: 'messages' is list \[\]"):
        minimal_space(study="m", model="org/m", data=parquet, engine="sft", hardware="H",
                      usd_per_hour=1)  # fmt: skip


def test_init_of_parquet_without_pyarrow_says_what_to_install(tmp_path: Path) -> None:
    """The controller's environment (no datasets, so no pyarrow): a .parquet file is a clear
    error naming what to install, not an ImportError's traceback."""
    import importlib.util

    from sweeper.starter import minimal_space

    if importlib.util.find_spec("pyarrow") is not None:
        pytest.skip("pyarrow is installed here: the test above reads the file")
    parquet = tmp_path / "chats.parquet"
    parquet.write_bytes(b"PAR1")
    with pytest.raises(SpaceError, match=r"chats.parquet: reading Parquet needs pyarrow"):
        minimal_space(study="m", model="org/m", data=parquet, engine="sft", hardware="H",
                      usd_per_hour=1)  # fmt: skip


def test_init_names_a_bad_record_by_its_line_before_writing(tmp_path: Path) -> None:
    """Every record is read as the prepare step will read it, so `sweeper init` names a bad one
    by its 1-based line (blank lines counted), not the sweep: a line that is not JSON, a chat
    column of the wrong type, a message without text, a text record without its text."""
    import json

    from sweeper.starter import minimal_space

    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}
    good = json.dumps(chat)
    bad_chats = {
        # json's own "line 2 column 1" (the line's newline) is not said beside line 4
        '{"messages": [{"role": "user"': r":4: not a JSON object \(Expecting ',' delimiter at "
        r"the end of the line \(a bracket or brace left open\?\)\); each \.jsonl line holds "
        r"one JSON object: fix or drop that line",
        '["a", "list"]': r":4: not a JSON object \(a list, not an object\); each \.jsonl line "
        r"holds one JSON object: fix or drop that line$",
        '{"messages": "oops"}': r":4: 'messages' is str \"oops\", not a non-empty list",
        '{"messages": []}': r":4: 'messages' is list \[\], not a non-empty list",
        '{"text": "no chat"}': r":4: 'messages' is missing, not a non-empty list",
        '{"messages": [{"role": "user", "content": null}]}': r":4: message 1 of 'messages' is not",
    }
    for line, said in bad_chats.items():
        data = tmp_path / "chats.jsonl"
        data.write_text(f"{good}\n\n{good}\n{line}\n{good}\n")
        with pytest.raises(SpaceError, match=re.escape(str(data)) + said):
            minimal_space(
                study="m", model="org/m", data=data, engine="sft", hardware="H", usd_per_hour=1
            )
    text = tmp_path / "text.jsonl"
    text.write_text('{"text": "a"}\n{"text": 7}\n')
    with pytest.raises(SpaceError, match=r"text.jsonl:2: 'text' is int 7, not text"):
        minimal_space(study="t", model="org/m", data=text, engine="loop", hardware="H",
                      usd_per_hour=1)  # fmt: skip


def test_trls_packings_need_the_sft_engine() -> None:
    text = TINY_SPACE.read_text().replace(
        "  compile_mode: [none]\n",
        "  compile_mode: [none]\n  packing: [true]\n  packing_strategy: [wrapped, bfd]\n",
    )
    with pytest.raises(SpaceError, match=r"packing_strategy \['bfd'\]: these are TRL's packings"):
        parse_space(text)
    sft = parse_space(text.replace("  epochs: 1\n", "  epochs: 1\n  engine: sft\n"))
    assert sft.search.values("packing_strategy") == ["wrapped", "bfd"]
