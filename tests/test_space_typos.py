"""A misspelt key in a space file is named with the key it looks like, at its line."""

from __future__ import annotations

import pytest

from sweeper.errors import SpaceError
from sweeper.space import parse_space

_SPACE = """study: mine
hardware: {name: CPU, usd_per_hour: 0.10, device: cpu}
workload:
  model: {id: my-job/model}
  dataset: {path: my-job/chats.jsonl, messages_field: messages}
  samples: 300
  epochs: 2
search:
  per_device_batch_sise: [2, 4]
  zzz: [1]
trial:
  timout_s: 300
"""


def test_a_misspelt_key_is_named_with_the_key_it_looks_like() -> None:
    with pytest.raises(SpaceError) as caught:
        parse_space(_SPACE, "mine.yaml")
    said = str(caught.value).splitlines()
    assert (
        "mine.yaml:9: search.per_device_batch_sise: unknown key; did you mean "
        "'per_device_batch_size'? (or remove it)"
    ) in said
    timeout = "mine.yaml:12: trial.timout_s: unknown key; did you mean 'timeout_s'? (or remove it)"
    assert timeout in said
    # nothing close: the plain message
    assert "mine.yaml:10: search.zzz: unknown key; remove it or check its spelling" in said


def test_a_baseline_length_of_auto_says_what_to_write_instead() -> None:
    """A user walk wrote `baseline.max_seq_length: auto`, as `init`'s search says it, and left
    it out next: both errors now say a known config is one run's length, and where auto's
    lengths are shown."""
    from sweeper.errors import SpaceError
    from sweeper.space import parse_space
    from tests.helpers import TINY_SPACE

    text = TINY_SPACE.read_text()
    for replaced, said in (("max_seq_length: auto", "valid integer"), ("", "required key")):
        bad = text.replace(
            "  max_seq_length: 64\n  attn_implementation: eager",
            f"  {replaced}\n  attn_implementation: eager",
        )
        with pytest.raises(SpaceError) as error:
            parse_space(bad, "space.yaml")
        message = str(error.value)
        assert "baseline.max_seq_length" in message and said in message, message
        assert "a known config is the length a run uses" in message
        assert "`sweeper doctor --space` shows what it picks" in message
