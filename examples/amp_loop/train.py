"""A custom AMP training loop, the shape of seed 004's: fp16 autocast with a GradScaler on CUDA,
gradient accumulation, a DataLoader with workers, pinning, prefetching and persistent workers,
gradient clipping, a OneCycle schedule. Its knobs come from ``sweeper.trial_config()`` inside
a trial and from the command line otherwise; sweeper's one line is the ``with sweeper.step``.

    python examples/amp_loop/train.py --model my-job/model --data my-job/chats.jsonl
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer

import sweeper


def knobs() -> dict[str, Any]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--gradient_accumulation", type=int, default=4)
    parser.add_argument("--max_seq_len", type=int, default=512)
    parser.add_argument("--num_workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1000)
    args = vars(parser.parse_args())
    trial = sweeper.trial_config()  # the sweep's knobs, inside a trial
    if trial is not None:
        args.update(
            batch_size=trial["per_device_batch_size"],
            gradient_accumulation=trial["gradient_accumulation_steps"],
            max_seq_len=trial["max_seq_length"],
            num_workers=trial["num_workers"],
            prefetch_factor=trial["prefetch_factor"],
            pin_memory=trial["pin_memory"],
            precision=trial["precision"],
            attn_implementation=trial["attn_implementation"],
        )
    return args


class Chats(torch.utils.data.Dataset):
    def __init__(self, path: str, tokenizer: Any, max_len: int) -> None:
        with open(path, encoding="utf-8") as f:
            self.records = [json.loads(line) for line in f if line.strip()]
        self.tokenizer, self.max_len = tokenizer, max_len

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> dict[str, Any]:
        text = self.tokenizer.apply_chat_template(self.records[index]["messages"], tokenize=False)
        return self.tokenizer(text, truncation=True, max_length=self.max_len)


def main() -> None:
    args = knobs()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    tokenizer = AutoTokenizer.from_pretrained(args["model"])
    model = AutoModelForCausalLM.from_pretrained(
        args["model"], attn_implementation=args.get("attn_implementation", "sdpa")
    ).to(device)
    model.train()
    workers = args["num_workers"]

    def collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = tokenizer.pad(rows, return_tensors="pt")
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return batch

    loader = DataLoader(
        Chats(args["data"], tokenizer, args["max_seq_len"]),
        batch_size=args["batch_size"],
        shuffle=True,
        drop_last=True,
        collate_fn=collate,
        num_workers=workers,
        pin_memory=args.get("pin_memory", cuda),
        persistent_workers=workers > 0,
        prefetch_factor=args.get("prefetch_factor") or (4 if workers else None),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=1e-4, total_steps=args["steps"], pct_start=0.1
    )
    precision = args.get("precision", "fp16" if cuda else "fp32")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda and precision == "fp16")
    accumulation = args["gradient_accumulation"]

    step, micro = 0, []
    while step < args["steps"]:
        for batch in loader:
            micro.append(batch)
            if len(micro) < accumulation:
                continue
            # sweeper's one line: this optimizer step and its micro-batches
            with sweeper.step(micro, model=model, optimizer=optimizer, loader=loader):
                for part in micro:
                    part = {k: v.to(device, non_blocking=True) for k, v in part.items()}
                    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                        loss = model(**part).loss / accumulation
                    scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                scheduler.step()
            micro, step = [], step + 1
            if step >= args["steps"]:
                break


if __name__ == "__main__":
    main()
