"""What the parent sends a child and what comes back; plain pydantic, no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from sweeper.space import (
    AttnImplementation,
    CompileMode,
    Precision,
    Space,
    TrialConfig,
    Workload,
)
from sweeper.space_trial import TrialSettings

# how the prepared dataset is stored: datasets' loader names, and save_to_disk's directory
DatasetFormat = Literal["json", "parquet", "csv", "text", "disk"]


class PreparedData(BaseModel):
    """Output of the prepare step, shared by every trial of a sweep."""

    model_config = ConfigDict(frozen=True)

    dataset_path: str
    dataset_format: DatasetFormat
    dataset_split: str = "train"  # of a save_to_disk directory
    text_field: str  # chat records are rendered into a "text" column first
    tokenizer_path: str
    trust_remote_code: bool = False
    chat_template: str | None = None  # what chat records were rendered with
    completion_only: bool = False  # loss: completion: only the replies are labels
    dataset_hash: str
    stats: dict[str, Any]
    pretokenized_path: str | None = None  # a datasets.save_to_disk dir of untruncated ids

    @property
    def tokens_per_sample(self) -> float | None:
        """Mean tokens per sample with the EOS each is closed by (None if not measured)."""
        return tokens_per_sample(self.stats)


def tokens_per_sample(stats: dict[str, Any] | None) -> float | None:
    """Mean tokens per sample of measured dataset ``stats``, plus the sample's EOS."""
    mean = (stats or {}).get("tokens_mean")
    return None if mean is None else float(mean) + 1.0


class ProbeSpec(BaseModel):
    """A preflight probe: can this attention / compile mode / precision train here, how fast?"""

    model_config = ConfigDict(frozen=True)

    attn_implementation: AttnImplementation
    compile_mode: CompileMode
    precision: Precision
    compare_fp32: bool = False  # also time fp32, to catch a pathologically slow precision
    steps: int = 4
    # also check that deepspeed imports (seconds per child): only where the space lists ZeRO
    deepspeed: bool = False


class ChildRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["prepare", "probe", "trial", "facts"]
    workload: Workload
    device: Literal["auto", "cpu", "cuda"]
    cache_dir: str
    prepared: PreparedData | None = None
    config: TrialConfig | None = None
    settings: TrialSettings | None = None
    probe: ProbeSpec | None = None
    # the study the request serves: its trials share compile caches and one-off cost figures
    # (sweeper/trial/oneoff.py); None shares nothing
    study: str | None = None
    # the knobs the space lists with more than one value: a script trial whose program never
    # reads one of them (not a flag, no sweeper.trial_config()) would record configs that differ
    # in a value nothing ran (sweeper.trial.script.unreached)
    varied: tuple[str, ...] = ()
    # engine: script: the knobs the space's search lists (the user's, or the command's own
    # values: sweeper.script_defaults). One it does not list and the program is not given (no
    # flag, no launch option) runs at the program's own value, which the trial reads back and
    # records instead of comparing it with sweeper's default (sweeper.trial.script.owned).
    # None: not known, every knob is compared
    listed: tuple[str, ...] | None = None
    spawned_at: float = 0.0  # time.time() in the parent just before the spawn

    @classmethod
    def for_space(
        cls,
        kind: Literal["prepare", "probe", "trial", "facts"],
        space: Space,
        cache_dir: str | Path,
        **fields: Any,
    ) -> ChildRequest:
        """A request for ``space``'s workload on its device; ``fields`` add to it (``prepared``,
        ``config``, ``probe``, ...) or override it (``device``)."""
        listed = None
        if kind == "trial" and space.workload.engine == "script":
            listed = tuple(sorted(space.search.model_fields_set & set(TrialConfig.model_fields)))
        return cls(
            kind=kind,
            **{
                "workload": space.workload,
                "device": space.hardware.device,
                "cache_dir": str(cache_dir),
                "study": space.study,
                "listed": listed,
                **fields,
            },
        )


class ChildResult(BaseModel):
    """``ok`` carries ``payload`` (a measurement or PreparedData); ``failed`` a kind + message."""

    status: Literal["ok", "failed"]
    payload: dict[str, Any] | None = None
    failure_kind: str | None = None
    failure_message: str | None = None
    traceback: str | None = None
