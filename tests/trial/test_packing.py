"""Packing: samples are concatenated into fixed blocks; nothing is padded and nothing is cut."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from sweeper.trial.workload import Collator, PackedStream

SAMPLES = [[i] * n + [0] for i, n in enumerate([3, 17, 1, 40, 8, 8, 25, 2, 11, 6], start=1)]


def _blocks(stream: PackedStream, count: int) -> list[list[int]]:
    iterator = iter(stream)
    return [next(iterator) for _ in range(count)]


def test_blocks_are_the_samples_in_order_cut_at_the_block_size() -> None:
    stream = PackedStream(SAMPLES, block=16, seed=3)
    total = sum(len(s) for s in SAMPLES)
    blocks = _blocks(stream, total // 16)
    assert all(len(b) == 16 for b in blocks)
    order = torch.randperm(len(SAMPLES), generator=torch.Generator().manual_seed(3)).tolist()
    flat = [token for index in order for token in SAMPLES[index]]
    assert sum(blocks, []) == flat[: len(blocks) * 16]  # a long sample continues, never cut


def test_workers_read_disjoint_shares_and_the_collator_pads_nothing() -> None:
    loader = DataLoader(
        PackedStream(SAMPLES, block=8),
        batch_size=2,
        num_workers=2,
        collate_fn=Collator(pad_id=-1, max_length=8, pad_to_max=True),
    )
    batches = []
    for batch in loader:
        batches.append(batch)
        if len(batches) == 6:
            break
    for batch in batches:
        assert batch["input_ids"].shape == (2, 8)
        assert bool(batch["attention_mask"].all()) and bool((batch["labels"] != -100).all())


@pytest.mark.parametrize("strategy", ["wrapped", "bfd", "bfd_split"])
def test_the_guard_says_which_of_trls_packings_cut_as_trl_does(strategy: str) -> None:
    """The truncation guard's word on each ``packing_strategy`` (recommend.packing_cuts)
    against what the installed TRL's own packing keeps of samples longer than a row."""
    from datasets import Dataset
    from trl import pack_dataset

    from sweeper.recommend import StudyFacts, packing_cuts

    lengths = [3, 11, 5, 2, 9, 4]  # two samples longer than the 8-token rows
    samples = [[100 * i + j for j in range(n)] for i, n in enumerate(lengths)]
    packed = pack_dataset(Dataset.from_dict({"input_ids": samples}), 8, strategy)
    kept = sorted(t for row in packed["input_ids"] for t in row)
    lost = sorted(t for s in samples for t in s if t not in set(kept))
    facts = StudyFacts(name="s", hardware_name="CPU", usd_per_hour=1.0)
    assert packing_cuts(facts, {"packing": True, "packing_strategy": strategy}) == bool(lost), lost
    assert all(len(row) <= 8 for row in packed["input_ids"])
