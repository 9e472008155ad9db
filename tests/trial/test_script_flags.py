"""The knobs as a script's flags (``workload.script.knobs: sft_flags``), read by the parser a
TRL script uses: ``HfArgumentParser(SFTConfig)``.

What the flags say is what SFTConfig holds. One knob value has no flag form: padding_free=True
is SFTConfig(padding_free=True, max_length=None), and HfArgumentParser parses SFTConfig's
``max_length: int | None = 1024`` as a plain int, so no word says None and a left-out flag keeps
1024, which TRL refuses with padding-free. sweeper says so instead of sending the default:
command_flags refuses, preflight drops the value with the reason, and a trial that gets it
anyway fails as unsupported before the script runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from sweeper import knobs
from sweeper.job import ScriptSpec
from sweeper.preflight import _PreflightRun
from sweeper.space import Space, load_space
from sweeper.trial.protocol import PreparedData
from tests.helpers import REPO, SessionForkServer, tiny_config, trial_request

pytestmark = [
    pytest.mark.torch,
    # TRL 1.16's SFTConfig defaults gradient_checkpointing=True, a name transformers 5.23
    # deprecates (activation_checkpointing): every SFTConfig warns, whatever the flags say
    pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning"),
]


def _parse(words: list[str]) -> object:
    from transformers import HfArgumentParser
    from trl import SFTConfig

    (config,) = HfArgumentParser(SFTConfig).parse_args_into_dataclasses(
        ["--output_dir", "unused", "--report_to", "none", "--bf16", "False", *words],
        look_for_args_file=False,
    )
    return config


def test_the_sft_flags_parse_into_the_sftconfig_they_say() -> None:
    config = {
        "per_device_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "num_workers": 0,
        "max_seq_length": 128,
        "packing": True,
        "packing_strategy": "bfd",
        "precision": "fp32",
        "gradient_checkpointing": True,
    }
    parsed = _parse(knobs.command_flags(config, "sft_flags"))
    assert parsed.per_device_train_batch_size == 4  # type: ignore[attr-defined]
    assert parsed.gradient_accumulation_steps == 2  # type: ignore[attr-defined]
    assert parsed.max_length == 128 and parsed.packing is True  # type: ignore[attr-defined]
    assert parsed.packing_strategy == "bfd"  # type: ignore[attr-defined]
    assert parsed.activation_checkpointing is True  # type: ignore[attr-defined]


def test_no_flag_says_max_length_none_so_padding_free_is_refused() -> None:
    # the parser itself: no word is None for max_length, and left out it is 1024
    for word in ("None", "none", ""):
        with pytest.raises(SystemExit):
            _parse(["--max_length", word])
    assert _parse(["--padding_free", "True"]).max_length == 1024  # type: ignore[attr-defined]
    asked = {"padding_free": True, "packing": False, "max_seq_length": 128}
    with pytest.raises(ValueError, match="no command-line flag says max_length=None"):
        knobs.command_flags(asked, "sft_flags")
    assert knobs.command_flags(asked, "env") == []  # the script reads trial_config()
    # TrainingArguments flags do not carry padding_free (the script's collator does)
    assert "--padding_free" not in knobs.command_flags(asked, "flags")
    off = knobs.command_flags({**asked, "padding_free": False}, "sft_flags")
    assert "--padding_free" not in off and _parse(off).max_length == 128  # type: ignore[attr-defined]


def _sft_space(tmp_path: Path, form: str) -> Space:
    space = yaml.safe_load((REPO / "examples/sft_lora/space.yaml").read_text())
    space["search"]["padding_free"] = [False, True]
    space["workload"]["script"]["knobs"] = form
    path = tmp_path / f"{form}.yaml"
    path.write_text(yaml.safe_dump(space))
    return load_space(path)


def test_preflight_drops_padding_free_for_sft_flags_with_the_reason(tmp_path: Path) -> None:
    def drops(form: str) -> dict[str, dict[str, str]]:
        space = _sft_space(tmp_path, form)
        return _PreflightRun(space, None, tmp_path, print, None, True, None).flag_drops()  # type: ignore[arg-type]

    dropped = drops("sft_flags")
    assert list(dropped) == ["padding_free"] and list(dropped["padding_free"]) == ["True"]
    assert "HfArgumentParser parses it as an int" in dropped["padding_free"]["True"]
    assert "Use knobs: env" in dropped["padding_free"]["True"]
    assert drops("env") == {}


def test_a_trial_given_padding_free_in_sft_flags_fails_as_unsupported(
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """Without preflight (trial.preflight: false) the trial says it before running anything."""
    ran = tmp_path / "ran"
    command = [sys.executable, "-c", f"open({str(ran)!r}, 'w')"]
    workload = tiny_space.workload.model_copy(
        update={"engine": "script", "script": ScriptSpec(command=command, knobs="sft_flags")}
    )
    request = trial_request(
        tiny_space.model_copy(update={"workload": workload}),
        tiny_prepared,
        cache_dir,
        tiny_config(padding_free=True),
    )
    run = run_forked(request, timeout_s=120)
    assert run.result.status == "failed" and run.result.failure_kind == "unsupported"
    message = run.result.failure_message or ""
    assert "workload.script.knobs sft_flags: padding_free=True is SFTConfig(" in message
    assert not ran.exists()  # the script never started
