"""A custom AMP training loop, seed 004's: fp16 autocast with a GradScaler on CUDA, gradient
accumulation, a DataLoader with workers, pinning, prefetching, persistent workers and its
start method, gradient checkpointing and clipping, a OneCycle schedule, a checkpoint at the end.

The model is built from a config with random weights (``--config DIR``: pre-training from
scratch, as the seed does) or loaded with from_pretrained (``--model DIR``: a fine-tune). The data
is pre-tokenized (``--data tokens.npy``: token ids end to end, each sample closed by EOS,
packed here into rows of ``--max_seq_length``) or chat records (``--data chats.jsonl``, rendered
with the tokenizer's chat template, each record cut at ``--max_seq_length`` and padded).

The knobs are command-line flags named as TrainingArguments names them, so sweeper appends
them (``workload.script.knobs: flags``) and ``sweeper export --format command`` gives the
winner's command; the rest (sequence length, attention kernel, the workers' start method,
packing, quantization, devices) come from ``sweeper.trial_config()`` inside a trial, and
outside one are flags of the knobs' own names, as the export lists them. sweeper's one line
is the ``with sweeper.step``.

    python scripts/pretrain_job.py --out seed004-job
    python examples/amp_loop/train.py --config seed004-job/model --data seed004-job/tokens.npy

On several devices it runs as torchrun runs it (``torchrun --nproc-per-node 2 train.py ...``;
a sweeper trial with ``devices: 2`` gives each rank the same environment): each process joins
the group torchrun's variables name (NCCL on CUDA, gloo on the CPU), reads its share of the data
(a DistributedSampler) and trains the model inside DistributedDataParallel, or sharded with FSDP2
(``--fsdp full_shard``, TrainingArguments' flag: each decoder layer, then the model; the
checkpoint at the end is then every rank's shards).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import sweeper


def _bool(text: str) -> bool:
    return text.lower() in ("1", "true", "yes")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--config", help="a directory with config.json: random weights")
    model.add_argument("--model", help="a directory written by save_pretrained")
    parser.add_argument("--data", required=True, help="tokens.npy, or chat records (.jsonl)")
    parser.add_argument("--output_dir", help="where the checkpoint goes at the end")
    parser.add_argument("--max_steps", type=int, default=1000)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    # the knobs, with the seed's values as defaults; TrainingArguments' names
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--dataloader_num_workers", type=int, default=4)
    parser.add_argument("--dataloader_prefetch_factor", type=int, default=4)
    parser.add_argument("--dataloader_persistent_workers", type=_bool, default=True)
    parser.add_argument("--dataloader_pin_memory", type=_bool, default=True)
    parser.add_argument("--fp16", type=_bool, default=None, help="default: on CUDA")
    parser.add_argument("--bf16", type=_bool, default=False)
    parser.add_argument("--tf32", type=_bool, default=True)
    parser.add_argument("--gradient_checkpointing", type=_bool, default=True)
    parser.add_argument("--torch_compile", type=_bool, default=False)
    parser.add_argument("--torch_compile_mode", default=None)
    parser.add_argument(
        "--optim", default="adamw_torch", choices=["adamw_torch", "adamw_torch_fused"]
    )
    # not TrainingArguments: from sweeper.trial_config() inside a trial
    parser.add_argument("--max_seq_length", type=int, default=32768)
    parser.add_argument("--attn_implementation", default="sdpa")
    parser.add_argument("--multiprocessing_context", default="spawn")
    # the data decides: token ids are packed (a sample continues in the next row, "wrapped"),
    # chat records are not; asked otherwise, the loop says so instead of training something else
    parser.add_argument("--packing", type=_bool, default=None)
    parser.add_argument("--packing_strategy", default="wrapped", choices=("wrapped",))
    parser.add_argument("--quantization", default="none", choices=("none",))  # all weights train
    # one process per device, started by torchrun (its WORLD_SIZE): said here, it must agree
    parser.add_argument("--devices", type=int, default=None)
    # TrainingArguments' sharding flags: full_shard is FSDP2 (fully_shard on each decoder layer,
    # then the model) instead of DDP; its config must say fsdp_version 2
    parser.add_argument("--fsdp", default="", choices=("", "full_shard"))
    parser.add_argument("--fsdp_config", type=json.loads, default=None)
    args = parser.parse_args()
    trial = sweeper.trial_config()  # None outside a sweeper trial
    if trial is not None:
        args.max_seq_length = trial["max_seq_length"]
        args.attn_implementation = trial["attn_implementation"]
        args.multiprocessing_context = trial["multiprocessing_context"]
        args.packing = trial["packing"]
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.devices is not None and args.devices != world:
        parser.error(
            f"--devices {args.devices}: this run has {world} process(es); launch it with "
            f"torchrun --nproc-per-node {args.devices}"
        )
    if args.fsdp and world == 1:
        parser.error("--fsdp full_shard: shards over several processes; launch with torchrun")
    if args.fsdp and (args.fsdp_config or {}).get("fsdp_version", 2) != 2:
        parser.error(f"--fsdp_config {args.fsdp_config}: this loop shards with FSDP2 only")
    packed = Path(args.data).suffix == ".npy"
    if args.packing is not None and args.packing != packed:
        parser.error(
            f"packing {args.packing}: {args.data} is "
            f"{'token ids, packed into rows' if packed else 'chat records, one per row'}"
        )
    return args


class PackedTokens(Dataset):
    """Rows of ``block`` tokens cut from one stream of token ids: every row full, no padding
    (a sample continues in the next row; rows attend across samples, as packed pre-training
    does). Each process maps the file itself: a spawned worker gets the path, not the array."""

    def __init__(self, path: str, block: int) -> None:
        self.path, self.block = path, block
        self.rows = len(np.load(path, mmap_mode="r")) // block
        self.tokens: Any = None

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self.tokens is None:
            self.tokens = np.load(self.path, mmap_mode="r")
        row = self.tokens[index * self.block : (index + 1) * self.block]
        ids = torch.from_numpy(row.astype(np.int64))
        return {"input_ids": ids, "labels": ids}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "tokens": None}


class Chats(Dataset):
    """Chat records, rendered and tokenized as they are read (in the workers), cut at
    ``max_len``."""

    def __init__(self, path: str, tokenizer: Any, max_len: int) -> None:
        with open(path, encoding="utf-8") as f:
            self.records = [json.loads(line) for line in f if line.strip()]
        self.tokenizer, self.max_len = tokenizer, max_len

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        text = self.tokenizer.apply_chat_template(self.records[index]["messages"], tokenize=False)
        return self.tokenizer(text, truncation=True, max_length=self.max_len)


class PadChats:
    """Pads a batch of chat rows to its longest; pads are not labels. A class, not a
    closure: a spawned worker gets it pickled."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer.pad(rows, return_tensors="pt")
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return dict(batch)


def build_model(args: argparse.Namespace, device: torch.device) -> Any:
    torch.manual_seed(0)
    if args.model is not None:
        model = AutoModelForCausalLM.from_pretrained(
            args.model, attn_implementation=args.attn_implementation
        )
    else:
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(args.config), attn_implementation=args.attn_implementation
        )
    model.config.use_cache = False
    if args.gradient_checkpointing:  # transformers 5.23 renamed it (the old name warns)
        getattr(model, "activation_checkpointing_enable", model.gradient_checkpointing_enable)()
    return model.to(device).train()


def build_loader(args: argparse.Namespace, cuda: bool, distributed: bool) -> DataLoader:
    workers = args.dataloader_num_workers
    if Path(args.data).suffix == ".npy":
        dataset: Dataset = PackedTokens(args.data, args.max_seq_length)
        collate = None  # rows are all max_seq_length wide: torch's default stacks them
    else:
        tokenizer = AutoTokenizer.from_pretrained(args.model or args.config)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        dataset, collate = Chats(args.data, tokenizer, args.max_seq_length), PadChats(tokenizer)
    # under torchrun: this rank's share of the rows (the sampler shuffles them)
    sampler = DistributedSampler(dataset, shuffle=True, drop_last=True) if distributed else None
    return DataLoader(
        dataset,
        batch_size=args.per_device_train_batch_size,
        shuffle=sampler is None,
        sampler=sampler,
        drop_last=True,
        collate_fn=collate,
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory and cuda,
        persistent_workers=args.dataloader_persistent_workers and workers > 0,
        prefetch_factor=args.dataloader_prefetch_factor if workers > 0 else None,
        multiprocessing_context=args.multiprocessing_context if workers > 0 else None,
    )


def join(cuda: bool) -> tuple[torch.device, bool]:
    """This process's device, and whether it is one of several (torchrun's environment
    names the group: NCCL on CUDA, gloo on the CPU)."""
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    device = torch.device("cpu")
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if distributed:
        dist.init_process_group("nccl" if cuda else "gloo")
    return device, distributed


def main() -> None:
    args = arguments()
    cuda = torch.cuda.is_available()
    device, distributed = join(cuda)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    model = build_model(args, device)
    runnable: Any = model
    if args.fsdp:  # each rank keeps its shard of the weights, gradients and optimizer state
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    elif distributed:
        runnable = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    if args.torch_compile:
        runnable = torch.compile(runnable, mode=args.torch_compile_mode)
    loader = build_loader(args, cuda, distributed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.learning_rate, fused=args.optim == "adamw_torch_fused"
    )
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.learning_rate, total_steps=args.max_steps, pct_start=0.1
    )
    fp16 = cuda if args.fp16 is None else args.fp16
    dtype = torch.float16 if fp16 else torch.bfloat16 if args.bf16 else None
    scaler = torch.amp.GradScaler("cuda", enabled=cuda and fp16)
    accumulation = args.gradient_accumulation_steps

    step, micro, epoch = 0, [], 0
    while step < args.max_steps:
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.set_epoch(epoch)
        epoch += 1
        for batch in loader:
            micro.append(batch)
            if len(micro) < accumulation:
                continue
            # sweeper's one line: this optimizer step and its micro-batches
            with sweeper.step(micro, model=runnable, optimizer=optimizer, loader=loader):
                for part in micro:
                    part = {k: v.to(device, non_blocking=True) for k, v in part.items()}
                    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                        loss = runnable(**part).loss / accumulation
                    scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
                if step % 10 == 0:  # the seed's cleanup, timed with the step it belongs to
                    del loss, part
                    if cuda:
                        torch.cuda.empty_cache()
                    gc.collect()
            micro, step = [], step + 1
            if step >= args.max_steps:
                break
    save(args.output_dir, model, optimizer, step)
    if distributed:
        dist.destroy_process_group()


def save(output_dir: str | None, model: Any, optimizer: Any, step: int) -> None:
    """The checkpoint at the end: with FSDP2 every rank writes its shards (torch's distributed
    checkpoint); else rank 0's (DDP keeps the ranks equal)."""
    if output_dir and isinstance(model, FSDPModule):
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state, "step": step}
        dcp.save(state, checkpoint_id=str(Path(output_dir) / "checkpoint"))
    elif output_dir and (not dist.is_initialized() or dist.get_rank() == 0):
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        torch.save(state, out / "checkpoint.pt")


if __name__ == "__main__":
    main()
