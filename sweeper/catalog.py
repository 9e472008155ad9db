"""The GPU catalog: GPU types with their price, peaks, memory and interconnect, each figure with
its source and date (``sweeper/gpus.yaml``, shipped; a user's copy with ``--catalog FILE`` or a
space's ``hardware.catalog``). ``sweeper.predict`` estimates a job on a GPU from it.

    catalog = load_catalog()                      # the shipped file
    key, gpu = catalog.find("NVIDIA H100 80GB HBM3")  # → "h100-sxm", its entry
    gpu.tflops.peak("bf16"), gpu.memory_bandwidth_gbs, gpu.price.usd_per_hour

A mistake in a catalog file is a ``CatalogError`` naming ``file:line: field: problem``.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sweeper import yamllines
from sweeper.errors import CatalogError

SHIPPED = Path(__file__).with_name("gpus.yaml")
KEY_PATTERN = r"^[a-z0-9][a-z0-9-]{0,39}$"
GpuKey = Annotated[str, Field(pattern=KEY_PATTERN)]
# A catalog file is a page or two of YAML; a larger one is the wrong file.
MAX_CATALOG_BYTES = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Source(_Strict):
    """Where figures come from: a datasheet, a price page, a note."""

    title: str = Field(min_length=1)
    url: str | None = None
    published: str = Field(
        pattern=r"^\d{4}(-\d{2}(-\d{2})?)?$", description="YYYY, YYYY-MM or YYYY-MM-DD"
    )


class Tflops(_Strict):
    """Dense (no sparsity) peaks per GPU, TFLOP/s."""

    bf16: float = Field(gt=0)
    fp16: float = Field(gt=0)
    fp8: float | None = Field(default=None, gt=0, description="None: no fp8 tensor cores")
    tf32: float = Field(gt=0)
    fp32: float = Field(gt=0)

    def peak(self, math_mode: str) -> float | None:
        """The peak the matmuls of ``math_mode`` run at (``sweeper.hardware.math_mode``)."""
        return {
            "bf16": self.bf16,
            "fp16": self.fp16,
            "fp8": self.fp8,
            "tf32": self.tf32,
            "fp32": self.fp32,
        }.get(math_mode)


class Interconnect(_Strict):
    kind: Literal["nvlink", "pcie"]
    gbs: float = Field(gt=0, description="GB/s between GPUs of one machine")


class Price(_Strict):
    usd_per_hour: float = Field(gt=0, description="on-demand $ per GPU-hour")
    source: str = Field(min_length=1, description="a key of the catalog's sources")


class Gpu(_Strict):
    """One GPU type."""

    name: str = Field(min_length=1)
    match: list[str] = Field(min_length=1)
    specs_from: str = Field(min_length=1, description="a key of the catalog's sources")
    tflops: Tflops
    memory_gb: float = Field(gt=0)
    memory_bandwidth_gbs: float = Field(gt=0)
    interconnect: Interconnect
    price: Price

    @property
    def memory_bytes(self) -> float:
        """The datasheet's GB as bytes: what a job may count on (the device reports 0-6% more
        on the GPUs of the shipped catalog; ECC and the driver take some)."""
        return self.memory_gb * 1e9


class Catalog(_Strict):
    version: Literal[1]
    sources: dict[str, Source]
    gpus: dict[GpuKey, Gpu] = Field(min_length=1)
    path: str = Field(default="", exclude=True, description="the file it was read from")

    @model_validator(mode="after")
    def _sources_exist(self) -> Catalog:
        for key, gpu in self.gpus.items():
            for field, name in (("specs_from", gpu.specs_from), ("price", gpu.price.source)):
                if name not in self.sources:
                    where = "price.source" if field == "price" else field
                    raise ValueError(
                        f"gpus.{key}.{where}: {name!r} is not one of the sources "
                        f"({', '.join(self.sources)}); add it under sources:"
                    )
        return self

    def find(self, name: str) -> tuple[str, Gpu] | None:
        """The entry a device or hardware name is, or None: the entry whose ``match`` has the
        most words, all of them in the name (ties: the first in the file).

        >>> catalog = load_catalog()
        >>> [catalog.find(n)[0] for n in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
        ...                               "NVIDIA A100-SXM4-40GB", "NVIDIA L40S", "NVIDIA L4")]
        ['h100-sxm', 'h100-pcie', 'a100-40gb', 'l40s', 'l4']
        >>> catalog.find("AMD EPYC 7B13") is None
        True
        """
        tokens = set(words(name))
        found: tuple[int, str, Gpu] | None = None
        for key, gpu in self.gpus.items():
            for pattern in gpu.match:
                need = words(pattern)
                if need and set(need) <= tokens and (found is None or len(need) > found[0]):
                    found = (len(need), key, gpu)
        return None if found is None else (found[1], found[2])

    @property
    def label(self) -> str:
        """How messages name this catalog: the shipped one by that name (its path is the
        server's install, of no use to a REST client), a user's file by its path."""
        if not self.path or self.path == str(SHIPPED):
            return "the shipped catalog (sweeper/gpus.yaml)" if self.path else "the catalog given"
        return f"the catalog {self.path}"

    def get(self, key: str, where: str = "GPU type") -> Gpu:
        """The entry ``key``; a CatalogError listing the catalog's keys otherwise."""
        if key not in self.gpus:
            raise CatalogError(
                f"{where} {key!r} is not in {self.label}: it has {', '.join(self.gpus)}"
            )
        return self.gpus[key]

    def provenance(self, key: str) -> str:
        """'specs: NVIDIA H100 ... datasheet (2023-05); price: seed 000's notes (2025-10)'."""
        gpu = self.gpus[key]
        specs, price = self.sources[gpu.specs_from], self.sources[gpu.price.source]
        return f"specs: {specs.title} ({specs.published}); price: {price.title} ({price.published})"


def words(name: str) -> list[str]:
    """A name's words, lower case: ``"NVIDIA A100-SXM4-40GB"`` → nvidia, a100, sxm4, 40gb."""
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def parse_catalog(text: str, source: str = "<catalog>") -> Catalog:
    """A catalog from YAML text; CatalogError naming ``source:line: field: problem``."""
    data, lines = yamllines.load(text, source, CatalogError)
    if not isinstance(data, dict):
        raise CatalogError(f"{source}:1: a catalog is a mapping with version, sources and gpus")
    try:
        return Catalog.model_validate(data).model_copy(update={"path": source})
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = tuple(err["loc"])
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                message = "unknown key; remove it or check its spelling"
            elif err["type"] == "missing":
                message = "required key is missing"
            elif not isinstance(err.get("input"), dict | list) and loc:
                message += f" (got {err.get('input')!r})"
            if not loc and (named := re.match(r"gpus\.([\w-]+)\.([\w.]+):", message)):
                loc = ("gpus", named.group(1), *named.group(2).split("."))
                message = message.split(": ", 1)[1]
            field = ".".join(str(part) for part in loc) or "(top level)"
            problems.append(f"{source}:{yamllines.line_for(loc, lines)}: {field}: {message}")
        raise CatalogError("\n".join(problems)) from None


def load_catalog(path: str | Path | None = None) -> Catalog:
    """The catalog in ``path``, or the shipped one (read once per process)."""
    if path is None:
        return _shipped()
    path = Path(path)
    try:
        with path.open("rb") as file:
            data = file.read(MAX_CATALOG_BYTES + 1)
    except OSError as e:
        raise CatalogError(
            f"{path}: cannot read the GPU catalog: {e.strerror} (copy {SHIPPED} and edit it)"
        ) from e
    if len(data) > MAX_CATALOG_BYTES:
        raise CatalogError(f"{path}: larger than 1 MiB, so not a GPU catalog")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise CatalogError(f"{path}:{line}: not UTF-8 text; save the file as UTF-8") from None
    return parse_catalog(text, str(path))


@cache
def _shipped() -> Catalog:
    return parse_catalog(SHIPPED.read_text(encoding="utf-8"), str(SHIPPED))


# An offer: N GPUs of one catalog type in one machine ("4x a100-40gb", "h200-sxm").
OFFER_PATTERN = r"^\s*(?:(\d{1,3})\s*[x×]\s*)?([a-z0-9][a-z0-9-]{0,39})\s*$"


def parse_offer(text: str) -> tuple[int, str]:
    """(GPU count, catalog key) of an offer.

    >>> parse_offer("4x a100-40gb"), parse_offer("h200-sxm")
    ((4, 'a100-40gb'), (1, 'h200-sxm'))
    """
    found = re.match(OFFER_PATTERN, text)
    if found is None or (found.group(1) is not None and int(found.group(1)) < 1):
        raise CatalogError(
            f"{text!r} is not an offer: write a catalog key, or N x key (e.g. 4x a100-40gb)"
        )
    return int(found.group(1) or 1), found.group(2)
