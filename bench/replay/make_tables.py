"""Synthetic tables for bench/search_replay.py, written next to this file:

    .venv/bin/python bench/replay/make_tables.py

- oom-wall.jsonl (space oom-wall.yaml, 448 configs): throughput grows with tokens per batch
  until the device saturates; memory grows with batch x sequence length (less with gradient
  checkpointing, more with eager attention at long sequences), and every config past 80 GB is
  an ``oom``. The best configs sit next to the wall.
- interactions.jsonl (space interactions.yaml, 1,728 configs): knobs that only matter together:
  DataLoader workers only at small batches (data-bound), packing only with long sequences and
  padding, torch.compile only from batch 8 and max-autotune failing (``compile``) with packing,
  pinned memory only with workers; accumulation amortizes the optimizer step.
- noisy.jsonl (space interactions.yaml): the same table, each measurement with 10% spread.
- cpu-grid-loaded.jsonl (space cpu-grid.yaml, 128 configs): the measured grid on a machine that
  other work shares, built from the two measured tables. Each row keeps its calm measurement
  (cpu-grid.jsonl) as the truth, with the 4.5% run-to-run spread measured on this CPU
  (bench/RESULTS.md, repeatability). A measurement is taken under load with the share of
  configs that cpu-grid-contended.jsonl measured more than 15% slower than calm, and is then
  slowed by that config's own measured slowdown (the median one for a config that happened
  to be measured calm). bench/contention.py flagged every loaded trial (3 of 3), so a loaded
  measurement is flagged contended, as the child's host watch flags it.
- held-out.jsonl (space held-out.yaml, 1,152 configs): written after bayes's priors were
  chosen, and never used to choose anything: a saturating device with a data-loading cap
  without workers, compile modes that help at different batch sizes (reduce-overhead, CUDA
  graphs, only where launches dominate, and failing with gradient checkpointing), a fused
  optimizer that accumulation amortizes, an out-of-memory wall, 5% spread per measurement.
- held-out-lora.jsonl (space held-out-lora.yaml, 1,296 configs): written, and committed, before
  any search ran on it, after held-out.jsonl had been seen: a LoRA fine-tune on a 40 GB card.
  Little compute per token, so the device saturates early and the DataLoader (packing costs it
  40% more) often limits; checkpointing cuts activation memory to a third; max-autotune helps
  only from 4,096 tokens per step and fails with checkpointing at 2,048; 5% spread.
- qlora-24gb.jsonl (space qlora-24gb.yaml, 1,728 configs): written for issue 33, before any
  search ran on it, to resemble the independent QLoRA table that bayes lost on: a 7B model
  in 4-bit on a 24 GB card, about three configs in four infeasible. Samples average 1,100
  tokens and the longest is 1,900, so without packing 512 and 1,024 cut samples the coverage
  needs whole (``truncates``: the recommendation cannot pick them); memory grows with batch
  x row length (a third with checkpointing) and past
  23 GB it is an ``oom``; max-autotune fails with checkpointing at 2,048 tokens and more
  (``compile``). The device saturates slowly, so the best configs sit at the memory wall:
  packed, checkpointed, 8,192 tokens a step. Each measurement has its own 4-6% spread.
  Each row has its trial time (``trial_s``, issue 33 item 4): every trial loads and quantizes
  the 7B in its own child (202 s, a QLoRA trial's first start-up as measured; later ones are
  assumed as slow, no page cache counted), compiles (default 60 s, max-autotune 345 s as
  measured on an H100), then 45 s of burn-in and timed window; an out-of-memory config fails
  at the first step after compiling (5 s), a compile error at the end of its compile.

Every table's rows carry their trial time (``trial_s``) and the first trial's
(``first_trial_s``), by ``timed``: the model's start-up by its size (a tiny CPU model 4 s, a
1B-class model on an H100 30 s, the 3B LoRA 60 s, the 7B QLoRA 202 s), its compile mode's
compile (sweeper.search.COMPILE_S, measured for a 1B on an H100: max-autotune 345 s, scaled by
model size: 0.3 tiny, 1.5 for the 3B; qlora-24gb keeps its own, unscaled), then burn-in and the
timed window (45 s; 15 s on the CPU grids, whose trials measure for at most 6 s); a failing
config ends where it fails (see trial_s of bench/search_replay.py). The first trial of a sweep
also reads the weights and prepares the data cold: its start-up counts twice
(``first_trial_s``). The measured CPU grids' rows get the same model (the grid's study did not
keep its trials' seconds).

Each config also gets a fixed +-4% idiosyncrasy (what no model of the knobs explains). The
numbers are made up; the shapes are the ones measured sweeps show (bench/RESULTS.md).
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

HERE = Path(__file__).parent
MEAN_SAMPLE_TOKENS = 700  # the data's mean sample length, in tokens


def _samples_per_s(tokens_per_s: float, seq: int, packing: bool) -> float:
    # unpacked: each row is one sample cut at seq; packed: rows are full of whole samples
    per_sample = MEAN_SAMPLE_TOKENS if packing else min(seq, MEAN_SAMPLE_TOKENS)
    return tokens_per_s / per_sample


def oom_wall(rng: random.Random) -> list[dict]:
    rows = []
    for batch, seq, ckpt, compile_mode, attn, workers in itertools.product(
        [1, 2, 4, 8, 16, 32, 64], [512, 1024, 2048, 4096], [False, True],
        ["none", "default"], ["sdpa", "eager"], [0, 4],
    ):  # fmt: skip
        tokens = batch * seq
        memory_gb = 6 + tokens * (0.0035 if ckpt else 0.011) * (
            1 + seq / 2048 if attn == "eager" else 1
        )
        row = {
            "per_device_batch_size": batch, "max_seq_length": seq, "gradient_checkpointing": ckpt,
            "compile_mode": compile_mode, "attn_implementation": attn, "num_workers": workers,
            "peak_memory_bytes": int(memory_gb * 2**30),
        }  # fmt: skip
        if memory_gb > 80:
            rows.append(row | {"status": "oom", "samples_per_s": None, "tokens_per_s": None})
            continue
        saturation = tokens / (tokens + 6000)  # small batches leave the GPU idle
        speed = 30000 * saturation
        speed *= 0.74 if ckpt else 1.0  # recompute in the backward pass
        speed *= 1.18 if compile_mode == "default" else 1.0
        speed *= 0.85 * (1024 / seq) ** 0.15 if attn == "eager" else 1.0
        speed *= 0.9 if workers == 0 and batch <= 4 else 1.0  # data wait
        speed *= 1 + rng.uniform(-0.04, 0.04)
        rows.append(
            row | {"status": "ok", "tokens_per_s": speed,
                   "samples_per_s": _samples_per_s(speed, seq, False)}
        )  # fmt: skip
    return rows


def interactions(rng: random.Random, noise: float = 0.0) -> list[dict]:
    rows = []
    for batch, accumulation, workers, pin, packing, seq, compile_mode in itertools.product(
        [2, 4, 8, 16], [1, 2, 4], [0, 1, 2, 4], [False, True], [False, True],
        [256, 512, 1024], ["none", "default", "max-autotune"],
    ):  # fmt: skip
        row = {
            "per_device_batch_size": batch, "gradient_accumulation_steps": accumulation,
            "num_workers": workers, "pin_memory": pin, "packing": packing,
            "max_seq_length": seq, "compile_mode": compile_mode,
        }  # fmt: skip
        if noise:
            row["noise"] = noise
        if compile_mode == "max-autotune" and packing:
            rows.append(row | {"status": "compile", "samples_per_s": None, "tokens_per_s": None})
            continue
        tokens = batch * seq
        compute = 20000 * tokens / (tokens + 3000)
        # padding: unpacked rows of long sequences are mostly padding (samples ~700 tokens)
        real_share = 1.0 if packing else min(1.0, MEAN_SAMPLE_TOKENS / seq * 0.8)
        # data: each worker tokenizes ~9k tokens/s; the main thread ~6k, while training
        feed = 6000 + 9000 * workers * (1.15 if pin and workers else 1.0)
        speed = 1 / (1 / compute + (0.6 / feed if batch <= 4 else 0.15 / feed))
        if compile_mode != "none" and batch >= 8:
            speed *= 1.25 if compile_mode == "max-autotune" else 1.15
        elif compile_mode != "none":
            speed *= 0.95  # compiled small batches: overhead without the gain
        speed *= 1 + 0.05 * (1 - 1 / accumulation)  # the optimizer step, amortized
        speed *= 1 + rng.uniform(-0.04, 0.04)
        tokens_per_s = speed * real_share
        rows.append(
            row | {"status": "ok", "tokens_per_s": tokens_per_s,
                   "samples_per_s": _samples_per_s(tokens_per_s, seq, packing)}
        )  # fmt: skip
    return rows


def held_out(rng: random.Random) -> list[dict]:
    rows = []
    for batch, accumulation, seq, ckpt, compile_mode, optim, attn, workers in itertools.product(
        [1, 2, 4, 8, 16, 32], [1, 4], [1024, 2048], [False, True],
        ["none", "default", "reduce-overhead"], ["adamw_torch", "adamw_torch_fused"],
        ["sdpa", "eager"], [0, 4],
    ):  # fmt: skip
        tokens = batch * seq
        memory_gb = 9 + tokens * (0.004 if ckpt else 0.0125) * (
            1 + seq / 4096 if attn == "eager" else 1
        )
        row = {
            "per_device_batch_size": batch, "gradient_accumulation_steps": accumulation,
            "max_seq_length": seq, "gradient_checkpointing": ckpt, "compile_mode": compile_mode,
            "optim": optim, "attn_implementation": attn, "num_workers": workers,
            "peak_memory_bytes": int(memory_gb * 2**30), "noise": 0.05,
        }  # fmt: skip
        if memory_gb > 80:
            rows.append(row | {"status": "oom", "samples_per_s": None, "tokens_per_s": None})
            continue
        if compile_mode == "reduce-overhead" and ckpt:
            rows.append(row | {"status": "compile", "samples_per_s": None, "tokens_per_s": None})
            continue
        speed = 42000 * tokens / (tokens + 9000)  # small batches leave the device idle
        speed *= 0.72 if ckpt else 1.0
        if compile_mode == "default":
            speed *= 1.12 if tokens >= 8192 else 1.02
        elif compile_mode == "reduce-overhead":
            speed *= 1.35 if tokens <= 4096 else 1.05  # CUDA graphs: launch-bound steps
        speed *= (0.8 if seq == 2048 else 0.9) if attn == "eager" else 1.0
        speed *= 1 + (0.09 if optim == "adamw_torch_fused" else 0.0) / accumulation
        speed *= 1 + 0.05 * (1 - 1 / accumulation)
        if workers == 0:
            speed = min(speed, 22000)  # tokenizing on the main thread caps the rate
        speed *= 1 + rng.uniform(-0.04, 0.04)
        rows.append(
            row | {"status": "ok", "tokens_per_s": speed,
                   "samples_per_s": speed / min(seq, 1400)}  # samples of 1,400 tokens, cut
        )  # fmt: skip
    return rows


def held_out_lora(rng: random.Random) -> list[dict]:
    """A LoRA fine-tune of a 3B model on a 40 GB card (see the module's docstring)."""
    rows = []
    for batch, accumulation, seq, packing, ckpt, compile_mode, workers in itertools.product(
        [1, 2, 4, 8, 16, 32], [1, 4], [512, 1024, 2048], [False, True], [False, True],
        ["none", "default", "max-autotune"], [0, 2, 8],
    ):  # fmt: skip
        tokens = batch * seq
        # frozen bf16 weights, then activations per token (a third with checkpointing; the
        # compiled graph frees some buffers early)
        memory_gb = 6.5 + tokens * (0.0021 if ckpt else 0.0068) * (
            1.0 if compile_mode == "none" else 0.9
        )
        row = {
            "per_device_batch_size": batch, "gradient_accumulation_steps": accumulation,
            "max_seq_length": seq, "packing": packing, "gradient_checkpointing": ckpt,
            "compile_mode": compile_mode, "num_workers": workers,
            "peak_memory_bytes": int(memory_gb * 2**30), "noise": 0.05,
        }  # fmt: skip
        if memory_gb > 40:
            rows.append(row | {"status": "oom", "samples_per_s": None, "tokens_per_s": None})
            continue
        if compile_mode == "max-autotune" and ckpt and seq == 2048:
            rows.append(row | {"status": "compile", "samples_per_s": None, "tokens_per_s": None})
            continue
        compute = 11000 * tokens / (tokens + 3000)  # LoRA: little work per token
        compute *= 0.78 if ckpt else 1.0
        if compile_mode == "default":
            compute *= 1.08 if seq >= 1024 else 1.0
        elif compile_mode == "max-autotune":
            compute *= 1.2 if tokens >= 4096 else 0.9
        feed = 4500 + 6500 * workers**0.8  # tokenizing; packing costs the loader more
        speed = 1 / (1 / compute + (1.4 if packing else 1.0) / feed)
        speed *= 1 + 0.03 * (1 - 1 / accumulation)
        speed *= 1 + rng.uniform(-0.04, 0.04)
        real_share = 1.0 if packing else min(1.0, LORA_SAMPLE_TOKENS / seq * 0.9)
        tokens_per_s = speed * real_share
        per_sample = LORA_SAMPLE_TOKENS if packing else min(seq, LORA_SAMPLE_TOKENS)
        rows.append(
            row | {"status": "ok", "tokens_per_s": tokens_per_s,
                   "samples_per_s": tokens_per_s / per_sample}
        )  # fmt: skip
    return rows


LORA_SAMPLE_TOKENS = 380  # held-out-lora's mean sample length
QLORA_MEAN, QLORA_LONGEST = 1100, 1900  # qlora-24gb's sample lengths, tokens
QLORA_START_S, WINDOW_S, FIRST_STEP_S = 202.0, 45.0, 5.0  # a QLoRA trial's seconds
COMPILE_S = {"none": 0.0, "default": 60.0, "max-autotune": 345.0}


def qlora_24gb(rng: random.Random) -> list[dict]:
    """A QLoRA fine-tune of a 7B model on a 24 GB card (see the module's docstring)."""
    rows = []
    for batch, accumulation, seq, packing, ckpt, compile_mode, workers in itertools.product(
        [1, 2, 4, 8, 16, 32], [1, 4], [512, 1024, 2048, 4096], [False, True], [False, True],
        ["none", "default", "max-autotune"], [0, 2, 8],
    ):  # fmt: skip
        # a row is seq tokens packed; unpacked, it is padded to the batch's longest sample
        row_tokens = seq if packing else min(seq, QLORA_LONGEST)
        padded = seq if packing else min(seq, QLORA_MEAN + 800 * (1 - batch**-0.5))
        memory_gb = (
            5.2  # the 4-bit base weights, the adapter and its optimizer state, CUDA's own
            + batch
            * row_tokens
            * (0.0016 if ckpt else 0.0052)
            * (1.0 if compile_mode == "none" else 0.92)
        )
        row = {
            "per_device_batch_size": batch, "gradient_accumulation_steps": accumulation,
            "max_seq_length": seq, "packing": packing, "gradient_checkpointing": ckpt,
            "compile_mode": compile_mode, "num_workers": workers,
            "peak_memory_bytes": int(memory_gb * 2**30),
            "noise": round(rng.uniform(0.04, 0.06), 4),
            "truncates": not packing and seq < QLORA_LONGEST,
        }  # fmt: skip
        started = QLORA_START_S + COMPILE_S[compile_mode]  # start-up and compile
        if memory_gb > 23:
            rows.append(row | {"status": "oom", "samples_per_s": None, "tokens_per_s": None,
                               "trial_s": started + FIRST_STEP_S})  # fmt: skip
            continue
        if compile_mode == "max-autotune" and ckpt and batch * seq >= 2048:
            rows.append(row | {"status": "compile", "samples_per_s": None, "tokens_per_s": None,
                               "trial_s": started})  # fmt: skip
            continue
        tokens = batch * padded  # computed per forward pass, padding included
        compute = 3400 * tokens / (tokens + 5000)  # 4-bit dequantizing: slow to saturate
        compute *= 0.74 if ckpt else 1.0
        if compile_mode == "default":
            compute *= 1.05
        elif compile_mode == "max-autotune":
            compute *= 1.14 if tokens >= 4096 else 0.93
        feed = 5000 + 9000 * workers**0.8
        speed = 1 / (1 / compute + (1.3 if packing else 1.0) / feed)
        speed *= 1 + 0.02 * (1 - 1 / accumulation)
        speed *= 1 + rng.uniform(-0.04, 0.04)
        real = QLORA_MEAN if packing else min(seq, QLORA_MEAN) * 0.97  # tokens a sample keeps
        tokens_per_s = speed * (1.0 if packing else real / padded)
        rows.append(
            row | {"status": "ok", "tokens_per_s": round(tokens_per_s, 3),
                   "samples_per_s": round(tokens_per_s / (QLORA_MEAN if packing else real), 5),
                   "trial_s": started + WINDOW_S}
        )  # fmt: skip
    return rows


# start-up (s) by model size and its compile time against the 1B's on an H100 (see above)
TINY_CPU, ONE_B, LORA_3B = (4.0, 0.3, 15.0), (30.0, 1.0, 45.0), (60.0, 1.5, 45.0)
START_UP = {"oom-wall": ONE_B, "interactions": ONE_B, "noisy": ONE_B, "held-out": ONE_B,
            "held-out-lora": LORA_3B, "cpu-grid": TINY_CPU, "cpu-grid-contended": TINY_CPU,
            "cpu-grid-loaded": TINY_CPU, "qlora-24gb": (QLORA_START_S, 1.0, WINDOW_S)}  # fmt: skip
TRIAL_COMPILE_S = {"none": 0.0, "default": 60.0, "reduce-overhead": 90.0, "max-autotune": 345.0}


def timed(name: str, rows: list[dict]) -> list[dict]:
    """The rows with their trial seconds (``trial_s``, kept where a row has its own) and the
    first trial's (``first_trial_s``: the start-up twice), by the model in the docstring."""
    start, scale, window = START_UP[name]
    out = []
    for row in rows:
        compile_s = scale * TRIAL_COMPILE_S[row.get("compile_mode", "none")]
        status = row["status"]
        if "trial_s" in row:
            seconds = row["trial_s"]
        elif status == "ok":
            seconds = start + compile_s + window
        elif status == "oom":
            seconds = start + compile_s + FIRST_STEP_S
        else:
            seconds = start + (compile_s if status == "compile" else FIRST_STEP_S)
        out.append(row | {"trial_s": round(seconds, 1), "first_trial_s": round(seconds + start, 1)})
    return out


MEASURED_SPREAD = 0.045  # CV of 5 trials of one config on this CPU (bench/RESULTS.md)
SLOWED = 0.85  # a loaded measurement below this share of the calm one was slowed by the load


def loaded() -> list[dict]:
    """The measured grid as a machine shared with other work measures it (see above)."""
    knob_names = ("per_device_batch_size", "gradient_accumulation_steps", "num_workers",
                  "max_seq_length", "packing", "attn_implementation")  # fmt: skip

    def read(name: str) -> dict[tuple, dict]:
        rows = [json.loads(line) for line in (HERE / name).read_text().splitlines() if line]
        return {tuple(r[k] for k in knob_names): r for r in rows}

    calm, contended = read("cpu-grid.jsonl"), read("cpu-grid-contended.jsonl")
    ratio = {k: contended[k]["samples_per_s"] / calm[k]["samples_per_s"] for k in calm}
    slowed = sorted(r for r in ratio.values() if r < SLOWED)
    median = slowed[len(slowed) // 2]
    share = len(slowed) / len(ratio)
    return [
        row | {"noise": MEASURED_SPREAD, "contended_share": round(share, 3),
               "slowdown": round(ratio[k] if ratio[k] < SLOWED else median, 4)}
        for k, row in calm.items()
    ]  # fmt: skip


def write(name: str, rows: list[dict]) -> None:
    path = HERE / f"{name}.jsonl"
    rows = timed(name, rows)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    ok = [r for r in rows if r["status"] == "ok"]
    best = max(r["tokens_per_s"] for r in ok)
    print(f"{path}: {len(rows)} configs, {len(rows) - len(ok)} failing, best {best:,.0f} tokens/s")


if __name__ == "__main__":
    write("oom-wall", oom_wall(random.Random(1)))
    write("interactions", interactions(random.Random(2)))
    write("noisy", interactions(random.Random(2), noise=0.10))
    write("cpu-grid-loaded", loaded())
    write("held-out", held_out(random.Random(3)))
    write("held-out-lora", held_out_lora(random.Random(4)))
    write("qlora-24gb", qlora_24gb(random.Random(5)))
    for measured in ("cpu-grid", "cpu-grid-contended"):  # the measured grids: times only
        write(measured, [json.loads(x) for x in (HERE / f"{measured}.jsonl").open() if x.strip()])
