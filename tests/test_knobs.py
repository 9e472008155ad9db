"""The knob registry: the config type, the search lists, the baseline, the grid, Optuna's
parameters, preflight's machine checks and the exports all come from ``sweeper.knobs``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import optuna
import pytest
from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo

from sweeper import knobs
from sweeper.errors import SpaceError
from sweeper.export import loop_lines, render, sft_kwargs, trainer_kwargs
from sweeper.knobs import KNOBS, TrialConfig
from sweeper.preflight import PreflightReport
from sweeper.recommendation import Recommendation
from sweeper.seqlen import AUTO
from sweeper.space import Baseline, parse_space, suggest
from sweeper.space_search import SEARCH_DEFAULTS, SearchSpace
from tests.helpers import TINY_SPACE, tiny_config

TINY = TINY_SPACE.read_text()


def test_every_type_has_one_field_per_knob() -> None:
    names = [k.name for k in KNOBS]
    assert list(TrialConfig.model_fields) == names
    assert set(SearchSpace.model_fields) == {*names, "effective_batch", "sampler"}
    assert set(Baseline.model_fields) == {*names, "label"}
    for knob in KNOBS:
        assert knob.label and knob.help, knob.name
        assert knob.required or knob.default is not None, knob.name
        if knob.needs:  # a value that needs something has somewhere to fall back
            assert knob.fallback is not None and knob.fallback not in knob.needs


def _field_from_knob(model: str, knob: knobs.Knob) -> tuple[Any, Any]:
    """What each knob's field is in each written-out type: the rules the types follow."""
    choices = Annotated[list[knob.value_type], Field(min_length=1)]  # type: ignore[name-defined]
    if model == "TrialConfig":
        if knob.required:
            return (knob.value_type, ...)
        if knob.active is not None:
            return (knob.value_type | None, None)
        return (knob.value_type, knob.default)
    if model == "SearchSpace":
        if knob.name == "gradient_accumulation_steps":  # None: derived from effective_batch
            return (choices | None, None)
        if knob.name == "max_seq_length":  # auto: read off the data (sweeper.seqlen)
            description = SearchSpace.model_fields["max_seq_length"].description
            return (choices | Literal["auto"], Field(default=AUTO, description=description))
        if knob.name in SEARCH_DEFAULTS:  # a required knob a minimal space leaves out
            listed = SEARCH_DEFAULTS[knob.name]
            return (choices, Field(default_factory=lambda: list(listed), description=knob.help))
        if knob.required:
            return (choices, ...)
        default = knob.default
        return (choices, Field(default_factory=lambda: [default], description=knob.help))
    if knob.required:
        return (knob.value_type, ...)
    return (knob.value_type | None, Field(default=None, description=knob.help))


def _field_shape(field: FieldInfo) -> tuple[Any, ...]:
    default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
    # reprs: a nested Annotated holds FieldInfo objects, which compare by identity
    return (
        repr(field.annotation),
        repr(field.metadata),
        field.is_required(),
        default,
        field.description,
    )


@pytest.mark.parametrize("written", [TrialConfig, SearchSpace, Baseline], ids=lambda t: t.__name__)
def test_the_written_out_types_match_the_knob_table(written: type[BaseModel]) -> None:
    """TrialConfig, SearchSpace and Baseline are written out so that a type checker can read
    them; each field must be what the knob's entry in ``KNOBS`` makes of it (a new knob needs
    its field in each: this test names the one missing)."""
    derived = create_model(  # type: ignore[call-overload]
        written.__name__,
        __base__=written.__bases__[0],
        **{knob.name: _field_from_knob(written.__name__, knob) for knob in KNOBS},
    )
    assert list(written.model_fields) == list(derived.model_fields), "fields or their order"
    for name, field in derived.model_fields.items():
        assert _field_shape(written.model_fields[name]) == _field_shape(field), name
    schema, expected = written.model_json_schema(), derived.model_json_schema()
    schema.pop("description", None), expected.pop("description", None)
    assert schema == expected


def _with_search(extra: str, base: str = TINY) -> str:
    return base.replace("search:\n", f"search:\n{extra}", 1)


def test_new_knobs_are_searchable_and_multiply_the_grid() -> None:
    plain = parse_space(TINY)
    wider = parse_space(
        _with_search(
            "  precision: [fp32, bf16]\n  gradient_checkpointing: [false, true]\n"
            "  optim: [adamw_torch, adafactor]\n"
        )
    )
    assert len(list(wider.search.grid())) == 8 * len(list(plain.search.grid()))
    assert {"precision", "gradient_checkpointing", "optim"} <= set(wider.search.searched())
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(40):
        trial = study.ask()
        config = suggest(trial, wider.search)
        seen.add((config.precision, config.optim))
        study.tell(trial, 1.0)
    assert len(seen) == 4  # Optuna proposes every combination of the new knobs


def test_conditions_live_in_the_registry() -> None:
    space = parse_space(
        _with_search("  persistent_workers: [false, true]\n").replace(
            "num_workers: [0]", "num_workers: [0, 2]"
        )
    )
    grid = list(space.search.grid())
    without = [c for c in grid if c.num_workers == 0]
    with_workers = [c for c in grid if c.num_workers == 2]
    assert all(c.prefetch_factor is None and c.persistent_workers is None for c in without)
    assert {c.persistent_workers for c in with_workers} == {False, True}
    assert len(with_workers) == 2 * len(without)
    assert space.search.runnable(without[0].model_copy(update={"persistent_workers": True}))
    assert (
        knobs.trainer_arguments(without[0].model_dump())
        .keys()
        .isdisjoint({"dataloader_prefetch_factor", "dataloader_persistent_workers"})
    )


def test_workload_precision_is_the_older_spelling_of_the_knob() -> None:
    space = parse_space(TINY.replace("  epochs: 1\n", "  epochs: 1\n  precision: bf16\n"))
    assert space.search.precision == ["bf16"] and space.known_configs()[0].precision == "bf16"
    with pytest.raises(SpaceError, match=r"workload.precision is 'bf16' but search.precision"):
        parse_space(
            _with_search(
                "  precision: [fp32]\n",
                TINY.replace("  epochs: 1\n", "  epochs: 1\n  precision: bf16\n"),
            )
        )


def test_a_bad_knob_value_names_the_file_line_and_the_choices() -> None:
    text = _with_search("  optim: [adamw_torch, adamw_9bit]\n")
    line = text.splitlines().index("  optim: [adamw_torch, adamw_9bit]") + 1
    with pytest.raises(SpaceError) as error:
        parse_space(text, source="spaces/x.yaml")
    message = str(error.value)
    assert f"spaces/x.yaml:{line}: search.optim[1]:" in message
    assert "adamw_torch_fused" in message and "'adamw_9bit'" in message


def test_a_baseline_leaving_out_a_searched_knob_must_say_its_value() -> None:
    # the default (adamw_torch) is not listed and there are two choices: which one runs today?
    text = _with_search("  optim: [adafactor, adamw_8bit]\n")
    with pytest.raises(SpaceError, match="baseline: optim is left out"):
        parse_space(text)
    one = parse_space(_with_search("  optim: [adafactor]\n"))
    assert one.known_configs()[0].optim == "adafactor"  # the only choice


def test_preflight_falls_back_where_the_machine_can_run_no_listed_value() -> None:
    space = parse_space(
        _with_search("  tf32: [true]\n  optim: [adamw_torch, adamw_torch_fused, adamw_8bit]\n")
    )
    no_cuda = {"cuda": "the trial device is the CPU", "bitsandbytes": "no CUDA"}
    dropped = knobs.machine_drops({"tf32": space.search.tf32, "optim": space.search.optim}, no_cuda)
    assert dropped == {  # the fused AdamW has a CPU kernel: kept
        "tf32": {"True": "needs a CUDA device (the trial device is the CPU)"},
        "optim": {"adamw_8bit": "needs bitsandbytes with a CUDA device (no CUDA)"},
    }
    report = PreflightReport(dropped=dropped, fallbacks={"tf32": False})
    search = report.search(space)
    assert search.tf32 == [False] and {c.tf32 for c in search.grid()} == {False}
    baseline = report.adapt(space.known_configs()[0])
    assert baseline.tf32 is False and report.allows(baseline) is None
    eight = baseline.model_copy(update={"optim": "adamw_8bit"})
    assert "optim=adamw_8bit failed preflight" in (report.allows(eight) or "")
    fused = baseline.model_copy(update={"optim": "adamw_torch_fused"})
    assert report.allows(fused) is None


def _rec(config: TrialConfig) -> Recommendation:
    return Recommendation(
        study="s", trial_number=0, completed_trials=1, config=config.model_dump(),
        it_per_s=1.0, samples_per_s=1.0, tokens_per_s=1.0, cost_per_run_usd=1.0,
        hours_per_run=1.0, peak_memory_bytes=None, usd_per_hour=1.0, hardware_name="CPU",
    )  # fmt: skip


def _changes(knob: knobs.Knob) -> list[object]:
    """Two configs' values for ``knob`` that should read differently in some export."""
    choices = knob.choices()
    if choices is not None:
        return [v for v in choices if v != knob.default][:1] + [knob.default]
    return [knob.default or 64, (knob.default or 64) + 1]


@pytest.mark.parametrize("knob", [k for k in KNOBS], ids=lambda k: k.name)
def test_every_knob_reaches_the_exports(knob: knobs.Knob) -> None:
    """Changing any knob changes what a user pastes (TrainingArguments, SFTConfig, the
    DataLoader and its loop): no knob is measured and then lost on the way to the user."""
    gpu = TINY.replace("device: cpu", "device: cuda")
    outputs = []
    for value in _changes(knob):
        values = {
            "num_workers": 2,
            "packing": knob.name == "packing_strategy",
            "devices": 2 if knob.name == "data_parallel" else 1,  # it applies on several
        } | {knob.name: value}
        config = tiny_config(**values)
        rec = _rec(config)
        outputs.append(
            (
                trainer_kwargs(rec, gpu),
                sft_kwargs(rec, gpu),
                render(rec, "dataloader", gpu),
                render(rec, "trainer", gpu),
                loop_lines(config.model_dump(), 1e-4, "cuda"),
            )
        )
    assert outputs[0] != outputs[1], f"{knob.name} does not reach any export"


def test_describe_names_every_knob_that_differs_from_its_default() -> None:
    config = tiny_config(
        precision="bf16", tf32=True, optim="adafactor", gradient_checkpointing=True,
        pin_memory=True, packing=True, num_workers=2, persistent_workers=True,
    )  # fmt: skip
    line = knobs.describe(config.model_dump())
    for word in ("bf16", "tf32", "adafactor", "ckpt", "pinned", "packed", "persist", "w2/pf2"):
        assert word in line


def test_the_issue_36_levers_get_a_verdict_at_the_winner() -> None:
    """padding_free, liger_kernel, fp8 and reduce-overhead flow through the knob verdict
    (sweeper/verdict.py reads KNOBS): each lever's pair at the winner gives its ratio, and
    a lever that loses is said to stay off."""
    from types import SimpleNamespace

    from sweeper.verdict import knob_effects

    base = tiny_config(max_seq_length=512).model_dump()

    def trial(number: int, cost: float, **change: Any) -> Any:
        config = knobs.normalize(base | change)
        return SimpleNamespace(
            number=number, state="complete", config=config, cost_per_run_usd=cost,
            cost_ci95_rel=0.01, contended=False,
        )  # fmt: skip

    winner = trial(0, 10.0, padding_free=True)
    trials = [
        winner,
        trial(1, 14.0),  # padded: 1.4x the $
        trial(2, 10.02, padding_free=True, liger_kernel=True),
        trial(3, 12.5, padding_free=True, precision="fp8"),
        trial(4, 11.0, padding_free=True, compile_mode="reduce-overhead"),
    ]
    effects = {e.knob: e for e in knob_effects(trials, winner).effects}
    assert effects["padding_free"].ratio == pytest.approx(1.4)
    assert effects["padding_free"].verdict == "leave it on"  # a switch: on/off, not "at on"
    assert effects["liger_kernel"].verdict.startswith("no difference that matters")
    assert effects["precision"].ratio == pytest.approx(1.25)
    assert effects["precision"].verdict == "leave it at fp32"
    assert effects["compile_mode"].ratio == pytest.approx(1.1)
    assert all(e.basis == "at the winner" for e in effects.values())


@pytest.mark.torch
def test_command_flags_give_a_dict_argument_as_json_trainingarguments_parses() -> None:
    """fsdp_config reaches a script's HfArgumentParser as JSON (str(dict) is not JSON, and
    TrainingArguments' json.loads refused it)."""
    import warnings

    from transformers import HfArgumentParser, TrainingArguments

    config = knobs.normalize(tiny_config().model_dump() | {"devices": 2, "data_parallel": "fsdp2"})
    flags = knobs.command_flags(config, "flags")
    assert flags[flags.index("--fsdp_config") + 1] == '{"fsdp_version": 2}'
    with warnings.catch_warnings():  # transformers 5.23's renames and fsdp-as-string notices
        warnings.simplefilter("ignore")
        (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(
            [*flags, "--output_dir", "unused", "--use_cpu", "True"]
        )
    assert args.fsdp_config["version"] == 2
