"""REST: the hardware/price catalog, under /api/catalog."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import StoreDep
from api.schemas import Accelerator, Catalog, PricedHardware
from sweeper.catalog import load_catalog
from sweeper.hardware import PEAK_FLOPS

router = APIRouter(prefix="/api", tags=["catalog"])


@router.get("/catalog", response_model=Catalog)
def catalog(store: StoreDep) -> Catalog:
    """Accelerators with their dense peak TFLOPS (the MFU table), every hardware/price pair
    the stored studies ran at (the prices you gave in your space files), and the shipped GPU
    catalog: a typical price per GPU type with its source and date (rental prices move weekly:
    a space's ``hardware.catalog`` points at your own copy)."""
    accelerators = [
        Accelerator(
            name=peak.name,
            bf16_tflops=peak.bf16,
            tf32_tflops=peak.tf32,
            fp32_tflops=peak.fp32,
        )
        for _, peak in PEAK_FLOPS
    ]
    priced: dict[tuple[str, str, float], list[str]] = {}
    for study, _ in store.list_studies():
        key = (study.hardware_name, study.device, study.usd_per_hour)
        priced.setdefault(key, []).append(study.name)
    return Catalog(
        accelerators=accelerators,
        hardware_in_use=[
            PricedHardware(hardware_name=name, device=device, usd_per_hour=price, studies=names)
            for (name, device, price), names in sorted(priced.items())
        ],
        gpu_catalog=load_catalog(),
    )
