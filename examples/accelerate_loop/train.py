"""A chat fine-tune in your own loop with ``accelerate``: the kind of train.py an
``accelerate launch`` user already has, with sweeper's one line (``with sweeper.step``).

    accelerate launch --multi_gpu --num_processes 2 examples/accelerate_loop/train.py \\
        --model my-job/model --data my-job/chats.jsonl --per_device_train_batch_size 4

or with the launch in a config file (``accelerate config``, or the one ``sweeper export
--format accelerate`` writes: DDP, or FSDP2 sharding each decoder layer):

    accelerate launch --config_file accelerate.yaml examples/accelerate_loop/train.py ...

``Accelerator()`` reads what the launch says (processes, mixed precision, the FSDP plugin) from
the environment ``accelerate launch`` gives each process; ``accelerator.prepare`` wraps the
model (DDP or FSDP2), the optimizer and the DataLoader (each process reads its share).
Under sweeper (``examples/accelerate_loop/space.yaml``) the launch line is read with
accelerate's own parser and config file, and each of the trial's devices runs this file with
the environment accelerate's launcher would give it, the trial's precision, compile mode and
data-parallel strategy set on the launch (its ``--mixed_precision`` ...); the other knobs
arrive as TrainingArguments flags, the sequence length and attention kernel from
``sweeper.trial_config()``.
A checkpoint is saved every ``--save_steps`` with ``accelerator.save_state``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

import sweeper


def _bool(text: str) -> bool:
    return text.lower() in ("1", "true", "yes")


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="a directory written by save_pretrained")
    parser.add_argument("--data", required=True, help="chat records (.jsonl, 'messages')")
    parser.add_argument("--output_dir", help="where accelerator.save_state writes")
    parser.add_argument("--save_steps", type=int, default=0, help="0: no checkpoint")
    parser.add_argument("--max_steps", type=int, default=1000)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--max_seq_length", type=int, default=1024)
    parser.add_argument("--attn_implementation", default="sdpa")
    # the knobs, named as TrainingArguments names them (sweeper appends them as flags)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=1)
    parser.add_argument("--dataloader_num_workers", type=int, default=0)
    parser.add_argument("--dataloader_prefetch_factor", type=int, default=2)
    parser.add_argument("--dataloader_persistent_workers", type=_bool, default=False)
    parser.add_argument("--dataloader_pin_memory", type=_bool, default=True)
    parser.add_argument("--gradient_checkpointing", type=_bool, default=False)
    parser.add_argument(
        "--optim", default="adamw_torch", choices=["adamw_torch", "adamw_torch_fused"]
    )
    # precision, compilation and sharding are the launch's (accelerate launch --mixed_precision,
    # --dynamo_backend, --use_fsdp or its config file): Accelerator() reads them from it, and
    # sweeper sets them on the launch, not here
    parser.add_argument("--tf32", type=_bool, default=None)
    parser.add_argument("--use_liger_kernel", type=_bool, default=False)
    args = parser.parse_args()
    trial = sweeper.trial_config()  # None outside a sweeper trial
    if trial is not None:
        args.max_seq_length = trial["max_seq_length"]
        args.attn_implementation = trial["attn_implementation"]
    return args


def check_launch(args: argparse.Namespace) -> None:
    """A flag this loop cannot honour is said, not trained past."""
    if args.use_liger_kernel:
        raise SystemExit("train.py: --use_liger_kernel True: this loop has no Liger kernels")


class Chats(Dataset):
    """Chat records, rendered with the tokenizer's chat template and cut at ``max_len``."""

    def __init__(self, path: str, tokenizer: Any, max_len: int) -> None:
        with open(path, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        texts = [tokenizer.apply_chat_template(r["messages"], tokenize=False) for r in records]
        self.rows = [tokenizer(t, truncation=True, max_length=max_len) for t in texts]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]


class PadChats:
    """Pads a batch to its longest row; pads are not labels."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.tokenizer.pad(rows, return_tensors="pt")
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return dict(batch)


def main() -> None:
    args = arguments()
    accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
    check_launch(args)
    if args.tf32 is not None and torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        args.model, attn_implementation=args.attn_implementation
    )
    model.config.use_cache = False
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    workers = args.dataloader_num_workers
    loader = DataLoader(
        Chats(args.data, tokenizer, args.max_seq_length),
        batch_size=args.per_device_train_batch_size,
        shuffle=True,
        drop_last=True,
        collate_fn=PadChats(tokenizer),
        num_workers=workers,
        pin_memory=args.dataloader_pin_memory and torch.cuda.is_available(),
        prefetch_factor=args.dataloader_prefetch_factor if workers > 0 else None,
        persistent_workers=args.dataloader_persistent_workers and workers > 0,
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.learning_rate, fused=args.optim == "adamw_torch_fused"
    )
    # DDP or FSDP2 around the model (the launch says which), each process its share of the data
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accumulation = args.gradient_accumulation_steps

    step, micro = 0, []
    while step < args.max_steps:
        for batch in loader:
            micro.append(batch)
            if len(micro) < accumulation:
                continue
            # sweeper's one line: this optimizer step and its micro-batches
            with sweeper.step(micro, model=model, optimizer=optimizer, loader=loader):
                for part in micro:
                    with accelerator.accumulate(model):
                        loss = model(**part).loss
                        accelerator.backward(loss)
                        accelerator.clip_grad_norm_(model.parameters(), 1.0)
                        optimizer.step()
                        optimizer.zero_grad()
            micro, step = [], step + 1
            if args.save_steps and args.output_dir and step % args.save_steps == 0:
                accelerator.save_state(args.output_dir)
            if step >= args.max_steps:
                break
    accelerator.end_training()


if __name__ == "__main__":
    main()
