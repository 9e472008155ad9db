"""The job a sweep prices: the workload (model, tokenizer, data, adapter, checkpoints, how it
trains) as a validated, frozen config. ``sweeper.space`` holds the rest of a space file (the
machine, the search, the budget); the trial child builds the job from this.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from sweeper.knobs import Precision
from sweeper.presets import MODEL_SIZES


class Frozen(BaseModel):
    """Frozen, strict, keyword-only config: unknown keys and wrong types are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


def names_a_local_path(given: str) -> bool:
    """Whether a model or tokenizer id is written as a path of this machine, not a hub id
    (``/``, ``./``, ``../``, ``~``): the prepare step and the space's check tell them apart so."""
    return given.startswith(("/", "./", "../", "~"))


class ModelSpec(Frozen):
    """Either a Hugging Face id / local path, or an architecture built with random weights."""

    id: str | None = Field(
        default=None,
        description="hub id or local directory (save_pretrained) for from_pretrained; the "
        "tokenizer is read from the same place unless tokenizer.id says otherwise",
    )
    trust_remote_code: bool = Field(
        default=False,
        description="run the model's own Python code from its directory or hub repo (only "
        "for models that need it, and only code you trust)",
    )
    arch: Literal["llama", "phi3", "gpt2"] | None = Field(
        default=None, description="build from a transformers config with random weights"
    )
    size: str | None = Field(default=None, description="a preset of sweeper.trial.workload")
    config: dict[str, int | float | str | bool] = Field(
        default_factory=dict, description="overrides on the transformers config"
    )

    @field_validator("size")
    @classmethod
    def _known_size(cls, size: str | None, info: ValidationInfo) -> str | None:
        arch = info.data.get("arch")
        if arch is not None and size is not None and size not in MODEL_SIZES[arch]:
            raise ValueError(f"unknown size for {arch}; use one of {', '.join(MODEL_SIZES[arch])}")
        return size

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.id is None) == (self.arch is None):
            raise ValueError("set exactly one of 'id' (pretrained) or 'arch' (built from config)")
        if self.id is not None and self.size is not None:
            raise ValueError("'size' is for 'arch' (a preset); a pretrained 'id' has its own size")
        if self.arch is not None and self.size is None:
            raise ValueError(
                f"'arch: {self.arch}' needs a 'size': {', '.join(MODEL_SIZES[self.arch])}"
            )
        return self


# sweeper's one line in a user's program, as every message that asks for it writes it: the
# loader is what lets the DataLoader knobs be read back from what ran, and a block is one
# optimizer step (its micro-batches as a list, under gradient accumulation)
LOOP_LINE = (
    "`with sweeper.step(batch, model=model, optimizer=optimizer, loader=loader):` around each "
    "optimizer step of your own loop (batch: the step's micro-batches as a list when it "
    "accumulates gradients)"
)
ONE_LINE = f"callbacks=[sweeper.callback()] in Trainer(...) or SFTTrainer(...), or {LOOP_LINE}"

# the built-in ChatML template (workload.tokenizer.chat_template: chatml), with TRL's
# {% generation %} markers around the assistant's replies
CHATML = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}<|im_start|>assistant\n"
    "{% generation %}{{ message['content'] }}<|im_end|>\n{% endgeneration %}"
    "{% else %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class TokenizerSpec(Frozen):
    """A tokenizer loaded by id/path (default: the model's own, when model.id is set), or a
    byte-level BPE trained locally on the dataset (models built from ``arch``)."""

    id: str | None = Field(
        default=None,
        description="hub id or local directory for AutoTokenizer (default: model.id)",
    )
    vocab_size: int = Field(
        default=8192, ge=256, le=262144, description="the BPE trained here (no id)"
    )
    chat_template: str | None = Field(
        default=None,
        description="a Jinja chat template for dataset.messages_field, when the tokenizer has "
        "none or you train with another; 'chatml' names the built-in ChatML template",
    )


class GeneratedCorpus(Frozen):
    """A demo corpus cut from this Python's own stdlib sources, lengths drawn log-normally."""

    samples: int = Field(ge=16)
    median_chars: int = Field(default=1200, ge=16)
    sigma: float = Field(default=0.8, ge=0, le=3, description="log-normal spread of lengths")
    max_chars: int | None = Field(
        default=None, ge=16, description="clip samples to this length (a dataset's own cap)"
    )
    seed: int = 0


class DatasetSpec(Frozen):
    """Where the training text comes from: plain text (``text_field``) or chat/instruction
    records (``messages_field``: a list of ``{role, content}`` per row, rendered with the
    tokenizer's chat template)."""

    path: str | None = Field(
        default=None,
        description="a local .jsonl/.json/.parquet/.csv/.txt file, or a directory written by "
        "datasets' save_to_disk",
    )
    split: str = Field(
        default="train", description="the split of a save_to_disk directory that holds several"
    )
    generate: GeneratedCorpus | None = None
    text_field: str = Field(default="text", description="the column of plain text")
    messages_field: str | None = Field(
        default=None,
        description="the column of chat records (a list of {role, content} per row); rendered "
        "with the tokenizer's chat template",
    )
    loss: Literal["all", "completion"] = Field(
        default="all",
        description="all: every token is a label; completion: only the assistant's replies "
        "(messages_field), as TRL's assistant_only_loss",
    )

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        if (self.path is None) == (self.generate is None):
            raise ValueError("set exactly one of 'path' (a local file) or 'generate' (demo corpus)")
        # (not model_fields_set: a request's round trip through JSON sets every field)
        if self.messages_field is not None and self.text_field != "text":
            raise ValueError(
                "set one of 'text_field' (plain text) or 'messages_field' (chat records)"
            )
        if self.messages_field is not None and self.generate is not None:
            raise ValueError("'messages_field' needs a 'path'; the generated corpus is plain text")
        if self.loss == "completion" and self.messages_field is None:
            raise ValueError(
                "loss: completion needs chat records (messages_field) to tell the replies "
                "from the prompts; plain text trains on every token (loss: all)"
            )
        return self


class CheckpointSpec(Frozen):
    """How often the real run saves a checkpoint; each trial times one real save."""

    save_steps: int | None = Field(
        default=500,
        gt=0,
        description="optimizer steps between saves (TrainingArguments' default is 500); "
        "null: the run saves no checkpoint",
    )
    save_optimizer: bool = Field(
        default=True, description="save the optimizer state too, as Trainer does (≈3× weights)"
    )
    dir: str | None = Field(
        default=None,
        description="where the trial times its save; put it on the disk the run saves to "
        "(default: the sweep's cache directory)",
    )


class AdapterSpec(Frozen):
    """LoRA through peft: only the adapter trains, the base weights stay frozen (and may be
    quantized: the ``quantization`` knob)."""

    kind: Literal["lora"] = "lora"
    r: int = Field(default=16, gt=0, le=1024, description="the adapter's rank")
    alpha: int = Field(default=32, gt=0, description="LoRA's scaling numerator (lora_alpha)")
    dropout: float = Field(default=0.05, ge=0, lt=1, description="lora_dropout")
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="module names to adapt (e.g. [q_proj, v_proj]), or all-linear",
    )


def _flow(words: list[str]) -> str:
    """``words`` as a YAML flow list that reads back as the same strings (a word YAML would
    read as a number, a bool or null, or that holds YAML's punctuation, quoted).

    >>> _flow(["python", "train.py", "--steps", "100", "--name", "a b", "--flag", "true"])
    '[python, train.py, --steps, "100", --name, "a b", --flag, "true"]'
    """
    import json

    import yaml

    def plain(word: str) -> bool:
        try:
            return yaml.safe_load(f"[{word}]") == [word]
        except yaml.YAMLError:
            return False

    return "[" + ", ".join(w if plain(w) and " " not in w else json.dumps(w) for w in words) + "]"


class ScriptSpec(Frozen):
    """Your own training program as the trial (``engine: script``). It runs in the trial's
    process group with the trial's timeout, devices and cache, and one line in it feeds
    sweeper's recorder: ``callbacks=[sweeper.callback()]`` in ``Trainer(...)``/``SFTTrainer``,
    or ``with sweeper.step(batch, model=model, optimizer=optimizer, loader=loader):`` around
    each optimizer step of your own loop (``LOOP_LINE``). Outside a trial that line does nothing."""

    command: list[str] = Field(
        min_length=1,
        description="the command, as a list of words: [python, train.py, --model_name, ./m] "
        "(or an accelerate launch / torchrun line)",
    )
    knobs: Literal["flags", "sft_flags", "env"] = Field(
        default="flags",
        description="flags: the knobs are appended as TrainingArguments command-line flags "
        "(HfArgumentParser's --per_device_train_batch_size 8), but on an accelerate launch "
        "line precision, compile_mode and data_parallel are its launch options instead "
        "(--mixed_precision ...); sft_flags: SFTConfig's too, all of them as flags "
        "(--max_length, --packing: TRL's scripts); env: only the environment "
        "(SWEEPER_TRIAL_CONFIG, JSON; sweeper.trial_config() reads it). The config is in the "
        "environment either way, for the knobs that are not TrainingArguments",
    )
    cwd: str | None = Field(
        default=None,
        description="the directory the command runs in (default: where sweeper was started)",
    )

    @field_validator("command", mode="before")
    @classmethod
    def _words(cls, command: Any) -> Any:
        """A command written as one string (``command: python train.py --bf16 True``) is
        refused with the list it should be, split as a shell would: sweeper appends each
        trial's flags as words, and never runs a shell."""
        if isinstance(command, str):
            import shlex

            try:
                words = shlex.split(command)
            except ValueError:
                words = command.split()
            raise ValueError(
                f"give the command as a list of words, not one string: command: {_flow(words)}"
            )
        if isinstance(command, list):  # YAML reads 100, 1.5, True and null as no string
            for index, word in enumerate(command):
                if isinstance(word, bool | int | float) or word is None:
                    said = "null" if word is None else str(word)
                    what = (
                        "null"
                        if word is None
                        else "a boolean"
                        if word is True or word is False
                        else "a number"
                    )
                    raise ValueError(
                        f"word [{index}] is {said}, which YAML reads as {what}, not a string; "
                        f'quote it: "{said}"'
                    )
        return command


class Workload(Frozen):
    """The real training job the sweep is pricing."""

    model: ModelSpec
    adapter: AdapterSpec | None = Field(
        default=None, description="train a LoRA adapter instead of every weight (peft)"
    )
    tokenizer: TokenizerSpec = TokenizerSpec()
    dataset: DatasetSpec
    precision: Precision | None = Field(
        default=None,
        description="the run's precision, when it is not searched (the same as search.precision "
        "with one item)",
    )
    tf32: bool | None = Field(
        default=None, description="TF32 matmuls on CUDA, when not searched (search.tf32)"
    )
    padding: Literal["max_length", "longest"] = "max_length"
    engine: Literal["loop", "trainer", "sft", "script"] = Field(
        default="loop",
        description="what trains each trial, as the real run does: loop (a plain PyTorch "
        "AMP loop), trainer (transformers.Trainer), sft (TRL's SFTTrainer), script (your own "
        "training program: workload.script)",
    )
    script: ScriptSpec | None = Field(
        default=None, description="engine: script: your command and how the knobs reach it"
    )
    logging_steps: int = Field(
        default=500,
        gt=0,
        description="trainer/sft: the run's logging interval (each log reads the loss back "
        "from the device); TrainingArguments' default is 500",
    )
    tokenize: Literal["on_the_fly", "pretokenized"] = Field(
        default="on_the_fly",
        description="on_the_fly: DataLoader workers tokenize (num_workers matters); "
        "pretokenized: the prepare step tokenizes once and trials read token ids",
    )
    learning_rate: float = Field(
        default=1e-4,
        gt=0,
        description="your run's peak learning rate: every trial trains with it, and the "
        "exports say it (scaled where the winner's effective batch differs from the baseline's)",
    )
    samples: int = Field(gt=0, description="training samples per epoch of the real job")
    epochs: float = Field(gt=0, description="epochs of the real job")
    checkpoint: CheckpointSpec = CheckpointSpec()
    coverage_percentile: float = Field(
        default=100,
        gt=0,
        le=100,
        description="a max_seq_length shorter than this percentile of the samples' token "
        "lengths truncates, and is never recommended silently (100: the longest sample)",
    )
    headline: Literal["samples", "tokens"] = Field(
        default="samples",
        description="the throughput the CLI and dashboard lead with: samples/s, or tokens/s "
        "for a job counted in tokens (packed pre-training); the ranking is $/run either way",
    )

    @model_validator(mode="after")
    def _script_with_its_engine(self) -> Workload:
        if self.engine == "script" and self.script is None:
            raise ValueError(
                "engine: script needs workload.script.command, the command that trains "
                "(e.g. script: {command: [python, train.py]})"
            )
        if self.script is not None and self.engine != "script":
            raise ValueError(
                f"workload.script is for engine: script (this workload's engine is "
                f"{self.engine}); set engine: script, or remove script"
            )
        return self
