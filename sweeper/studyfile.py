"""Recorded sweeps as files: a study ⇄ ``studies/NAME.json``.

    sweeper study export --study cpu-demo             # → studies/cpu-demo.json
    sweeper study import studies/cpu-demo.json        # into --storage (SQLite by default)

A file holds every column of the study row (the space it was swept with, the dataset's token
statistics, the preflight verdicts) and of each trial (the full measurement with its environment
fingerprint, the run projection, the failure), plus Optuna's record of the study (params,
distributions, states, values, attributes). A trial recorded before sweeper counted only real
tokens in MFU (issue 36) keeps its figures; ``real_token_mfu`` derives the real-token MFU beside
them, labelled as derived. An imported study therefore answers ``best``, the
REST API and the dashboard exactly as the original did, and ``sweeper launch`` can resume it.

The round trip is lossless: exporting an imported study gives the same document, save
``exported_at``. Columns are read from the tables themselves, so a column added by a migration
travels without a change here; a file from a newer sweeper (a column this one lacks) is refused.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from sqlalchemy import JSON, BigInteger, Boolean, Column, DateTime, Float, Integer, String, Text
from sqlalchemy.types import TypeDecorator

import sweeper
from sweeper.errors import ConflictError, SweeperError
from sweeper.space import StudyName
from sweeper.store import Store
from sweeper.store.models import STUDY_STATES, TRIAL_STATES, StudyRow, TrialRow

FORMAT = "sweeper-study"
VERSION = 1
# Columns that are the database's own bookkeeping, not the study's content.
# ids of this database (a worker id names a row of sweeper_workers, which is not exported)
_SKIPPED = {"id", "study_id", "worker_id"}


class StudyFileError(SweeperError):
    """A study file cannot be read or does not describe a study; the message says where."""


# ---------------------------------------------------------------- columns ⇄ JSON


def _columns(table: Any) -> list[Column[Any]]:
    return [c for c in table.__table__.columns if c.name not in _SKIPPED]


def _dump_value(column: Column[Any], value: Any) -> Any:
    if value is None:
        return None
    if isinstance(column.type, DateTime):
        if value.tzinfo is None:  # SQLite returns naive datetimes; we only ever write UTC
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat()
    return value


def _load_value(column: Column[Any], value: Any, where: str) -> Any:
    """A JSON value checked against the column's type (and converted, for timestamps)."""
    if value is None:
        if not column.nullable and column.server_default is None and column.default is None:
            raise StudyFileError(f"{where}: must not be null")
        return None
    kind: Any = column.type
    if isinstance(kind, TypeDecorator):  # e.g. ConfigJson: checked as what it stores
        kind = kind.impl
    if isinstance(kind, DateTime):
        return _load_timestamp(value, where)
    if isinstance(kind, Float):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise StudyFileError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if isinstance(kind, BigInteger | Integer):
        if isinstance(value, bool) or not isinstance(value, int):
            raise StudyFileError(f"{where}: expected an integer, got {value!r}")
        return value
    if isinstance(kind, String | Text):
        return _load_text(kind, value, where)
    if isinstance(kind, Boolean):
        if not isinstance(value, bool):
            raise StudyFileError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(kind, JSON):
        return value
    raise StudyFileError(f"{where}: column type {kind!r} has no file form")  # pragma: no cover


def _load_timestamp(value: Any, where: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise StudyFileError(f"{where}: expected an ISO 8601 timestamp, got {value!r}")
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _load_text(kind: Any, value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise StudyFileError(f"{where}: expected text, got {value!r}")
    length = getattr(kind, "length", None)
    if length is not None and len(value) > length:
        raise StudyFileError(f"{where}: longer than {length} characters")
    return value


# Columns a file carries only where they hold a value (absent reads as null): a script's own
# knob values exist for engine: script trials only, so every other study's file stays as an
# older sweeper wrote it, and reads there
_ONLY_SET = {"own_values"}


def _dump_row(table: Any, values: dict[str, Any]) -> dict[str, Any]:
    return {
        c.name: _dump_value(c, values[c.name])
        for c in _columns(table)
        if not (c.name in _ONLY_SET and values[c.name] is None)
    }


def _load_row(table: Any, data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise StudyFileError(f"{where}: expected an object of columns")
    columns = {c.name: c for c in _columns(table)}
    unknown = sorted(set(data) - set(columns))
    if unknown:
        raise StudyFileError(
            f"{where}: unknown field(s) {', '.join(unknown)}; the file may come from a newer "
            "sweeper: upgrade sweeper to import it"
        )
    values = {}
    for name, column in columns.items():
        if name not in data:
            if column.nullable or column.server_default is not None:
                continue  # an older file: the column's default applies
            raise StudyFileError(f"{where}.{name}: required field is missing")
        values[name] = _load_value(column, data[name], f"{where}.{name}")
    return values


# ---------------------------------------------------------------- Optuna's part


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OptunaTrialRecord(_Strict):
    number: int = Field(ge=0)
    state: str
    values: list[float] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    distributions: dict[str, dict[str, Any]] = Field(default_factory=dict)
    user_attrs: dict[str, Any] = Field(default_factory=dict)
    system_attrs: dict[str, Any] = Field(default_factory=dict)
    intermediate_values: dict[int, float] = Field(default_factory=dict)
    datetime_start: datetime | None = None
    datetime_complete: datetime | None = None


class OptunaRecord(_Strict):
    directions: list[str] = Field(min_length=1)
    user_attrs: dict[str, Any] = Field(default_factory=dict)
    system_attrs: dict[str, Any] = Field(default_factory=dict)
    trials: list[OptunaTrialRecord] = Field(default_factory=list)


class StudyDocument(_Strict):
    """A whole study file. ``study`` and ``trials`` are column → value maps of our tables,
    checked against the tables' columns on load."""

    format: str
    version: int
    exported_at: str
    sweeper_version: str
    study: dict[str, Any]
    trials: list[dict[str, Any]]
    optuna: OptunaRecord | None = None

    @property
    def name(self) -> str:
        return str(self.study["name"])


def _optuna_record(storage_url: str, name: str) -> OptunaRecord | None:
    import optuna

    from sweeper.store.optuna import mapped_errors, optuna_storage

    storage = optuna_storage(storage_url)
    try:
        with mapped_errors(f"cannot read Optuna's study {name!r}"):
            try:
                study_id = storage.get_study_id_from_name(name)
            except KeyError:
                return None  # the sweep never reached Optuna (e.g. it failed while preparing)
            trials = storage.get_all_trials(study_id, deepcopy=False)
            directions = storage.get_study_directions(study_id)
            user_attrs = storage.get_study_user_attrs(study_id)
            system_attrs = storage.get_study_system_attrs(study_id)
    finally:
        storage.engine.dispose()
    return OptunaRecord(
        directions=[d.name.lower() for d in directions],
        user_attrs=user_attrs,
        system_attrs=system_attrs,
        trials=[
            OptunaTrialRecord(
                number=t.number,
                state=t.state.name,
                values=t.values,
                params=t.params,
                distributions={
                    k: json.loads(optuna.distributions.distribution_to_json(d))
                    for k, d in t.distributions.items()
                },
                user_attrs=t.user_attrs,
                system_attrs=t.system_attrs,
                intermediate_values=t.intermediate_values,
                datetime_start=t.datetime_start,
                datetime_complete=t.datetime_complete,
            )
            for t in sorted(trials, key=lambda t: t.number)
        ],
    )


def _frozen_trials(record: OptunaRecord, source: str) -> list[Any]:
    import optuna

    frozen = []
    for index, t in enumerate(record.trials):
        where = f"{source}: optuna.trials[{index}]"
        if t.number != index:
            raise StudyFileError(f"{where}: number {t.number}; Optuna's numbers run 0, 1, 2, ...")
        try:
            state = optuna.trial.TrialState[t.state]
            trial = optuna.trial.FrozenTrial(
                number=t.number,
                state=state,
                value=None,
                values=t.values,
                datetime_start=t.datetime_start,
                datetime_complete=t.datetime_complete,
                params=t.params,
                distributions={
                    k: optuna.distributions.json_to_distribution(json.dumps(d))
                    for k, d in t.distributions.items()
                },
                user_attrs=t.user_attrs,
                system_attrs=t.system_attrs,
                intermediate_values=t.intermediate_values,
                trial_id=0,
            )
            trial._validate()
        except (KeyError, ValueError, TypeError) as e:
            raise StudyFileError(f"{where}: not a valid Optuna trial: {e}") from e
        frozen.append(trial)
    return frozen


# ---------------------------------------------------------------- export / import


def export_study(store: Store, name: str, *, allow_running: bool = False) -> StudyDocument:
    """The study ``name`` as a document. A running sweep is refused (its last trial would be
    half-measured in the file) unless ``allow_running``."""
    study, trials = store.export_rows(name)
    if study["state"] in ("running", "stopping") and not allow_running:
        raise ConflictError(
            f"study {name!r} is {study['state']}: its running trial would be recorded "
            "half-done. Export it when the sweep has ended, or pass --force to record it as is "
            "(a sweep killed with SIGKILL stays 'running')"
        )
    return StudyDocument(
        format=FORMAT,
        version=VERSION,
        exported_at=datetime.now(UTC).isoformat(),
        sweeper_version=sweeper.__version__,
        study=_dump_row(StudyRow, study),
        trials=[_dump_row(TrialRow, t) for t in trials],
        optuna=_optuna_record(store.url, name),
    )


def import_study(store: Store, document: StudyDocument, *, name: str | None = None) -> str:
    """Load ``document`` into ``store`` (and Optuna's tables there) as study ``name`` (default:
    the recorded name); returns the name. Nothing is written if the name is taken or the
    document is invalid; a failure half-way removes what was written."""
    from sweeper.store.optuna import delete_study_at

    source = f"study file of {document.name!r}"
    target = name or document.name
    try:
        TypeAdapter(StudyName).validate_python(target)
    except ValidationError:
        raise StudyFileError(
            f"study name {target!r}: use letters, digits, '.', '_' and '-' (at most 100, "
            "starting with a letter or digit)"
        ) from None
    study = _load_row(StudyRow, document.study | {"name": target}, f"{source}: study")
    trials = [
        _with_interval(_load_row(TrialRow, t, f"{source}: trials[{i}]"))
        for i, t in enumerate(document.trials)
    ]
    _check_states_and_configs(study, trials, source)
    numbers = [t.get("number") for t in trials]
    if len(set(numbers)) != len(numbers):
        raise StudyFileError(f"{source}: trial numbers repeat")
    frozen = None if document.optuna is None else _frozen_trials(document.optuna, source)
    if frozen is not None and any(n is None or n >= len(frozen) for n in numbers):
        raise StudyFileError(f"{source}: a trial number has no Optuna trial of that number")
    if store.has_study(target):
        raise ConflictError(
            f"a study named {target!r} already exists in {store.redacted_url}; import under "
            "another name with --as NEW_NAME, or delete that study first"
        )
    if frozen is not None:
        _create_optuna_study(store.url, target, document.optuna, frozen)  # type: ignore[arg-type]
    try:
        store.import_rows(study, trials)
    except BaseException:
        if frozen is not None:
            delete_study_at(store.url, target)
        raise
    return target


def _check_states_and_configs(
    study: dict[str, Any], trials: list[dict[str, Any]], source: str
) -> None:
    """What a live write could never store: a state no page knows, a config outside the
    knobs' choices. The pages and charts read both (an unknown state once answered 500 for
    every page of the storage)."""
    from pydantic import ValidationError as ConfigError

    from sweeper.knob_values import as_ran
    from sweeper.knobs import TrialConfig

    if study.get("state") not in STUDY_STATES:
        raise StudyFileError(
            f"{source}: study.state: {study.get('state')!r} is not a study state; expected "
            f"one of {', '.join(STUDY_STATES)}"
        )
    for index, trial in enumerate(trials):
        where = f"{source}: trials[{index}]"
        if trial.get("state") not in TRIAL_STATES:
            raise StudyFileError(
                f"{where}.state: {trial.get('state')!r} is not a trial state; expected one of "
                f"{', '.join(TRIAL_STATES)}"
            )
        config = trial.get("config")
        if not isinstance(config, dict):
            raise StudyFileError(f"{where}.config: expected an object of knob values")
        own = trial.get("own_values")
        if own is not None and not isinstance(own, dict):
            raise StudyFileError(f"{where}.own_values: expected an object of knob values or null")
        unknown = sorted(set(own or {}) - set(TrialConfig.model_fields))
        if unknown:
            raise StudyFileError(
                f"{where}.own_values: {', '.join(unknown)} is not a knob; expected knobs of "
                "the config (the values a script ran of its own)"
            )
        # the config asked, then as it ran (a script's own values in place)
        for field, values in (("config", config), ("own_values", as_ran(config, own))):
            try:
                TrialConfig.model_validate(values)
            except ConfigError as e:
                first = e.errors()[0]
                knob = ".".join(str(p) for p in first["loc"])
                raise StudyFileError(
                    f"{where}.{field}.{knob}: {first['msg']} (got {first.get('input')!r})"
                ) from None


def _with_interval(trial: dict[str, Any]) -> dict[str, Any]:
    """A completed trial of a file written before $/run intervals were stored takes its
    window's interval, as migration 0006 gives a stored one."""
    if trial.get("state") != "complete" or trial.get("cost_ci95_rel") is not None:
        return trial
    ci = (trial.get("measurement") or {}).get("throughput_ci95_rel")
    if isinstance(ci, int | float) and not isinstance(ci, bool) and 0 <= ci < math.inf:
        return trial | {"cost_ci95_rel": float(ci)}
    return trial


def _create_optuna_study(
    storage_url: str, name: str, record: OptunaRecord, frozen: list[Any]
) -> None:
    import optuna

    from sweeper.store.optuna import delete_optuna_study, mapped_errors, optuna_storage

    storage = optuna_storage(storage_url)
    try:
        try:
            storage.get_study_id_from_name(name)
        except KeyError:
            pass
        else:
            raise ConflictError(
                f"Optuna already has a study named {name!r} in this storage (without sweeper's "
                "rows); import under another name with --as NEW_NAME"
            )
        try:
            with mapped_errors(f"cannot write Optuna's study {name!r}"):
                study = optuna.create_study(
                    study_name=name,
                    storage=storage,
                    directions=record.directions,  # type: ignore[arg-type]
                )
                study_id = storage.get_study_id_from_name(name)
                for key, value in record.user_attrs.items():
                    storage.set_study_user_attr(study_id, key, value)
                for key, value in record.system_attrs.items():
                    storage.set_study_system_attr(study_id, key, value)
                study.add_trials(frozen)
        except BaseException:
            delete_optuna_study(storage, name)
            raise
    finally:
        storage.engine.dispose()


# ---------------------------------------------------------------- files


def write_study_file(document: StudyDocument, path: Path) -> None:
    """Write atomically: a reader never sees half a file, an old file survives a failure."""
    text = json.dumps(document.model_dump(mode="json"), indent=1, sort_keys=True) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    ) as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
        os.fchmod(f.fileno(), 0o644)  # a record to share and commit, not a private temp file
    try:
        os.replace(f.name, path)
    except OSError:
        os.unlink(f.name)
        raise


def read_study_file(path: Path) -> StudyDocument:
    """Read and check a study file; StudyFileError names the file and what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise StudyFileError(f"{path}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise StudyFileError(f"{path}: not UTF-8 text (is it a study file?)") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise StudyFileError(f"{path}:{e.lineno}: not valid JSON: {e.msg}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StudyFileError(
            f'{path}: not a sweeper study file (expected "format": "{FORMAT}"); write one '
            "with `sweeper study export`"
        )
    if data.get("version") != VERSION:
        raise StudyFileError(
            f"{path}: study file version {data.get('version')!r}; this sweeper reads version "
            f"{VERSION}"
        )
    try:
        document = StudyDocument.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()[:5]
        )
        raise StudyFileError(f"{path}: {problems}") from None
    if not isinstance(document.study.get("name"), str):
        raise StudyFileError(f"{path}: study.name is missing")
    return document


# ---------------------------------------------------------------- MFU of older records

# the recorded figures agree with "FLOPs counted on the padded tokens" to this relative error
_ACCOUNTING_TOLERANCE = 1e-3


class RealTokenMfu(BaseModel):
    """A trial's MFU counting real (non-pad) tokens only, as recorded or, for a measurement
    recorded before sweeper counted real tokens (issue 36), derived from its padding share.
    The recorded figures themselves are never rewritten: this is read beside them."""

    model_config = ConfigDict(frozen=True)

    mfu: float  # real tokens only: the recorded MFU, or derived from it
    recorded_mfu: float  # what the trial recorded
    counts_padding: bool  # the recorded MFU counted the padded tokens' FLOPs
    derived: bool  # ``mfu`` is derived from the padding share, not measured
    upper_bound: bool = False  # derived without the model's shape: at most this
    note: str = ""  # how it was derived, for the reader

    @property
    def figure(self) -> str:
        """'7.2%', or 'at most 7.5%' where derived without the model's shape."""
        return f"{'at most ' if self.upper_bound else ''}{self.mfu:.1%}"

    @property
    def label(self) -> str:
        """'25.8%', or '7.2% (derived: the recorded 25.8% counted padding)'."""
        if not self.derived:
            return self.figure
        return f"{self.figure} (derived: the recorded {self.recorded_mfu:.1%} counted padding)"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def model_shape(space_yaml: str) -> tuple[int, int] | None:
    """(layers, hidden size) of a space's model built from a preset (``arch`` + ``size``, with
    its config overrides); None for a pretrained ``id`` (its shape is in its hub config) or a
    space this sweeper cannot read."""
    from sweeper.presets import MODEL_SIZES
    from sweeper.space import parse_space

    try:
        model = parse_space(space_yaml, "the study's space").workload.model
    except SweeperError:
        return None
    if model.arch is None or model.size is None:
        return None
    config = {**MODEL_SIZES[model.arch][model.size], **model.config}
    layers = config.get("num_hidden_layers", config.get("n_layer"))
    hidden = config.get("hidden_size", config.get("n_embd"))
    if isinstance(layers, int) and isinstance(hidden, int):
        return layers, hidden
    return None


def real_token_mfu(
    measurement: dict[str, Any] | None, shape: tuple[int, int] | None = None
) -> RealTokenMfu | None:
    """The real-token MFU of a recorded measurement (None: it recorded no MFU, e.g. a CPU).

    A measurement recorded before issue 36 has no ``mean_sample_tokens`` and its
    ``achieved_tflops`` is ``flops_per_token`` × the PADDED tokens/s: its MFU counted padding.
    Derived: MFU × real share (tokens/s ÷ padded tokens/s) × FLOPs per token at the real
    sample length ÷ at the padded row length (PaLM's 12·L·d·T attention term; ``shape`` gives
    L and d). Without ``shape`` the attention term stays at the padded length: an upper bound.

    >>> m = {"mfu": 0.3, "tokens_per_s": 250.0, "padded_tokens_per_s": 1000.0,
    ...      "flops_per_token": 1e9, "achieved_tflops": 1.0, "mean_row_tokens": 2048}
    >>> real_token_mfu(m).label
    'at most 7.5% (derived: the recorded 30.0% counted padding)'
    """
    m = measurement or {}
    recorded = _number(m.get("mfu"))
    if recorded is None:
        return None
    real, padded = _number(m.get("tokens_per_s")), _number(m.get("padded_tokens_per_s"))
    flops, achieved = _number(m.get("flops_per_token")), _number(m.get("achieved_tflops"))
    plain = RealTokenMfu(mfu=recorded, recorded_mfu=recorded, counts_padding=False, derived=False)
    if m.get("mean_sample_tokens") is not None or None in (real, padded, flops, achieved):
        return plain  # recorded with real-token accounting, or too little to tell
    assert real is not None and padded is not None and flops is not None and achieved is not None
    if not 0 < real < padded or not flops > 0:
        return plain  # no padding: both accountings agree
    on_padded = flops * padded / 1e12
    if abs(achieved - on_padded) > _ACCOUNTING_TOLERANCE * on_padded:
        return plain
    share = real / padded
    row = _number(m.get("mean_row_tokens"))
    if shape is None or row is None or m.get("packing"):
        return RealTokenMfu(
            mfu=recorded * share,
            recorded_mfu=recorded,
            counts_padding=True,
            derived=True,
            upper_bound=True,
            note=f"recorded MFU × real-token share {share:.3f}; the attention FLOPs stay at "
            "the padded row length, so the real-token MFU is at most this",
        )
    layers, hidden = shape
    # an unpacked row is one sample: its real tokens are the row's less its padding
    flops_real = flops - 12 * layers * hidden * row * (1 - share)
    return RealTokenMfu(
        mfu=recorded * share * flops_real / flops,
        recorded_mfu=recorded,
        counts_padding=True,
        derived=True,
        note=f"recorded MFU × real-token share {share:.3f} × FLOPs per token at "
        f"{row * share:,.0f} real tokens ÷ at the {row:,.0f}-token padded row "
        f"({flops_real / flops:.3f})",
    )


def padding_notes(document: StudyDocument) -> list[str]:
    """What a reader of ``document`` must know about its MFU figures: one line per trial whose
    recorded MFU counted padding, with the real-token MFU derived from its padding share
    (empty when every MFU counts real tokens only)."""
    shape = model_shape(document.study.get("space_yaml") or "")
    notes = []
    for trial in document.trials:
        accounting = real_token_mfu(trial.get("measurement"), shape)
        if accounting is not None and accounting.counts_padding:
            notes.append(
                f"trial #{trial.get('number')}: recorded MFU {accounting.recorded_mfu:.1%} "
                f"counts padding (recorded before MFU counted real tokens only); real-token "
                f"MFU {accounting.figure}, derived: {accounting.note}"
            )
    return notes


def padding_counted(store: Store, study: str, trials: Sequence[Any]) -> dict[int, RealTokenMfu]:
    """Of ``trials`` (rows with ``number``, ``mfu``, ``tokens_per_s`` and
    ``padded_tokens_per_s``: a page of the dashboard's table), those whose recorded MFU
    counted padding, by number, with the real-token MFU derived. Only a trial that padded and
    recorded an MFU can be one: only its measurement is read."""
    candidates = [
        t
        for t in trials
        if t.mfu is not None and (t.padded_tokens_per_s or 0) > (t.tokens_per_s or 0)
    ]
    if not candidates:
        return {}
    shape = model_shape(store.get_study(study).space_yaml)
    found = {}
    for trial in candidates:
        row = store.get_trial(study, trial.number)
        accounting = real_token_mfu(None if row is None else row.measurement, shape)
        if accounting is not None and accounting.counts_padding:
            found[trial.number] = accounting
    return found
