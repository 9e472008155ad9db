"""A new user's own fine-tune, end to end, as the README's "Your own fine-tune" tells it.

A model directory written with ``save_pretrained`` (a tiny Llama and a ChatML tokenizer without
generation markers) and chat records of varied length (``scripts/tiny_job.py``), the space
``sweeper init`` writes (no sequence length guessed), a real ``sweeper launch`` on SQLite, then
``best`` and every export. The answer must come without ``--allow-truncation``: the lengths
the sweep searched were read off the data.

The one departure from what a user runs: the trials' windows are shortened and re-measuring is
off (a ``trial:`` section and the budget below), so the test takes minutes on 2 shared cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sweeper.recommend import coverage_length
from sweeper.store import Store
from tests.helpers import make_tiny_job, run_sweeper

pytestmark = pytest.mark.torch

_QUICK = """\
budget:
  n_trials: 3
  remeasure: {rounds: 0, drift_every: null, contended_reruns: 0, contended_later: 0}
trial:
  warmup: {min_steps: 1, max_steps: 4, window: 2}
  measure: {min_steps: 3, max_steps: 6, min_seconds: 0, max_seconds: 20}
"""


def test_a_new_users_own_fine_tune_gets_an_answer(tmp_path: Path, cache_dir: Path) -> None:
    job = tmp_path / "my-job"
    make_tiny_job(job, 200)
    assert (job / "model" / "config.json").is_file() and (
        job / "model" / "tokenizer.json"
    ).is_file()

    space = tmp_path / "spaces" / "mine.yaml"
    init = run_sweeper(
        "init", "--model", str(job / "model"), "--data", str(job / "chats.jsonl"),
        "--engine", "sft", "--hardware", "CPU", "--device", "cpu", "--price", "0.10",
        "--out", str(space), cache_dir=cache_dir,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    text = space.read_text()
    written = yaml.safe_load(text)
    assert "search" not in written and written["workload"]["samples"] == 200
    assert written["workload"]["dataset"]["messages_field"] == "messages"
    again = run_sweeper(
        "init", "--model", str(job / "model"), "--data", str(job / "chats.jsonl"),
        "--price", "0.10", "--out", str(space), cache_dir=cache_dir,
    )  # fmt: skip
    assert again.returncode == 2 and "exists" in again.stderr and space.read_text() == text
    # a model path that is not a save_pretrained directory is refused by init, not at the
    # sweep's prepare step: misspelt, the job's directory (no config.json), the data file
    for model, said in (
        (job / "modle", "no such directory on this machine"),
        (job, "has no config.json"),
        (job / "chats.jsonl", "a file, not a model directory"),
    ):
        other = tmp_path / "spaces" / "other.yaml"
        refused = run_sweeper(
            "init", "--model", str(model), "--data", str(job / "chats.jsonl"),
            "--price", "0.10", "--out", str(other), cache_dir=cache_dir,
        )  # fmt: skip
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr and not other.exists()

    assert text.endswith("budget:\n  n_trials: 12\n")
    space.write_text(text.removesuffix("budget:\n  n_trials: 12\n") + _QUICK)
    url = f"sqlite:///{tmp_path / 'sweeper.db'}"
    launch = run_sweeper(
        "launch", "--space", str(space), "--storage", url, cache_dir=cache_dir, timeout=1200
    )
    said = " ".join(launch.stdout.split())
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    assert "max_seq_length: auto → [" in said and "Traceback" not in launch.stderr

    store = Store(url)
    try:
        stats = store.get_study("mine").dataset_stats
        states = [t.state for t in store.list_trials("mine")]
    finally:
        store.dispose()
    assert "complete" in states, states
    cover = coverage_length(stats, 100)
    assert cover is not None

    best = run_sweeper("best", "--study", "mine", "--storage", url, "--json", cache_dir=cache_dir)
    assert best.returncode == 0, best.stderr  # no --allow-truncation
    answer = json.loads(best.stdout)
    seq = answer["config"]["max_seq_length"]
    assert seq >= cover and seq % 64 == 0, (seq, cover)
    assert answer["truncated_tokens_share"] == 0.0 and answer["excluded"] == []

    exports = {}
    for fmt in ("trainer", "sft", "dataloader", "yaml", "json"):
        out = run_sweeper(
            "export", "--study", "mine", "--storage", url, "--format", fmt, cache_dir=cache_dir
        )
        assert out.returncode == 0 and out.stdout.strip(), (fmt, out.stderr)
        exports[fmt] = out.stdout
    # a format this study cannot give (its trials ran sft, not a script of the user's)
    command = run_sweeper(
        "export", "--study", "mine", "--storage", url, "--format", "command", cache_dir=cache_dir
    )
    assert command.returncode == 2 and "Traceback" not in command.stderr
    assert "does not train with a script of yours" in command.stderr and not command.stdout
    assert "SFTConfig(" in exports["sft"] and f"max_length={seq}" in exports["sft"]
    assert "TrainingArguments(" in exports["trainer"]
    assert "DataLoader(" in exports["dataloader"]
    assert yaml.safe_load(exports["yaml"])["config"]["max_seq_length"] == seq
    assert json.loads(exports["json"])["config"]["max_seq_length"] == seq
