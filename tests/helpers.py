"""Small shared helpers for tests (fixtures live in conftest.py)."""

from __future__ import annotations

from pathlib import Path

SPACES = Path(__file__).parent / "spaces"
REPO = Path(__file__).parent.parent
TINY_SPACE = SPACES / "tiny.yaml"
