"""A LoRA chat fine-tune with TRL's ``SFTTrainer`` and peft: the kind of train.py you already
have, with sweeper's one line (``callbacks=[sweeper.callback()]``). Run it yourself as usual:

    python examples/sft_lora/train.py --model_name_or_path my-job/model \\
        --data_file my-job/chats.jsonl --output_dir out --per_device_train_batch_size 8 \\
        --max_length 1024 --packing True --lora_r 16 --lora_alpha 32 --bf16 True

and sweep it with ``examples/sft_lora/space.yaml`` (``engine: script``, ``knobs: sft_flags``):
each trial runs this file with the trial's knobs as the SFTConfig flags above (the
TrainingArguments ones, and SFTConfig's own --max_length, --packing and --packing_strategy), and
the knob that is not an SFTConfig field (the attention kernel, chosen when the model loads)
comes from ``sweeper.trial_config()``. The space's ``workload.adapter`` says the same LoRA
settings as the defaults below, so sweeper counts (and checkpoints) only the adapter as
training. Outside a trial the callback does nothing and ``trial_config()`` is None.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from datasets import load_dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer, TrlParser

import sweeper


@dataclass
class ScriptArguments:
    model_name_or_path: str = field(metadata={"help": "a local model directory or hub id"})
    data_file: str = field(metadata={"help": "chat records, JSONL with a 'messages' column"})
    attn_implementation: str = field(default="sdpa")


@dataclass
class LoraArguments:
    lora_r: int = field(default=16, metadata={"help": "the adapter's rank"})
    lora_alpha: int = field(default=32)
    lora_dropout: float = field(default=0.05)
    lora_target_modules: str = field(
        default="all-linear", metadata={"help": "all-linear, or names: q_proj,v_proj"}
    )


def main() -> None:
    parser = TrlParser((ScriptArguments, SFTConfig, LoraArguments))
    script, training, lora = parser.parse_args_and_config()
    trial = sweeper.trial_config()  # None outside a sweeper trial
    if trial is not None:  # the knob that is not an SFTConfig field
        script.attn_implementation = trial["attn_implementation"]

    tokenizer = AutoTokenizer.from_pretrained(script.model_name_or_path)
    # fp32 weights: --bf16/--fp16 train them under autocast, as Trainer does
    model = AutoModelForCausalLM.from_pretrained(
        script.model_name_or_path,
        attn_implementation=script.attn_implementation,
        dtype=torch.float32,
    )
    targets = lora.lora_target_modules
    peft_config = LoraConfig(
        r=lora.lora_r,
        lora_alpha=lora.lora_alpha,
        lora_dropout=lora.lora_dropout,
        target_modules=targets if targets == "all-linear" else targets.split(","),
        task_type="CAUSAL_LM",
    )

    rows = load_dataset("json", data_files=script.data_file, split="train")
    trainer = SFTTrainer(
        model=model,
        args=training,
        train_dataset=rows,  # conversational: SFTTrainer applies the chat template
        processing_class=tokenizer,
        peft_config=peft_config,  # only the adapter trains
        callbacks=[sweeper.callback()],  # sweeper's one line
    )
    trainer.train()
    trainer.save_model()  # the adapter's weights


if __name__ == "__main__":
    main()
