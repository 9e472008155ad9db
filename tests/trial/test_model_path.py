"""A model path that is not there is named as a path, not sent to the hub as a repo id."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeper.errors import TrialError
from sweeper.trial.corpus import open_tokenizer

pytestmark = pytest.mark.torch


def test_a_misspelt_model_directory_is_named_as_a_path(tmp_path: Path) -> None:
    missing = tmp_path / "job" / "modle"
    with pytest.raises(TrialError) as caught:
        open_tokenizer(str(missing))
    message = caught.value.message
    assert f"workload.model.id (or tokenizer.id): {missing} is not a directory" in message
    assert "Repo id must be in the form" not in message  # the hub's words, for a path


def test_a_model_directory_without_tokenizer_files_is_refused(tmp_path: Path) -> None:
    """config.json and weights only: transformers 5 loads it as a 1-token GPT-2 tokenizer that
    turns every sample into no tokens, and the sweep measured that as the data."""
    from transformers import GPT2Config, GPT2LMHeadModel

    model_dir = tmp_path / "weights-only"
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64)).save_pretrained(
        model_dir
    )
    with pytest.raises(TrialError) as caught:
        open_tokenizer(str(model_dir))
    message = caught.value.message
    assert f"{model_dir} has no tokenizer" in message
    assert f"tokenizer.save_pretrained('{model_dir}')" in message
    assert "workload.tokenizer.id" in message
