"""Build what one trial trains: tokenizer, dataset, DataLoader with the trial's knobs, model."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from sweeper import knobs
from sweeper.errors import TrialError
from sweeper.job import AdapterSpec, Workload
from sweeper.presets import MODEL_SIZES
from sweeper.space import TrialConfig
from sweeper.trial.corpus import encode, open_dataset, open_tokenizer
from sweeper.trial.lifeline import dataloader_worker_init
from sweeper.trial.protocol import PreparedData

# fp8: the converted Linear layers compute in float8 (torchao), the rest under bf16 autocast
_AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.bfloat16}


def mixed_precision(device: torch.device, precision: str) -> Callable[[], AbstractContextManager]:
    """A factory of the context each forward pass runs in: autocast for bf16/fp16 (weights
    stay fp32, as with Trainer's bf16=True) and around fp8's float8 layers, nothing for fp32."""
    dtype = _AUTOCAST_DTYPES.get(precision)
    if dtype is None:
        return contextlib.nullcontext
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def resolve_device(requested: str) -> torch.device:
    if requested == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if requested == "cuda":
        raise TrialError(
            "unsupported", "cuda requested but torch.cuda.is_available() is False on this machine"
        )
    return torch.device("cpu")


def cuda_index(device: torch.device) -> int | None:
    """The CUDA device index ``device`` names (the current one when it names none); None off
    CUDA: what ``HostWatch`` watches beside the host."""
    if device.type != "cuda":
        return None
    return torch.cuda.current_device() if device.index is None else device.index


# A sample: its token ids, with which of them are labels (None: all of them; loss: completion
# marks the replies). A plain list of ids is a sample whose every token is a label.
Sample = tuple[list[int], list[bool] | None]


def _parts(row: Sample | list[int]) -> Sample:
    return (row, None) if isinstance(row, list) else row


class PretokenizedDataset(Dataset):
    """Reads token ids saved by the prepare step: the loader only slices and pads."""

    def __init__(self, tokenized: Any, tokenizer: Any, max_length: int | None) -> None:
        self.rows = tokenized
        self.suffix = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        self.keep = None if max_length is None else max_length - len(self.suffix)
        self.masked = "label_mask" in tokenized.column_names

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Sample:
        row = self.rows[index]
        ids = list(row["input_ids"][: self.keep]) + self.suffix
        if not self.masked:
            return ids, None
        return ids, list(row["label_mask"][: self.keep]) + [True] * len(self.suffix)


class TokenizingDataset(Dataset):
    """Tokenizes each text when it is fetched, so DataLoader workers do real work in parallel."""

    def __init__(
        self, hf_dataset: Any, text_field: str, tokenizer: Any, max_length: int | None
    ) -> None:
        self.rows = hf_dataset
        self.text_field = text_field
        self.tokenizer = tokenizer
        self.max_length = max_length
        # an EOS closes each sample, as a causal-LM fine-tune sees it; some tokenizers have none
        self.suffix = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        self.masked = "completion_spans" in hf_dataset.column_names

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Sample:
        row = self.rows[index]
        cut = {}
        if self.max_length is not None:  # else packing: the whole sample
            cut = {"truncation": True, "max_length": self.max_length - len(self.suffix)}
        spans = [row["completion_spans"]] if self.masked else None
        (ids,), masks = encode(self.tokenizer, [row[self.text_field]], spans, **cut)
        if masks is None:
            return ids + self.suffix, None
        return ids + self.suffix, masks[0] + [True] * len(self.suffix)


class PackedStream(IterableDataset):
    """Samples (each closed by EOS) concatenated and cut into ``block`` tokens: no padding, and
    a long sample continues in the next block instead of being truncated.

    Each DataLoader worker reads its own share of one shuffled order, so workers still do the
    tokenizing in parallel. Blocks attend across sample boundaries, as ``group_texts`` in the
    transformers examples and TRL's ConstantLengthDataset do.
    """

    def __init__(self, samples: Dataset, block: int, seed: int = 0) -> None:
        self.samples = samples  # a map-style dataset of token id lists, untruncated
        self.block = block
        self.seed = seed
        # (rank, ranks) of a multi-device trial: each rank packs its own share of the order
        self.shard = (0, 1)

    def __iter__(self) -> Iterator[Sample | list[int]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        rank, ranks = self.shard
        worker, workers = rank * workers + worker, ranks * workers
        epoch = 0
        while True:  # the trial decides when to stop; the real run counts epochs itself
            order = torch.randperm(
                len(self.samples),  # type: ignore[arg-type]
                generator=torch.Generator().manual_seed(self.seed + epoch),
            ).tolist()
            buffer: list[int] = []
            labels: list[bool] = []  # kept only for masked samples (a dataset masks all or none)
            for index in order[worker::workers]:
                ids, mask = _parts(self.samples[index])
                buffer.extend(ids)
                if mask is not None:
                    labels.extend(mask)
                while len(buffer) >= self.block:
                    if mask is None:
                        yield buffer[: self.block]
                    else:
                        yield buffer[: self.block], labels[: self.block]
                        del labels[: self.block]
                    del buffer[: self.block]
            epoch += 1


@dataclass(frozen=True)
class Collator:
    """Pads a batch to max_length (fixed shapes) or to its longest row; pads are not labels."""

    pad_id: int
    max_length: int
    pad_to_max: bool

    def __call__(self, rows: list[Sample | list[int]]) -> dict[str, torch.Tensor]:
        samples = [_parts(row) for row in rows]
        width = self.max_length if self.pad_to_max else max(len(ids) for ids, _ in samples)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (ids, _) in enumerate(samples):
            input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[i, : len(ids)] = 1
        labels = input_ids.masked_fill(attention_mask == 0, -100)
        for i, (_, mask) in enumerate(samples):
            if mask is not None:  # loss: completion: prompts are not labels either
                labels[i, : len(mask)].masked_fill_(~torch.tensor(mask), -100)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@functools.cache
def _cached_tokenizer(path: str, trust_remote_code: bool, chat_template: str | None) -> Any:
    tokenizer = open_tokenizer(path, trust_remote_code)
    if chat_template is not None:
        tokenizer.chat_template = chat_template  # what the records were rendered with
    return tokenizer


def load_tokenizer(prepared: PreparedData) -> Any:
    """The sweep's tokenizer; cached per process, so a fork server loads it once for all."""
    return _cached_tokenizer(
        prepared.tokenizer_path, prepared.trust_remote_code, prepared.chat_template
    )


def open_rows(prepared: PreparedData, cache_dir: Path) -> Any:
    """The prepared dataset's rows (chat records already rendered to text)."""
    return open_dataset(
        prepared.dataset_path, prepared.dataset_format, cache_dir, prepared.dataset_split
    )


@functools.cache
def load_pretokenized(path: str) -> Any:
    from datasets import load_from_disk

    return load_from_disk(path)


def preload(workload: Workload, prepared: PreparedData, cache_dir: Path) -> None:
    """Load what every trial of the sweep shares, before the fork server forks.

    Only files, Arrow maps and Python modules: no tensor op (so no OpenMP pool) and no CUDA
    call, which must never happen before a fork.
    """
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(prepared)
    if prepared.pretokenized_path is not None:
        load_pretokenized(prepared.pretokenized_path)
    else:
        open_rows(prepared, cache_dir)
    if workload.model.arch is not None and importlib.util.find_spec("torchao") is None:
        # transformers' model code imports torchao whenever it is installed, and torchao asks
        # the GPU at import (has_triton -> torch.cuda.current_device), which opens CUDA here and
        # would leave the fork server unable to fork (ForkServer.unfit): with torchao each
        # child imports the model code itself (a second or two of its start-up, recorded)
        config = model_config(workload, tokenizer, 128)
        AutoModelForCausalLM._model_mapping[type(config)]  # imports the modeling module


def build_training_dataset(
    workload: Workload,
    prepared: PreparedData,
    config: TrialConfig,
    tokenizer: Any,
    cache_dir: Path,
) -> Dataset:
    """Token id lists, tokenized as they are read (or read pretokenized), cut at
    max_seq_length — or whole and packed into max_seq_length blocks."""
    dataset: Dataset
    # packing reads whole samples; otherwise each is cut to max_seq_length as it is read
    keep = None if config.packing else config.max_seq_length
    if prepared.pretokenized_path is not None:
        dataset = PretokenizedDataset(
            load_pretokenized(prepared.pretokenized_path), tokenizer, keep
        )
    else:
        dataset = TokenizingDataset(
            open_rows(prepared, cache_dir), prepared.text_field, tokenizer, keep
        )
    if config.packing:
        dataset = PackedStream(dataset, config.max_seq_length)
    return dataset


class Flattening:
    """Padding-free batches: transformers' ``DataCollatorWithFlattening`` (each batch's samples
    end to end in one row, position ids restarting per sample, no attention mask, the first
    label of each sample -100) fed sweeper's samples; a reply-only loss keeps its masks."""

    def __init__(self) -> None:
        from transformers import DataCollatorWithFlattening

        self.inner = DataCollatorWithFlattening(return_position_ids=True, separator_id=-100)

    def __call__(self, rows: list[Sample | list[int]]) -> dict[str, torch.Tensor]:
        features = []
        for ids, mask in (_parts(row) for row in rows):
            labels = ids
            if mask is not None:
                labels = [t if keep else -100 for t, keep in zip(ids, mask, strict=True)]
            features.append({"input_ids": ids, "labels": labels})
        return self.inner(features, return_tensors="pt")


def make_collator(workload: Workload, config: TrialConfig, tokenizer: Any) -> Any:
    if config.padding_free:
        return Flattening()
    return Collator(
        pad_id=tokenizer.pad_token_id,
        max_length=config.max_seq_length,
        pad_to_max=workload.padding == "max_length",
    )


def build_loader(
    workload: Workload,
    prepared: PreparedData,
    config: TrialConfig,
    tokenizer: Any,
    device: torch.device,
    cache_dir: Path,
    shard: tuple[int, int] | None = None,
) -> DataLoader:
    """The DataLoader of the plain loop: every DataLoader knob of the config applied. With
    ``shard`` (rank, ranks) it reads that rank's share of the data: a DistributedSampler, as
    a torchrun launch of a plain loop does (a packed stream packs its share itself)."""
    dataset = build_training_dataset(workload, prepared, config, tokenizer, cache_dir)
    workers = config.num_workers
    sampler: Any = None
    if shard is not None and isinstance(dataset, PackedStream):
        dataset.shard = shard
    elif shard is not None:
        from torch.utils.data.distributed import DistributedSampler

        rank, ranks = shard
        sampler = DistributedSampler(
            dataset, num_replicas=ranks, rank=rank, shuffle=True, seed=0, drop_last=True
        )
    return DataLoader(
        dataset,
        **knobs.dataloader_arguments(config.model_dump()),
        # the packed stream shuffles its own samples; a sampler shuffles its share
        shuffle=not config.packing and sampler is None,
        sampler=sampler,
        drop_last=True,
        collate_fn=make_collator(workload, config, tokenizer),
        generator=None
        if config.packing or sampler is not None
        else torch.Generator().manual_seed(0),
        worker_init_fn=dataloader_worker_init if workers > 0 else None,
    )


def model_config(workload: Workload, tokenizer: Any, max_seq_length: int) -> Any:
    """The transformers config of a model built from an architecture and size preset."""
    from transformers import AutoConfig

    spec = workload.model
    assert spec.arch is not None and spec.size is not None
    overrides: dict[str, Any] = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        **MODEL_SIZES[spec.arch][spec.size],
    }
    if spec.arch == "gpt2":
        overrides["n_positions"] = max(1024, max_seq_length)
    else:
        overrides["max_position_embeddings"] = max(4096, max_seq_length)
    overrides.update(spec.config)
    return AutoConfig.for_model(spec.arch, **overrides)


# A transformers PreTrainedModel, or a peft PeftModel that forwards to one. torch's stubs type
# every attribute a Module does not declare as ``Tensor | Module``, so the model's own methods
# (save_pretrained, gradient_checkpointing_enable, get_input_embeddings) are read as Any.
HFModel = Any


def probe_model(
    workload: Workload, tokenizer: Any, attn_implementation: str, device: torch.device
) -> torch.nn.Module:
    """The workload's architecture cut to one layer: enough to learn whether it can run."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if workload.model.id is not None:
        config = AutoConfig.from_pretrained(
            workload.model.id, trust_remote_code=workload.model.trust_remote_code
        )
    else:
        config = model_config(workload, tokenizer, 128)
    config.num_hidden_layers = 1
    config.use_cache = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        config,
        attn_implementation=attn_implementation,
        dtype=torch.float32,
        trust_remote_code=workload.model.trust_remote_code,
    )
    return model.to(device)


def config_hash(config: Any) -> str:
    text = json.dumps(config.to_diff_dict(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def build_model(
    workload: Workload,
    config: TrialConfig,
    tokenizer: Any,
    device: torch.device,
    cache_dir: Path,
) -> HFModel:
    """The model on ``device`` in fp32 (mixed precision is autocast); with an adapter, a peft
    model whose base is frozen (and, with ``quantization``, loaded through bitsandbytes).

    It is made where it trains: a model from a config is created and initialised on the device
    (a 1.1B model's fp32 random init took 19 s on the host before the copy to an H100), and a
    user's model directory is read straight onto it (``device_map``; from_pretrained memory-maps
    safetensors and ``.bin`` files, so from the second trial on the read comes from the page
    cache). Same seed, same device: the same weights as building on the host there.
    """
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    spec = workload.model
    if config.quantization != "none":
        model = _quantized_model(workload, config, tokenizer, device, cache_dir)
    elif spec.id is not None:
        model = AutoModelForCausalLM.from_pretrained(
            spec.id,
            attn_implementation=config.attn_implementation,
            dtype=torch.float32,
            device_map={"": str(device)},
            trust_remote_code=spec.trust_remote_code,
        )
    else:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(
                model_config(workload, tokenizer, config.max_seq_length),
                attn_implementation=config.attn_implementation,
                dtype=torch.float32,
            )
    model.config.use_cache = False
    if workload.adapter is not None:
        model = with_adapter(model, workload.adapter, config)
    if config.precision == "fp8":
        to_float8(model, device)
    return model


def apply_liger(model: Any) -> None:
    """Liger's kernels patched into the model (under a peft wrapper: its base), as Trainer
    does for use_liger_kernel=True."""
    try:
        from liger_kernel.transformers import (  # type: ignore[import-not-found]
            _apply_liger_kernel_to_instance,
        )
    except Exception as e:  # ImportError, or Triton failing at import
        raise TrialError(
            "unsupported",
            f"liger_kernel needs liger-kernel (and Triton), which does not import: {e}; "
            "pip install liger-kernel",
        ) from e
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    _apply_liger_kernel_to_instance(model=base)  # pragma: no cover - needs liger and CUDA


def float8_filter(module: torch.nn.Module, name: str) -> bool:
    """The Linear layers fp8 converts: float8 matmuls need dimensions that are multiples of
    16; the LM head stays bf16, as torchao's and torchtitan's recipes leave it."""
    if not isinstance(module, torch.nn.Linear) or name.split(".")[-1] == "lm_head":
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def to_float8(
    model: torch.nn.Module, device: torch.device
) -> None:  # pragma: no cover - needs CUDA >= 8.9 and torchao (tests/trial/test_gpu.py)
    """torchao's float8 training (dynamic tensorwise scaling) on the model's Linear layers, in
    place. The read-back counts what it converted: none converted is a mismatch."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        raise TrialError(
            "unsupported",
            "precision fp8 needs a CUDA device of compute capability 8.9 or newer (Ada, Hopper)",
        )
    try:
        from torchao.float8 import convert_to_float8_training  # type: ignore[import-not-found]
    except ImportError as e:
        raise TrialError(
            "unsupported", f"precision fp8 needs torchao, which does not import: {e}"
        ) from e
    convert_to_float8_training(model, module_filter_fn=float8_filter)


def lora_config(adapter: AdapterSpec) -> Any:
    """peft's LoraConfig for ``workload.adapter`` (peft must import)."""
    from peft import LoraConfig

    return LoraConfig(
        r=adapter.r,
        lora_alpha=adapter.alpha,
        lora_dropout=adapter.dropout,
        target_modules=adapter.target_modules,
        task_type="CAUSAL_LM",
    )


def with_adapter(model: Any, adapter: AdapterSpec, config: TrialConfig) -> Any:
    """Wrap ``model`` in a LoRA adapter (peft), as the user's run does; only it trains."""
    try:
        from peft import get_peft_model, prepare_model_for_kbit_training
    except ImportError as e:
        raise TrialError(
            "unsupported",
            f"workload.adapter needs peft, which does not import: {e}; pip install peft",
        ) from e
    if config.quantization != "none":
        # what QLoRA recipes do: norms in fp32, input grads for checkpointing
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=bool(config.gradient_checkpointing)
        )
    elif config.gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks see a frozen embedding's output
    try:
        return get_peft_model(model, lora_config(adapter))
    except ValueError as e:  # e.g. target modules the model does not have
        raise TrialError("error", f"workload.adapter: peft refuses it: {e}") from e


def _quantized_model(
    workload: Workload,
    config: TrialConfig,
    tokenizer: Any,
    device: torch.device,
    cache_dir: Path,
) -> Any:  # pragma: no cover - needs CUDA and bitsandbytes (tests/trial/test_gpu.py)
    """Base weights loaded in 4-bit NF4 (double quantization, bf16 compute) or 8-bit, through
    from_pretrained's quantization_config, the only way bitsandbytes quantizes. A model built
    from ``arch`` is saved once (random weights) and loaded back the same way."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if device.type != "cuda":
        raise TrialError("unsupported", f"quantization {config.quantization} needs a CUDA device")
    try:
        import bitsandbytes  # noqa: F401
    except Exception as e:  # ImportError, or its CUDA setup failing at import
        raise TrialError("unsupported", f"quantization needs bitsandbytes: {e}") from e
    spec = workload.model
    source = spec.id
    if source is None:
        built = model_config(workload, tokenizer, config.max_seq_length)
        folder = cache_dir / "models" / f"{spec.arch}-{config_hash(built)}"
        if not (folder / "config.json").is_file():
            partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
            with torch.device(device):  # random bf16 weights made on the GPU, not the host
                base = AutoModelForCausalLM.from_config(built, dtype=torch.bfloat16)
            base.save_pretrained(str(partial))
            del base
            torch.cuda.empty_cache()
            if not folder.exists():
                partial.rename(folder)
        source = str(folder)
    compute = torch.float16 if config.precision == "fp16" else torch.bfloat16
    quantization = (
        BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute,
        )
        if config.quantization == "4bit"
        else BitsAndBytesConfig(load_in_8bit=True)
    )
    return AutoModelForCausalLM.from_pretrained(
        source,
        quantization_config=quantization,
        attn_implementation=config.attn_implementation,
        dtype=compute,
        device_map={"": device.index or 0},
        trust_remote_code=spec.trust_remote_code,
    )
