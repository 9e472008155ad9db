"""`sweeper launch` sweeps with the Trainer and SFTTrainer engines end to end, on SQLite and
Postgres: real children train through transformers' Trainer / TRL's SFTTrainer, the store
holds their measurements, and the export builds the arguments that were measured."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

from sweeper.store import Store
from tests.helpers import TINY_SPACE, run_sweeper

pytestmark = pytest.mark.torch


def _space(tmp_path: Path, engine: str) -> Path:
    text = (
        TINY_SPACE.read_text()
        .replace("study: tiny", f"study: tiny-{engine}")
        .replace("  epochs: 1\n", f"  epochs: 1\n  engine: {engine}\n  logging_steps: 2\n")
        .replace("  attn_implementation: [sdpa, eager]\n", "  attn_implementation: [sdpa, eager]\n"
                 "  optim: [adamw_torch, adafactor]\n  tf32: [true]\n")
        .replace("preflight: false", "preflight: true")
    )  # fmt: skip
    path = tmp_path / f"{engine}.yaml"
    path.write_text(text)
    return path


# each engine once and each store once (a sweep of 3 trials each): the stores are tested
# against each other elsewhere
@pytest.mark.parametrize(
    ("engine", "backend"),
    [("trainer", "sqlite"), pytest.param("sft", "postgres", marks=pytest.mark.postgres)],
)
def test_a_sweep_measures_with_the_users_trainer(
    tmp_path: Path, request: pytest.FixtureRequest, cache_dir: Path, engine: str, backend: str
) -> None:
    storage_url: str = request.getfixturevalue(f"{backend}_url")
    space = _space(tmp_path, engine)
    result = run_sweeper(
        "launch", "--space", str(space), "--storage", storage_url, "--n-trials", "3",
        cache_dir=cache_dir, timeout=900,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # tf32 cannot run on a CPU: preflight says so and the trials run tf32=false
    assert "tf32=True: needs a CUDA device" in output and "trials run tf32=False" in output
    store = Store(storage_url)
    try:
        trials = store.list_trials(f"tiny-{engine}", states=["complete"], include_measurement=True)
        assert len(trials) >= 2, output
        for trial in trials:
            assert trial.measurement is not None
            assert trial.measurement["engine"] == engine
            assert trial.config["tf32"] is False
            expected = {"adamw_torch": "AdamW", "adafactor": "Adafactor"}[trial.config["optim"]]
            assert trial.measurement["optimizer"] == expected
            assert trial.samples_per_s and trial.samples_per_s > 0
    finally:
        store.dispose()
    fmt = "sft" if engine == "sft" else "trainer"
    exported = run_sweeper(
        "export", "--study", f"tiny-{engine}", "--storage", storage_url, "--format", fmt
    )
    assert exported.returncode == 0, exported.stderr
    (call,) = [
        node
        for node in ast.walk(ast.parse(exported.stdout))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) in ("TrainingArguments", "SFTConfig")
    ]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
    assert "tf32" not in kwargs and kwargs["logging_steps"] == 2
    if engine == "sft":
        from trl import SFTConfig as Arguments
    else:
        from transformers import TrainingArguments as Arguments
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        built = Arguments(**kwargs)
    assert built.optim in ("adamw_torch", "adafactor")
