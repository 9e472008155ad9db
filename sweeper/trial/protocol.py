"""What the parent sends a child and what comes back; plain pydantic, no torch."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sweeper.space import TrialConfig, TrialSettings, Workload


class PreparedData(BaseModel):
    """Output of the prepare step, shared by every trial of a sweep."""

    model_config = ConfigDict(frozen=True)

    dataset_path: str
    dataset_format: Literal["json", "parquet", "text"]
    text_field: str
    tokenizer_path: str
    dataset_hash: str
    stats: dict[str, Any]
    pretokenized_path: str | None = None  # a datasets.save_to_disk dir of untruncated ids


class ChildRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["prepare", "trial"]
    workload: Workload
    device: Literal["auto", "cpu", "cuda"]
    cache_dir: str
    prepared: PreparedData | None = None
    config: TrialConfig | None = None
    settings: TrialSettings | None = None
    spawned_at: float = 0.0  # time.time() in the parent just before the spawn


class ChildResult(BaseModel):
    """``ok`` carries ``payload`` (a measurement or PreparedData); ``failed`` a kind + message."""

    status: Literal["ok", "failed"]
    payload: dict[str, Any] | None = None
    failure_kind: str | None = None
    failure_message: str | None = None
    traceback: str | None = None
