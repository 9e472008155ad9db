"""Padding-free batches on the CPU, for real: transformers 5.x builds a block-diagonal mask from
the position ids for sdpa and eager (``masking_utils.find_packed_sequence_indices``) when a
batch comes without an attention mask and without a cache, so a flattened row's samples do
not see each other. The proof is the logits: a sample's logits in a flattened row equal its
logits alone. The accounting counts real tokens and samples, not rows."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch

from sweeper.errors import TrialError
from sweeper.space import Space
from sweeper.trial.engines import count_batch, flattened
from sweeper.trial.engines.readback import (
    Running,
    check,
    float8_linears,
    read,
    separates_samples,
)
from sweeper.trial.protocol import PreparedData
from sweeper.trial.recipe import Recording, Step
from sweeper.trial.workload import Collator, Flattening
from tests.helpers import SessionForkServer, tiny_config, trial_request

pytestmark = pytest.mark.torch


def _model(arch: str, attn: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    sizes = (
        {"n_embd": 32, "n_layer": 2, "n_head": 4, "bos_token_id": 0, "eos_token_id": 0}
        if arch == "gpt2"
        else {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 4, "intermediate_size": 64}
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(arch, vocab_size=97, **sizes), attn_implementation=attn
    )
    model.config.use_cache = False  # as the engines build it: a cache turns the detection off
    return model.eval()


SAMPLES = [[5, 17, 33, 2, 9, 41, 8], [60, 3, 12, 71, 22], [11, 90, 4, 4, 50, 13, 7, 66, 1]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_a_flattened_row_keeps_its_samples_apart(arch: str, attn: str) -> None:
    model = _model(arch, attn)
    batch = Flattening()(SAMPLES)  # what the engines feed: transformers' collator
    assert flattened(batch) and batch["input_ids"].shape == (1, sum(map(len, SAMPLES)))
    with torch.no_grad():
        row = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
        start = 0
        for sample in SAMPLES:
            alone = model(input_ids=torch.tensor([sample])).logits
            inside = row[:, start : start + len(sample)]
            assert torch.allclose(inside, alone, atol=1e-5), (arch, attn, start)
            start += len(sample)
        # the same row with a mask of ones (packing as sweeper's packed stream does it) mixes
        mixed = model(
            input_ids=batch["input_ids"], attention_mask=torch.ones_like(batch["input_ids"])
        ).logits
    second = slice(len(SAMPLES[0]), len(SAMPLES[0]) + len(SAMPLES[1]))
    assert not torch.allclose(mixed[:, second], row[:, second], atol=1e-3)
    assert separates_samples(model, torch.device("cpu"), contextlib.nullcontext)
    # each sample's first label is not predicted from the sample before it
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
    assert starts == [0, 7, 12] and (batch["labels"][0, starts] == -100).all()


class _IgnoresPositions(torch.nn.Module):
    """A model whose forward drops the position ids (as a custom model may): its attention
    then runs over the whole row."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def get_base_model(self) -> Any:  # as peft's wrapper answers
        return self.inner

    def forward(self, input_ids: Any, position_ids: Any = None, **kwargs: Any) -> Any:
        return self.inner(input_ids=input_ids, **kwargs)


def _running(model: Any, loader: Any, **fields: Any) -> Running:
    return Running(
        device=torch.device("cpu"),
        model=model,
        runnables=[model],
        optimizer=torch.optim.AdamW(model.parameters()),
        loader=loader,
        micro_batches=1,
        widest_row=9,
        compute_dtype=torch.float32,
        **fields,
    )


def test_attention_across_samples_is_caught_and_fails_the_trial() -> None:
    model = _IgnoresPositions(_model("llama", "sdpa"))
    assert not separates_samples(model, torch.device("cpu"), contextlib.nullcontext)
    loader = torch.utils.data.DataLoader(SAMPLES, batch_size=3, collate_fn=Flattening())
    config = tiny_config(per_device_batch_size=3, padding_free=True).model_dump()
    running = _running(model, loader, flattened=True, separates_samples=False)
    assert read("loop", running, config).effective["padding_free"] == (
        "DataCollatorWithFlattening, but the sdpa attention attended across the samples"
    )
    with pytest.raises(TrialError) as failure:
        check("loop", running, config)
    assert failure.value.kind == "mismatch" and "padding_free: asked True" in failure.value.message
    # the padded collator is not padding-free, whatever the config says
    padded = torch.utils.data.DataLoader(SAMPLES, batch_size=3, collate_fn=Collator(0, 16, False))
    assert read("loop", _running(model, padded), config).effective["padding_free"] is False


def test_fp8_that_converted_nothing_reads_back_as_the_bf16_it_ran() -> None:
    """A model whose float8 conversion did nothing (here: none was possible, torchao is not
    on this machine; on a GPU: layers torchao's filter skipped, or a stack that ignored fp8)
    computes under bf16 autocast: the read-back says bf16 and the trial fails as a mismatch."""
    from sweeper.trial.engines.readback import ComputeDtype
    from sweeper.trial.workload import mixed_precision

    model = _model("llama", "sdpa")
    computed = ComputeDtype(model)
    with mixed_precision(torch.device("cpu"), "fp8")():
        model(input_ids=torch.tensor([SAMPLES[0]]))
    computed.remove()
    converted, linears = float8_linears(model)
    assert converted == 0 and linears == 2 * 7 + 1  # q k v o gate up down per layer, the head
    loader = torch.utils.data.DataLoader(SAMPLES, batch_size=3, collate_fn=Collator(0, 16, False))
    running = _running(model, loader)
    running.compute_dtype = computed.dtype
    config = tiny_config(per_device_batch_size=3, precision="fp8").model_dump()
    with pytest.raises(TrialError) as failure:
        check("loop", running, config)
    assert "precision: asked 'fp8', ran 'bf16'" in failure.value.message


def test_tokens_and_samples_are_counted_without_padding() -> None:
    """A batch with known padding: 7 + 5 + 9 real tokens in 3 rows of 9 (27 computed); the same
    samples padding-free: 21 tokens, all real, still 3 samples."""
    padded = count_batch(Collator(pad_id=0, max_length=16, pad_to_max=False)(SAMPLES))
    assert padded == {"rows": 3, "real_tokens": 21, "padded_tokens": 27}
    flat = count_batch(Flattening()(SAMPLES))
    assert flat == {"rows": 3, "real_tokens": 21, "padded_tokens": 21}
    step = Step(rows=3, real_tokens=21, padded_tokens=27, time_s=1.0)
    summary = Recording(burn_in=[step], window=[step, step], window_s=2.0).summary()
    assert summary["tokens_per_s"] == 21.0 and summary["padded_tokens_per_s"] == 27.0
    assert summary["padding_share"] == pytest.approx(6 / 27)
    assert summary["mean_sample_tokens"] == 7.0 and summary["mean_row_tokens"] == 9.0


def _trial(
    run_forked: SessionForkServer,
    space: Space,
    prepared: PreparedData,
    cache_dir: Path,
    engine: str,
    **knobs: Any,
) -> Any:
    engine_space = space.model_copy(
        update={"workload": space.workload.model_copy(update={"engine": engine})}
    )
    run = run_forked(
        trial_request(
            engine_space,
            prepared,
            cache_dir,
            tiny_config(**knobs),
            warmup={"min_steps": 1, "max_steps": 2},
            measure={"min_steps": 3, "max_steps": 3},
        ),
        timeout_s=300,
    )
    assert run.result.status == "ok", (run.result.failure_message, run.log_tail[-2000:])
    return run.result.payload


@pytest.mark.parametrize("engine", ["loop", "sft"])
def test_padding_free_trains_and_counts_only_real_tokens(
    run_forked: SessionForkServer,
    tiny_space: Space,
    tiny_prepared: PreparedData,
    cache_dir: Path,
    engine: str,
) -> None:
    # samples of 100-1,500 tokens (tiny_prepared): at 384 many are shorter, so rows pad
    knobs = {"per_device_batch_size": 4, "gradient_accumulation_steps": 1, "max_seq_length": 384}
    m = _trial(run_forked, tiny_space, tiny_prepared, cache_dir, engine, padding_free=True, **knobs)
    assert m["effective"]["padding_free"] is True  # the collator flattened, the model separated
    assert m["cross_sample_attention"] is False
    assert m["padding_share"] == 0 and m["tokens_per_s"] == m["padded_tokens_per_s"]
    # a row holds the batch's 4 samples: samples, not rows, are counted
    assert m["samples_per_s"] == pytest.approx(m["it_per_s"] * 4)
    # MFU's FLOPs are the real tokens' (on a CPU there is no peak, the FLOPs are still counted)
    assert m["achieved_tflops"] * 1e12 == pytest.approx(m["flops_per_token"] * m["tokens_per_s"])
    if engine == "loop":
        padded = _trial(run_forked, tiny_space, tiny_prepared, cache_dir, engine, **knobs)
        assert padded["padding_share"] > 0 and padded["cross_sample_attention"] is None
        assert padded["achieved_tflops"] * 1e12 == pytest.approx(
            padded["flops_per_token"] * padded["tokens_per_s"]
        )


def test_sweepers_packed_rows_are_flagged_as_attending_across_samples(
    run_forked: SessionForkServer, tiny_space: Space, tiny_prepared: PreparedData, cache_dir: Path
) -> None:
    m = _trial(
        run_forked, tiny_space, tiny_prepared, cache_dir, "loop", packing=True, max_seq_length=64
    )
    assert m["cross_sample_attention"] is True and m["padding_share"] == 0
