"""Peak dense tensor throughput per accelerator, for MFU (plain data: no torch here).

Figures are the vendors' dense (no sparsity) peaks in TFLOPS, per GPU. MFU = achieved model
FLOPs ÷ the peak for the precision the matmuls run in: bf16/fp16 autocast → ``bf16``; fp32 with
TF32 allowed → ``tf32``; plain fp32 → ``fp32``. CPUs have no entry: MFU is left empty there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PeakFlops:
    name: str
    bf16: float
    tf32: float
    fp32: float

    def tflops(self, math_mode: str) -> float:
        return {"bf16": self.bf16, "tf32": self.tf32, "fp32": self.fp32}[math_mode]


# Order matters: the first entry whose every token appears in the device name wins, so the
# more specific names (H100 PCIe, H100 NVL) come before the generic H100 (SXM, "HBM3").
PEAK_FLOPS: tuple[tuple[tuple[str, ...], PeakFlops], ...] = (
    (("h200", "nvl"), PeakFlops("H200 NVL", bf16=835.5, tf32=417.5, fp32=60.0)),
    (("h200",), PeakFlops("H200 SXM", bf16=989.4, tf32=494.7, fp32=66.9)),
    (("h100", "pcie"), PeakFlops("H100 PCIe", bf16=756.5, tf32=378.0, fp32=51.2)),
    (("h100", "nvl"), PeakFlops("H100 NVL", bf16=835.5, tf32=417.5, fp32=60.0)),
    (("h100",), PeakFlops("H100 SXM", bf16=989.4, tf32=494.7, fp32=66.9)),
    (("gh200",), PeakFlops("GH200", bf16=989.4, tf32=494.7, fp32=66.9)),
    (("a100",), PeakFlops("A100", bf16=312.0, tf32=156.0, fp32=19.5)),
    (("l40s",), PeakFlops("L40S", bf16=362.05, tf32=183.0, fp32=91.6)),
    (("l40",), PeakFlops("L40", bf16=181.0, tf32=90.5, fp32=90.5)),
    (("l4",), PeakFlops("L4", bf16=121.0, tf32=60.0, fp32=30.3)),
    (("a10g",), PeakFlops("A10G", bf16=70.0, tf32=35.0, fp32=31.2)),
    (("a10",), PeakFlops("A10", bf16=125.0, tf32=62.5, fp32=31.2)),
    # GeForce cards: bf16 with fp32 accumulate (what autocast training uses) is half the
    # fp16-accumulate figure marketing quotes.
    (("rtx", "4090"), PeakFlops("RTX 4090", bf16=165.2, tf32=82.6, fp32=82.6)),
    (("rtx", "3090"), PeakFlops("RTX 3090", bf16=71.0, tf32=35.6, fp32=35.6)),
    (("rtx", "6000", "ada"), PeakFlops("RTX 6000 Ada", bf16=364.2, tf32=182.1, fp32=91.1)),
    (("v100",), PeakFlops("V100", bf16=125.0, tf32=15.7, fp32=15.7)),
)


def peak_flops(device_name: str) -> PeakFlops | None:
    """The table entry for a CUDA device name, or None if unknown (or a CPU).

    >>> peak_flops("NVIDIA H100 80GB HBM3").name
    'H100 SXM'
    >>> peak_flops("NVIDIA H100 PCIe").name
    'H100 PCIe'
    >>> peak_flops("NVIDIA GeForce RTX 4090").bf16
    165.2
    >>> peak_flops("AMD EPYC 7B13") is None
    True
    """
    # names split into exact tokens: "NVIDIA A100-SXM4-80GB" → a100, sxm4, 80gb; so "l4"
    # never matches "l40s"
    tokens = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    for keys, peak in PEAK_FLOPS:
        if all(key in tokens for key in keys):
            return peak
    return None


def math_mode(precision: str, tf32: bool) -> str:
    """Which peak applies: autocast bf16/fp16 → bf16 tensor cores; fp32 → tf32 or fp32."""
    if precision in ("bf16", "fp16"):
        return "bf16"
    return "tf32" if tf32 else "fp32"
