"""``sweeper init``: the minimal space for your own fine-tune, written from a few answers.

Only what sweeper cannot know is asked: the model, the data, the engine that trains it, the
machine's name and price, and the size of the real job. Everything else is defaulted — the
sequence lengths come from the data (``max_seq_length: auto``), a few batch sizes are
searched, the budget is 12 trials — and the file says so, so it can be edited later.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import yaml

from sweeper.errors import SpaceError, json_line_error
from sweeper.job import ONE_LINE
from sweeper.space import parse_space

ENGINES = ("sft", "trainer", "loop")

# the user's own script: its command (``init --command``), and the line in it, which init
# cannot write for them
OWN_SCRIPT = (
    "--engine script needs your run's own command: --command 'python train.py --model_name_or_path "
    "... --output_dir out' (an accelerate launch or torchrun line works too), and --knobs flags "
    "(a TrainingArguments script: HfArgumentParser; the default), sft_flags (TRL's SFTConfig) "
    "or env (your script reads sweeper.trial_config()). README: 'Your own training script as "
    "the trial'; examples/trainer/space.yaml and examples/amp_loop/space.yaml are both, "
    "ready to copy"
)
# sweeper's one line, as the sweep needs it in the user's script
SCRIPT_LINE = f"add sweeper's one line to your script: {ONE_LINE}"


def line_said(command: list[str]) -> str:
    """What init says of sweeper's line for ``command`` (run here): that its Python files
    already call the recorder, or how to add it (a walk's train.py had the line, and init
    told it to add it)."""
    from sweeper.preflight_script import names_the_hook

    programs = [Path(w) for w in command if w.endswith(".py") and Path(w).is_file()]
    if programs and all(names_the_hook(p) for p in programs):
        return f"{', '.join(map(str, programs))} already calls sweeper's recorder"
    return SCRIPT_LINE


def data_shape(path: Path) -> tuple[str, str, int | None]:
    """(``text_field`` or ``messages_field``, the column, the number of records) of a .jsonl,
    .json or .parquet file, read from its records: a ``messages`` list of ``{role, content}``
    makes chat data. Every record is checked as the prepare step will read it (one JSON object
    per line, the first record's column in each, a chat a non-empty list of ``{role: str,
    content: str}``), so a bad record is named here, by its 1-based line (or record, or row),
    before a space is written. Other formats: plain ``text``, count unknown."""
    suffix = path.suffix.lower()  # train.v2.jsonl is a .jsonl file
    if suffix == ".jsonl":
        records = _jsonl_records(path)
    elif suffix == ".json":
        records = _json_records(path)
    elif suffix == ".parquet":
        records = _parquet_records(path)
    else:
        return "text_field", "text", None
    kind, column, rows = "text_field", "text", 0
    for where, record in records:
        rows += 1
        if rows == 1:
            kind, column = _shape_of(record, where)
        _check_record(record, kind, column, where)
    if rows == 0:
        raise SpaceError(f"{path}: holds no records")
    return kind, column, rows


def _jsonl_records(
    path: Path, errors: list[str] | None = None
) -> Iterator[tuple[str, dict[str, object]]]:
    """The records of a .jsonl file with where each is; a line that is no JSON object raises,
    or with ``errors`` is told there and skipped."""
    with path.open("rb") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                said = (
                    f"{path}:{number}: not a JSON object ({json_line_error(line, e)}); each "
                    ".jsonl line holds one JSON object: fix or drop that line"
                )
            else:
                if isinstance(record, dict):
                    yield f"{path}:{number}", record
                    continue
                said = (
                    f"{path}:{number}: not a JSON object (a {type(record).__name__}, not an "
                    "object); each .jsonl line holds one JSON object: fix or drop that line"
                )
            if errors is None:
                raise SpaceError(said)
            errors.append(said)


def bad_records(path: Path, kind: str, column: str, most: int = 5) -> list[str]:
    """Up to ``most`` records of a local data file that the sweep's prepare step would refuse,
    each with its 1-based line (record, row) and the fix, read as ``data_shape`` reads them:
    ``launch`` says them at once (the prepare step stops at the first, half a minute in).
    A .json or .parquet file stops at its first bad record."""
    problems: list[str] = []
    suffix = path.suffix.lower()
    try:
        if suffix == ".jsonl":
            records = _jsonl_records(path, problems)
        elif suffix == ".json":
            records = _json_records(path)
        elif suffix == ".parquet":
            records = _parquet_records(path)
        else:
            return []
        for where, record in records:
            try:
                _check_record(record, kind, column, where)
            except SpaceError as e:
                problems.append(str(e))
            if len(problems) >= most:
                break
    except SpaceError as e:
        problems.append(str(e))
    return problems[:most]


def _json_records(path: Path) -> Iterator[tuple[str, dict[str, object]]]:
    """A .json file as datasets reads it: a list of objects, or one object per line."""
    try:
        document = json.loads(path.read_bytes())
    except ValueError:
        yield from _jsonl_records(path)  # JSON lines under a .json name
        return
    if not isinstance(document, list):
        raise SpaceError(
            f"{path}: a JSON {type(document).__name__}, not a list of records; write the "
            "records as a JSON list, or one JSON object per line (.jsonl)"
        )
    for number, record in enumerate(document, start=1):
        if not isinstance(record, dict):
            raise SpaceError(
                f"{path}: record {number} is not a JSON object (a {type(record).__name__}); "
                "fix or drop that record"
            )
        yield f"{path}: record {number}", record


def _parquet_records(path: Path) -> Iterator[tuple[str, dict[str, object]]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # datasets brings it; an install without the training stack has none
        raise SpaceError(
            f"{path}: reading Parquet needs pyarrow, which this python ({sys.executable}) "
            "does not have; install sweeper with its dependencies here (datasets brings "
            "pyarrow), or give the data as JSONL"
        ) from None

    try:
        table = pq.ParquetFile(path)
    except Exception as e:  # pyarrow's ArrowInvalid and OSError: not a parquet file
        raise SpaceError(f"{path}: cannot read it as Parquet: {e}") from None
    number = 0
    for batch in table.iter_batches():
        for record in batch.to_pylist():
            number += 1
            yield f"{path}: row {number}", record


def _shape_of(record: dict[str, object], where: str) -> tuple[str, str]:
    chats = [k for k, v in record.items() if isinstance(v, list) and v and _is_chat(v)]
    if chats:
        return "messages_field", chats[0]
    if "text" in record:
        return "text_field", "text"
    texts = [k for k, v in record.items() if isinstance(v, str)]
    if not texts:
        raise SpaceError(
            f"{where}: no text column and no chat records (a list of {{role, content}}); each "
            "line needs one"
        )
    return "text_field", texts[0]


def _check_record(record: dict[str, object], kind: str, column: str, where: str) -> None:
    """A record as the prepare step reads it: the first record's column, of its kind."""
    value = record.get(column)
    if kind == "text_field":
        if not isinstance(value, str):
            raise SpaceError(
                f"{where}: {column!r} is {_what(value)}, not text (the file's first record has "
                f"text there); fix or drop that line"
            )
        return
    if not isinstance(value, list) or not value:
        raise SpaceError(
            f"{where}: {column!r} is {_what(value)}, not a non-empty list of {{role, content}} "
            "messages (the file's first record is a chat); fix or drop that line"
        )
    for place, message in enumerate(value, start=1):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            raise SpaceError(
                f"{where}: message {place} of {column!r} is not {{role: str, content: str}}: "
                f"{json.dumps(message)[:80]}; fix or drop that line"
            )
        role = message["role"]
        # a misspelt role renders as a turn of its own (ChatML) or fails the template, and a
        # reply under it is not learnt; other roles (Gemma's "model") are the template's
        near = difflib.get_close_matches(role, ROLES, n=1, cutoff=0.75)
        if role not in ROLES and near:
            raise SpaceError(
                f"{where}: message {place} has role {role!r}; did you mean {near[0]!r}? "
                "(fix that line)"
            )


# the roles chat templates know by these names
ROLES = ("system", "user", "assistant", "tool", "developer", "function", "ipython")


def _what(value: object) -> str:
    if value is None:
        return "missing"
    return f"{type(value).__name__} {json.dumps(value)[:40]}"


def study_name(out: Path) -> str:
    """The study a space file at ``out`` names: its file name, as a study name may be.

    >>> study_name(Path("spaces/my fine-tune.yaml"))
    'my-fine-tune'
    """
    return re.sub(r"[^A-Za-z0-9._-]", "-", out.stem).strip("-._")[:100] or "mine"


def _is_chat(messages: list[object]) -> bool:
    return all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in messages)


def model_reference(model: str) -> str:
    """``--model`` as the space will name it: a local directory resolved to its absolute path
    (it must hold the config.json save_pretrained writes), anything else a hub id. A path that
    is not there (it starts with /, ./, ../ or ~) is refused here, not at the sweep's prepare
    step.

    >>> model_reference("meta-llama/Llama-3.2-1B")
    'meta-llama/Llama-3.2-1B'
    >>> model_reference("/no/such/model")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    sweeper.errors.SpaceError: --model /no/such/model: no such directory on this machine; ...
    """
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SpaceError(
                f"--model {model}: {path.resolve()} has no config.json, so it is not a directory "
                "save_pretrained wrote; give the directory that holds the model's config.json "
                "and weights"
            )
        return str(path.resolve())
    if path.exists():
        raise SpaceError(
            f"--model {model}: a file, not a model directory; give the directory save_pretrained "
            "wrote (the one holding config.json), or a hub id (org/name)"
        )
    if model.startswith(("/", "./", "../", "~")):
        raise SpaceError(
            f"--model {model}: no such directory on this machine; give the directory "
            "save_pretrained wrote (check the path's spelling), or a hub id (org/name)"
        )
    # org/name reads as a hub id, unless "org" is a directory here: then it is a path that is
    # not there (job/modle beside job/model), which offline would fail only at the sweep
    beside = path.parent != Path(".") and path.parent.is_dir()
    if beside:
        siblings = [p.name for p in path.parent.iterdir() if p.is_dir()]
        near = difflib.get_close_matches(path.name, siblings, n=1)
        hint = f" (did you mean {path.parent / near[0]}?)" if near else ""
        raise SpaceError(
            f"--model {model}: no such directory{hint}; {path.parent} is a directory here, so "
            "this reads as a path, not a hub id. Give the directory save_pretrained wrote, or "
            "a hub id (org/name)"
        )
    if model.count("/") > 1:
        raise SpaceError(
            f"--model {model}: no such directory on this machine, and a hub id has one slash "
            "(org/name); give the directory save_pretrained wrote, or a hub id"
        )
    return model


def _check_chat_template(model: str, directory: Path, data: Path) -> None:
    """Chat records need the tokenizer's chat template: a model directory whose tokenizer has
    none (no chat_template.jinja, none in tokenizer_config.json) is refused here, where the
    sweep's prepare step would stop on it after init had written the space."""
    if (directory / "chat_template.jinja").is_file() or (
        directory / "chat_template.json"
    ).is_file():
        return
    if (directory / "additional_chat_templates").is_dir():
        return
    config = directory / "tokenizer_config.json"
    try:
        named = json.loads(config.read_text()).get("chat_template") if config.is_file() else None
    except (OSError, ValueError, AttributeError):
        return  # the prepare step names a broken tokenizer config with transformers' words
    if named:
        return
    raise SpaceError(
        f"--model {model}: its tokenizer has no chat template ({directory} holds no "
        f"chat_template.jinja and its tokenizer_config.json names none), and {data} holds chat "
        "records, which are rendered with it; save the template your run uses with the "
        "tokenizer (tokenizer.chat_template = ...; tokenizer.save_pretrained(DIR)), or write the "
        "space by hand with workload.tokenizer.chat_template ('chatml' for ChatML)"
    )


def minimal_space(
    *,
    study: str,
    model: str,
    data: Path,
    engine: str,
    hardware: str,
    usd_per_hour: float,
    samples: int | None = None,
    epochs: float = 1.0,
    device: str = "auto",
    command: Sequence[str] = (),
    knobs: str = "flags",
    lora: bool = False,
    quantization: str = "none",
) -> str:
    """The text of the minimal space (validated before it is returned); ``engine`` script:
    the user's ``command`` and how the knobs reach it (``knobs``); ``lora``: a LoRA adapter
    (``workload.adapter``, peft's usual settings) on a base loaded as ``quantization`` says
    (none, 4bit: QLoRA's NF4, 8bit)."""
    _check_adapter(engine, lora, quantization)
    kind, column, rows = data_shape(data)
    samples = samples or rows
    if not samples:
        raise SpaceError(
            f"{data}: cannot count its records; say how many samples one epoch of the real job "
            "has with --samples"
        )
    model_id = model_reference(model)
    if kind == "messages_field" and Path(model_id).is_dir():
        _check_chat_template(model, Path(model_id), data)
    field = f"      {kind}: {column}\n" if (kind, column) != ("text_field", "text") else ""
    if kind == "messages_field":
        # written out: which tokens are labels changes what a step computes, and a user who
        # trains on the replies only must see the choice, not find "all" in best --json
        field += (
            "      loss: all     # every token is a label (TRL's default); completion: the "
            "replies only (assistant_only_loss)\n"
        )
    text = (
        "# Your own fine-tune, written by `sweeper init`. Everything not here has a default\n"
        '# (README: "Your own fine-tune"): max_seq_length is read off the data, batch sizes\n'
        "# 4, 8 and 16 are searched (3 trials; n_trials caps a larger search). Add knobs to\n"
        "# a search: section to search more.\n"
        f"study: {study}\n"
        "hardware:\n"
        f"  name: {_scalar(hardware)}          # the machine the real job rents\n"
        f"  usd_per_hour: {usd_per_hour:g}\n"
        + (f"  device: {device}\n" if device != "auto" else "")
        + "workload:\n"
        f"  model: {{id: {_scalar(model_id)}}}    # a save_pretrained directory or a hub id\n"
        "  dataset:\n"
        f"    path: {_scalar(str(data.expanduser().resolve()))}\n"
        + field.replace("      ", "    ")
        + (_adapter_lines() if lora else "")
        + (_script_lines(command, knobs) if engine == "script" else _engine_lines(engine))
        + f"  samples: {samples}              # samples in one epoch of the real job\n"
        f"  epochs: {epochs:g}\n"
        + (_quantization_lines(quantization) if quantization != "none" else "")
        + "budget:\n"
        "  n_trials: 12\n"
    )
    parse_space(text, source="the space sweeper init writes")  # never write a broken file
    return text


QUANTIZATIONS = ("none", "4bit", "8bit")


def _check_adapter(engine: str, lora: bool, quantization: str) -> None:
    """``--lora`` and ``--quantization`` as a space can hold them: an adapter on sweeper's own
    engines (a script builds its own model), quantized weights only under an adapter."""
    if quantization not in QUANTIZATIONS:
        raise SpaceError(f"--quantization {quantization}: use none, 4bit or 8bit")
    if quantization != "none" and not lora:
        raise SpaceError(
            f"--quantization {quantization}: quantized base weights cannot be trained "
            "directly, only a LoRA adapter on them (QLoRA); add --lora"
        )
    if lora and engine == "script":
        raise SpaceError(
            "--lora: with --engine script your program builds its own model and adapter (its "
            "LoraConfig and get_peft_model run as they are, each trial); sweeper's adapter is "
            "for the engines it builds the run with (sft, trainer, loop): leave --lora out"
        )


def _adapter_lines() -> str:
    """``workload.adapter`` at peft's usual (Q)LoRA settings, said to be edited to the run's."""
    return (
        "  adapter:                      # LoRA through peft (init --lora): only the adapter\n"
        "    r: 16                       #   trains, the base stays frozen. peft's usual\n"
        "    alpha: 32                   #   settings: set your run's LoraConfig (r,\n"
        "    dropout: 0.05               #   lora_alpha, lora_dropout, target_modules: a list\n"
        "    target_modules: all-linear  #   such as [q_proj, v_proj], or all-linear)\n"
    )


def _quantization_lines(quantization: str) -> str:
    """The base's quantization as a one-item search list (it changes the model's outputs, so
    the run's own is kept, not searched)."""
    how = "NF4 (QLoRA)" if quantization == "4bit" else "int8"
    return (
        "search:\n"
        f"  quantization: [{quantization}]         # the frozen base loaded in {how} through\n"
        "  #   bitsandbytes (CUDA), as your run loads it; [none, "
        f"{quantization}] also measures it unquantized\n"
    )


def _engine_lines(engine: str) -> str:
    return (
        f"  engine: {engine}                 # sweeper builds the run: sft (TRL's SFTTrainer),\n"
        "  #   trainer (transformers' Trainer) or loop (a plain PyTorch loop); to sweep your\n"
        "  #   own train.py instead: engine: script (README: 'Your own training script as\n"
        "  #   the trial')\n"
    )


def _script_lines(command: Sequence[str], knobs: str) -> str:
    """The space's engine: script, its command as a list of words, and its knobs form."""
    words = ", ".join(_scalar(word) for word in command)
    return (
        "  engine: script                # your own program is the trial (README: 'Your own\n"
        "  #   training script as the trial'); it needs sweeper's one line\n"
        "  script:\n"
        f"    command: [{words}]\n"
        f"    cwd: {_scalar(str(Path.cwd()))}   # where it runs, wherever sweeper is launched\n"
        f"    knobs: {knobs}             # flags: TrainingArguments flags appended; sft_flags:\n"
        "    #   SFTConfig's too; env: none (your script reads sweeper.trial_config())\n"
    )


def _scalar(value: str) -> str:
    """``value`` as a YAML scalar (quoted when plain YAML would read it as something else)."""
    plain = re.fullmatch(r"[A-Za-z0-9_./@+-][A-Za-z0-9_./@+ -]*", value) is not None
    if plain and yaml.safe_load(value) == value:
        return value
    return json.dumps(value)
