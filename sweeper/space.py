"""Space files: YAML → a validated, frozen ``Space`` → Optuna distributions.

A space file's sections have their own modules: ``workload:`` in ``sweeper.job``, ``search:`` in
``sweeper.space_search``, ``trial:`` in ``sweeper.space_trial``, ``budget:`` in
``sweeper.space_budget``; this one holds the file as a whole (hardware, the known configs, the
checks across sections) and reads it. This is the only module that calls ``trial.suggest_*``.
Every error names the file, the YAML line, the field and the value, e.g.::

    spaces/x.yaml:14: search.per_device_batch_size: List should have at least 1 item after
    validation, not 0 (got [])
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    model_validator,
)

from sweeper import knobs, yamllines
from sweeper.catalog import OFFER_PATTERN
from sweeper.errors import SpaceError
from sweeper.job import Frozen as _Frozen
from sweeper.job import Workload, names_a_local_path
from sweeper.knobs import (
    KNOBS,
    AttnImplementation,
    CompileMode,
    DataParallel,
    Optimizer,
    PackingStrategy,
    PositiveInt,
    Precision,
    Quantization,
    SeqLength,
    TrialConfig,
    WorkerCount,
    WorkerStart,
)
from sweeper.space_budget import Budget
from sweeper.space_errors import problem_lines
from sweeper.space_search import SearchSpace
from sweeper.space_trial import TrialSettings

if TYPE_CHECKING:
    import optuna

__all__ = ["AttnImplementation", "CompileMode", "Precision", "TrialConfig"]

STUDY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
StudyName = Annotated[str, Field(pattern=STUDY_NAME_PATTERN)]


class Hardware(_Frozen):
    """The machine a trial runs on and what it costs."""

    name: str = Field(min_length=1, description="e.g. 'H100 SXM 80GB'; used for pricing and MFU")
    usd_per_hour: float = Field(
        gt=0,
        description="rental price of one device (GPU), $/h: a run on N devices costs "
        "hours × N × this (on a CPU each rank counts as one)",
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    catalog: str | None = Field(
        default=None,
        min_length=1,
        description="the GPU catalog `best --across-hardware` prices other GPUs from (a path "
        "from where sweeper runs); default: the shipped sweeper/gpus.yaml",
    )
    compare: list[Annotated[str, Field(pattern=OFFER_PATTERN)]] = Field(
        default_factory=list,
        description="offers `best --across-hardware` shows beside the catalog's GPUs, as "
        "catalog keys with a count: ['2x h100-sxm', '4x a100-40gb']",
    )


class _KnownConfig(_Frozen):
    """The config the user runs today (fields derived from ``sweeper.knobs``); it is the
    sweep's first trial and every result is compared with it. Each value must be one of the
    search space's choices; a knob left out takes its default, or the search's only choice."""

    label: str | None = Field(
        default=None, max_length=80, description="a name for reports, e.g. 'seed 001 after'"
    )

    def as_config(self, search: SearchSpace) -> TrialConfig:
        """The trial config; knobs left out resolved against ``search`` (see the class): a
        config resolved without the space would differ from the trial the sweep ran."""
        values = self.model_dump(exclude={"label"})
        for knob in KNOBS:
            if knob.required or values.get(knob.name) is not None:
                continue
            listed = search.values(knob.name)
            if knob.default in listed or not listed:
                values[knob.name] = knob.default
            elif len(listed) == 1:
                values[knob.name] = listed[0]
            elif knob.is_active(values):
                raise ValueError(
                    f"{knob.name} is left out, and search.{knob.name} {listed} has several "
                    f"values without the default {knob.default!r}; say which one it uses"
                )
        return TrialConfig.model_validate(knobs.normalize(values))


def _optional(name: str) -> Any:
    """A knob a known config may leave out (``_KnownConfig.as_config`` resolves it)."""
    return Field(default=None, description=knobs.KNOB[name].help)


class Baseline(_KnownConfig):
    """``baseline:`` and each of ``also_try:``: a value per knob, in ``KNOBS``' order
    (tests/test_knobs.py checks them against it); the required knobs must be given."""

    per_device_batch_size: PositiveInt
    gradient_accumulation_steps: PositiveInt
    num_workers: WorkerCount
    prefetch_factor: PositiveInt | None = _optional("prefetch_factor")
    persistent_workers: bool | None = _optional("persistent_workers")
    multiprocessing_context: WorkerStart | None = _optional("multiprocessing_context")
    pin_memory: bool | None = _optional("pin_memory")
    max_seq_length: SeqLength
    packing: bool | None = _optional("packing")
    packing_strategy: PackingStrategy | None = _optional("packing_strategy")
    padding_free: bool | None = _optional("padding_free")
    precision: Precision | None = _optional("precision")
    tf32: bool | None = _optional("tf32")
    compile_mode: CompileMode | None = _optional("compile_mode")
    attn_implementation: AttnImplementation | None = _optional("attn_implementation")
    gradient_checkpointing: bool | None = _optional("gradient_checkpointing")
    liger_kernel: bool | None = _optional("liger_kernel")
    optim: Optimizer | None = _optional("optim")
    quantization: Quantization | None = _optional("quantization")
    devices: PositiveInt | None = _optional("devices")
    data_parallel: DataParallel | None = _optional("data_parallel")


# workload keys that predate the knobs they became; they still set the knob's one choice
_WORKLOAD_KNOBS = ("precision", "tf32")


class Space(_Frozen):
    """A whole space file."""

    study: StudyName
    storage: str | None = None
    hardware: Hardware
    workload: Workload
    baseline: Baseline | None = None
    also_try: list[Baseline] = Field(
        default_factory=list,
        description="configs to run right after the baseline (e.g. a blog post's advice)",
    )
    search: SearchSpace = Field(default_factory=lambda: SearchSpace())
    trial: TrialSettings = TrialSettings()
    budget: Budget = Budget()

    @model_validator(mode="before")
    @classmethod
    def _workload_knobs(cls, data: Any) -> Any:
        """``workload.precision: bf16`` (the older spelling) is ``search.precision: [bf16]``."""
        if not isinstance(data, dict):
            return data
        workload, search = data.get("workload"), data.get("search", {})
        if not isinstance(workload, dict) or not isinstance(search, dict):
            return data
        search = dict(search)
        for name in _WORKLOAD_KNOBS:
            value = workload.get(name)
            if value is None:
                continue
            if name in search and search[name] != [value]:
                raise ValueError(
                    f"workload.{name} is {value!r} but search.{name} is {search[name]!r}; "
                    f"keep only search.{name}"
                )
            search[name] = [value]
        return {**data, "search": search}

    @model_validator(mode="before")
    @classmethod
    def _command_knobs(cls, data: Any) -> Any:
        """A script's knob the space does not list runs at the value the user's command gives
        it, not at sweeper's default (``sweeper.script_defaults``)."""
        if not isinstance(data, dict):
            return data
        workload, search = data.get("workload"), data.get("search", {})
        if not isinstance(workload, dict) or not isinstance(search, dict):
            return data
        script = workload.get("script")
        if workload.get("engine") != "script" or not isinstance(script, dict):
            return data
        command, form = script.get("command"), script.get("knobs", "flags")
        if not isinstance(command, list) or not all(isinstance(w, str) for w in command):
            return data  # the field's own validation says what is wrong
        from sweeper import script_defaults

        given = script_defaults.said(command, str(form))
        if isinstance(search.get("effective_batch"), dict):
            given.pop("gradient_accumulation_steps", None)  # derived from the batch there
        taken = {name: [value] for name, (value, _) in given.items() if name not in search}
        return {**data, "search": {**search, **taken}} if taken else data

    @model_validator(mode="after")
    def _worker_start_needs_the_loop(self) -> Space:
        # a script's own DataLoader takes it from sweeper.trial_config() (a Trainer script's
        # cannot: its trials fail as a mismatch, read back from the loader)
        starts = [v for v in self.search.values("multiprocessing_context") if v != "fork"]
        if starts and self.workload.engine not in ("loop", "script"):
            raise ValueError(
                f"search.multiprocessing_context {starts}: TrainingArguments has no way to set "
                f"it, so the {self.workload.engine} engine's DataLoader workers fork; list only "
                "fork, or use engine: loop or script (your own DataLoader)"
            )
        return self

    @model_validator(mode="after")
    def _packing_strategy_of_the_engine(self) -> Space:
        trl_only = [v for v in self.search.values("packing_strategy") if v != "wrapped"]
        if trl_only and self.workload.engine != "sft":
            raise ValueError(
                f"search.packing_strategy {trl_only}: these are TRL's packings (engine: sft); "
                f"the {self.workload.engine} engine packs as wrapped (a long sample continues "
                "in the next row); list only wrapped, or use engine: sft"
            )
        return self

    @model_validator(mode="after")
    def _quantization_needs_an_adapter(self) -> Space:
        quantized = [q for q in self.search.values("quantization") if q != "none"]
        if quantized and self.workload.adapter is None:
            raise ValueError(
                f"search.quantization {quantized}: quantized weights cannot be trained "
                "directly; add workload.adapter (LoRA), or list only 'none'"
            )
        return self

    @model_validator(mode="after")
    def _known_configs_in_space(self) -> Space:
        for where, known in self.named_known_configs():
            try:
                config = known.as_config(self.search)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            reason = self.search.runnable(config)
            if reason is not None:
                raise ValueError(f"{where}: {reason}")
        return self

    def workload_hash(self) -> str:
        """Equal for studies that price the same job (on any hardware, at any price)."""
        job = self.workload.model_dump(
            mode="json", exclude={"checkpoint": {"dir"}, **dict.fromkeys(_WORKLOAD_KNOBS, True)}
        )
        # precision changes the arithmetic but not the job; it is a knob like any other
        return hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]

    def named_known_configs(self) -> list[tuple[str, Baseline]]:
        """``("baseline", ...)``, then ``("also_try[0]", ...)``, ...: where each is in the file."""
        named = [] if self.baseline is None else [("baseline", self.baseline)]
        return named + [(f"also_try[{i}]", c) for i, c in enumerate(self.also_try)]

    def known_configs(self) -> list[TrialConfig]:
        """The baseline, then ``also_try``: run first, in this order."""
        return [known.as_config(self.search) for _, known in self.named_known_configs()]

    def precision(self) -> str:
        """The precision when only one is searched (what ``workload.precision`` said)."""
        return self.search.values("precision")[0]


def optuna_params(config: TrialConfig, search: SearchSpace) -> dict[str, Any]:
    """The parameters ``suggest`` would record for ``config`` (for ``study.enqueue_trial``)."""
    values = config.model_dump()
    return {
        name: values[name]
        for name in search.searched()
        if values[name] is not None and knobs.KNOB[name].is_active(values)
    }


def suggest(trial: optuna.trial.BaseTrial, search: SearchSpace) -> TrialConfig:
    """Ask Optuna for one config. A knob with one choice is not a parameter; a knob that does
    not apply (prefetch_factor without workers) is None and not asked for."""
    searched = set(search.searched())
    derived = search.derives_accumulation
    values: dict[str, Any] = {}
    for knob in KNOBS:
        if derived and knob.name == "gradient_accumulation_steps":
            continue  # after the devices: below
        if not knob.is_active(values):
            values[knob.name] = None
            continue
        choices = search.choices_for(knob.name, values)
        if knob.name in searched:
            values[knob.name] = trial.suggest_categorical(knob.name, choices)
        else:
            values[knob.name] = choices[0]
    if derived:  # not dividing: 1, and the sweep's rules skip it saying why (``admits``)
        steps = search.choices_for("gradient_accumulation_steps", values)
        values["gradient_accumulation_steps"] = steps[0] if steps else 1
    return TrialConfig(**values)


# ---------------------------------------------------------------- loading with line numbers


def parse_space(text: str, source: str = "<space>") -> Space:
    """Validate a space from YAML text; raise SpaceError naming ``source:line: field``."""
    return _parse(text, source)[0]


def _parse(text: str, source: str) -> tuple[Space, yamllines.Lines]:
    data, lines = yamllines.load(text, source, SpaceError)
    if not isinstance(data, dict):
        raise SpaceError(f"{source}:1: a space file is a mapping of keys (study, hardware, ...)")
    try:
        return Space.model_validate(data), lines
    except ValidationError as e:
        raise SpaceError("\n".join(problem_lines(e, Space, source, lines))) from None


def stored_space(text: str, study: str, source: str) -> Space:
    """The space a study stored, as that study: one imported ``--as NAME`` keeps its file's
    text, whose ``study:`` is still the name it was exported under (a worker reading the text
    alone would sweep, and create, the old name)."""
    return as_study(parse_space(text, source), study)


def as_study(space: Space, study: str) -> Space:
    """``space`` swept as study ``study`` (``launch --space FILE --study NAME``); a name the
    space file could not hold is a ``SpaceError``."""
    if re.fullmatch(STUDY_NAME_PATTERN, study) is None:
        raise SpaceError(
            f"--study {study!r}: a study name is 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return space.model_copy(update={"study": study})


# A space file is a page of YAML; a larger one is a mistake (``--space /dev/zero``, a dataset
# passed by accident), refused before it is read whole.
MAX_SPACE_BYTES = 1 << 20


def load_space(path: str | Path, *, runs_here: bool = False) -> Space:
    """Read and validate a space file. ``runs_here``: the file is swept (or examined) on this
    machine, so a script space's program must be here too (``sweeper.space_script``)."""
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_SPACE_BYTES + 1)
    except OSError as e:
        raise SpaceError(f"{path}: cannot read space file: {e.strerror}") from e
    if len(data) > MAX_SPACE_BYTES:
        raise SpaceError(
            f"{path}: larger than {MAX_SPACE_BYTES // 1024} KiB, so not a space file; pass "
            "the YAML file that describes the sweep (see spaces/ for examples)"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise SpaceError(
            f"{path}:{line}:{column}: not UTF-8 text (byte 0x{data[e.start]:02x}); save the "
            f"file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path} > fixed.yaml"
        ) from None
    space, lines = _parse(text, source=str(path))
    # its script, said before any preparation (a file written for other machines, as the
    # cluster recipes' spaces, is read without it; preflight checks it where it runs)
    script = space.workload.script
    if runs_here and space.workload.engine == "script" and script is not None:
        from sweeper.space_script import program_problem

        problem = program_problem(script.command, script.cwd, str(path), lines)
        if problem is not None:
            raise SpaceError(problem)
    if runs_here:
        _check_paths(space, str(path), lines)
        _check_data(space, str(path), lines)
    return space


def _check_paths(space: Space, source: str, lines: yamllines.Lines) -> None:
    """A data file, model or tokenizer directory the space names and this machine lacks,
    said with its line at once (the prepare step, a child, said it 15-18 s in, exit 1)."""
    workload = space.workload
    data = workload.dataset.path
    if data is not None and not Path(data).expanduser().exists():
        line = yamllines.line_for(("workload", "dataset", "path"), lines)
        raise SpaceError(
            f"{source}:{line}: workload.dataset.path: no such file or directory "
            f"{Path(data).expanduser().resolve()}; give your .jsonl, .json, .parquet, .csv or "
            ".txt file, or a save_to_disk directory (a relative path is read from where you "
            "run sweeper)"
        )
    for field, given in (("model", workload.model.id), ("tokenizer", workload.tokenizer.id)):
        if given is None or not names_a_local_path(given):  # a hub id: the prepare step's
            continue
        if not Path(given).expanduser().is_dir():
            line = yamllines.line_for(("workload", field, "id"), lines)
            raise SpaceError(
                f"{source}:{line}: workload.{field}.id: {given} is not a directory on this "
                "machine; give the directory save_pretrained wrote (check the path's "
                "spelling), or a hub id"
            )


def _check_data(space: Space, source: str, lines: yamllines.Lines) -> None:
    """A local data file's bad records, said with their lines before anything runs (the
    prepare step, a child, stops at the first of them half a minute in)."""
    from sweeper.starter import bad_records

    dataset = space.workload.dataset
    if dataset.path is None or not Path(dataset.path).expanduser().is_file():
        return  # a directory, or no such file: the prepare step says it
    kind, column = (
        ("messages_field", dataset.messages_field)
        if dataset.messages_field is not None
        else ("text_field", dataset.text_field)
    )
    problems = bad_records(Path(dataset.path).expanduser(), kind, column)
    if problems:
        line = yamllines.line_for(("workload", "dataset", "path"), lines)
        more = " (the first 5)" if len(problems) == 5 else ""
        raise SpaceError(
            f"{source}:{line}: workload.dataset.path: the prepare step would refuse "
            f"{len(problems)} record{'s' if len(problems) > 1 else ''}{more}:\n  "
            + "\n  ".join(problems)
        )
