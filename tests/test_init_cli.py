"""``sweeper init`` where no one can answer a question (a script, CI, a pipe): a missing
option is said by its name with exit 2, not a question read from EOF and 'Aborted.'; nothing
is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO


def test_init_without_a_terminal_names_the_missing_option(tmp_path: Path) -> None:
    data = tmp_path / "chats.jsonl"
    chat = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    data.write_text(json.dumps(chat) + "\n")
    out = tmp_path / "mine.yaml"
    ran = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "init", "--model", "org/m", "--data", str(data),
         "--out", str(out)],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert ran.returncode == 2, ran.stdout + ran.stderr
    assert "Missing option '--price'" in ran.stderr and "Aborted" not in ran.stderr
    assert not out.exists()
