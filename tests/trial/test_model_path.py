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
