"""Space files: valid ones load; every kind of mistake names the file, line and field."""

from __future__ import annotations

import optuna
import pytest

from sweeper.errors import SpaceError
from sweeper.space import TrialConfig, load_space, parse_space, suggest
from tests.helpers import REPO, TINY_SPACE


@pytest.mark.parametrize("name", ["cpu-demo.yaml", "h100.yaml"])
def test_shipped_spaces_load(name: str) -> None:
    space = load_space(REPO / "spaces" / name)
    assert space.budget.n_trials > 0
    grid = list(space.search.grid())
    assert len(grid) == len(set(grid)) > 0  # every config once


def test_h100_space_is_seed_000_job() -> None:
    space = load_space(REPO / "spaces" / "h100.yaml")
    assert (space.workload.samples, space.workload.epochs) == (600_000, 3)
    assert space.hardware.usd_per_hour == 2.5
    assert space.workload.precision == "bf16"
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
            ":23: search.num_wokers: unknown key",
        ),
        (
            "  usd_per_hour: 0.10",
            "  usd_per_hour: cheap",
            ":5: hardware.usd_per_hour: Input should be a valid number",
        ),
        ("[2, 4]", "[]", ":20: search.per_device_batch_size: List should have at least 1 item"),
        ("[sdpa, eager]", "[sdpa, flash]", ":26: search.attn_implementation[1]: Input should be"),
        (
            "    window: 2",
            "    window: 2\n    window: 3",
            ":32: trial.warmup.window: key appears twice",
        ),
        (
            "    size: tiny",
            "    size: huge",
            ":10: workload.model.size: unknown size for llama; use one of tiny",
        ),
        ("[2, 4]", "[2, 2]", ":20: search.per_device_batch_size: choices repeat 2"),
        (
            "    min_steps: 3",
            '    min_steps: "3"',
            ":33: trial.measure.min_steps: Input should be a valid integer",
        ),
        ("budget:\n  n_trials: 3\n", "", ":2: budget: required key is missing"),
    ],
)
def test_errors_name_file_line_and_field(replace: str, by: str, expected: str) -> None:
    with pytest.raises(SpaceError) as info:
        parse_space(_broken(replace, by), source="tiny.yaml")
    assert f"tiny.yaml{expected}" in str(info.value)


def test_not_yaml_and_not_a_mapping() -> None:
    with pytest.raises(SpaceError, match=r"x.yaml:2: not valid YAML"):
        parse_space("study: a\n  bad: [\n", source="x.yaml")
    with pytest.raises(SpaceError, match="is a mapping"):
        parse_space("- a\n- b\n", source="x.yaml")


def test_missing_file() -> None:
    with pytest.raises(SpaceError, match="cannot read space file"):
        load_space("/nonexistent/space.yaml")


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
        assert ("prefetch_factor" in trial.params) == (config.num_workers > 0)
        assert config in set(space.search.grid())
        study.tell(trial, 1.0)
    assert {c.num_workers for c in seen} == {0, 1}
    assert all(c.prefetch_factor is None for c in seen if c.num_workers == 0)


def test_readme_example_space_is_valid() -> None:
    readme = (REPO / "README.md").read_text()
    example = readme[readme.index("study: my-finetune") :]
    space = parse_space(example[: example.index("```")], source="README.md")
    assert space.baseline is not None and space.workload.tokenize == "on_the_fly"
