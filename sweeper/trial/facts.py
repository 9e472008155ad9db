"""What this machine can do (child side of ``sweeper doctor``): devices, versions, precisions,
attention packages, memory, CPU cores, and the size of the workload's model.

Every check is a real call on the device (a small autocast matmul, ``mem_get_info``), never a
guess from a table; a check that fails says why instead of raising.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

import torch

from sweeper.trial.measure import cpu_name, host_memory_bytes, nvidia_driver
from sweeper.trial.protocol import ChildRequest

# Packages whose presence changes what a sweep can search (attention kernels, compile, adapters).
_OPTIONAL_PACKAGES = (
    "accelerate",
    "flash_attn",
    "triton",
    "peft",
    "trl",
    "bitsandbytes",
    "liger_kernel",
    "torchao",  # fp8 training (precision: fp8)
    "kernels",
)


def machine_facts(request: ChildRequest) -> dict[str, Any]:
    import transformers

    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "packages": {name: _package(name) for name in _OPTIONAL_PACKAGES},
        "cpu": _cpu(),
        "cuda_available": torch.cuda.is_available(),
        "driver": nvidia_driver(),
        "devices": [],
    }
    if facts["cuda_available"]:
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["devices"] = [_cuda_device(index) for index in range(torch.cuda.device_count())]
        device = torch.device("cuda", 0)
    else:
        device = torch.device("cpu")
    facts["device_type"] = device.type
    facts["precisions"] = {
        "bf16": _autocast_works(device, torch.bfloat16),
        "fp16": _autocast_works(device, torch.float16),
        "tf32": _tf32(device),
    }
    facts["flex_attention"] = _importable("torch.nn.attention.flex_attention")
    facts["model"] = _model_size(request)
    return facts


def _package(name: str) -> dict[str, Any]:
    """Installed version and whether it imports (flash_attn often installs but fails to load
    against another torch build)."""
    distribution = {"flash_attn": "flash-attn", "liger_kernel": "liger-kernel"}.get(name, name)
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return {"installed": False, "version": None, "imports": False, "error": "not installed"}
    status = _importable(name)
    return {"installed": True, "version": version, **status}


def _importable(module: str) -> dict[str, Any]:
    try:
        importlib.import_module(module)
    except Exception as e:  # an import of a compiled extension fails in many ways
        return {"imports": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    return {"imports": True, "error": None}


def _cpu() -> dict[str, Any]:
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    quota = None
    with contextlib.suppress(OSError, ValueError):
        limit, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if limit != "max":
            quota = int(limit) / int(period)
    usable = min(x for x in (os.cpu_count(), affinity, quota) if x) if os.cpu_count() else None
    available = None
    with contextlib.suppress(ImportError):
        import psutil

        available = psutil.virtual_memory().available
    return {
        "name": cpu_name(),
        "logical_cores": os.cpu_count(),
        "affinity_cores": affinity,
        "cgroup_cores": quota,
        "usable_cores": usable,
        "torch_threads": torch.get_num_threads(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "memory_bytes": host_memory_bytes(),
        "memory_available_bytes": available,
    }


def _cuda_device(index: int) -> dict[str, Any]:
    properties = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    return {
        "index": index,
        "name": properties.name,
        "capability": f"{properties.major}.{properties.minor}",
        "multiprocessors": properties.multi_processor_count,
        "memory_bytes": total,
        "memory_free_bytes": free,
    }


def _autocast_works(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """A forward and backward matmul under autocast: does this precision run here at all?
    (Whether it is fast is the preflight probe's question.)"""
    if device.type == "cuda" and dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return {"runs": False, "error": "torch.cuda.is_bf16_supported() is False on this GPU"}
    try:
        weight = torch.randn(64, 64, device=device, requires_grad=True)
        with torch.autocast(device_type=device.type, dtype=dtype):
            out = torch.randn(8, 64, device=device) @ weight
        out.float().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ran_in = str(out.dtype).removeprefix("torch.")
    except Exception as e:  # an unsupported dtype raises RuntimeError or NotImplementedError
        return {"runs": False, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    if out.dtype != dtype:
        return {"runs": False, "error": f"autocast ran the matmul in {ran_in}"}
    return {"runs": True, "error": None}


def _tf32(device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return {"runs": False, "error": "TF32 is a CUDA tensor-core mode"}
    major, _minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return {"runs": False, "error": f"compute capability {major}.x; TF32 needs 8.0+"}
    return {"runs": True, "error": None}


def _model_size(request: ChildRequest) -> dict[str, Any]:
    """Parameters of the workload's full model, counted on the meta device (no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = request.workload.model
    try:
        if spec.id is not None:
            config = AutoConfig.from_pretrained(spec.id, trust_remote_code=spec.trust_remote_code)
        else:
            from sweeper.trial.workload import load_tokenizer, model_config

            assert request.prepared is not None
            config = model_config(request.workload, load_tokenizer(request.prepared), 128)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                config, trust_remote_code=spec.trust_remote_code
            )
    except Exception as e:  # offline hub id, unknown architecture: say so, do not fail
        return {"params": None, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    params = sum(p.numel() for p in model.parameters())
    trainable, adapter_error = params, None
    adapter = request.workload.adapter
    if adapter is not None:  # only the adapter trains: count it as peft builds it, on meta
        try:
            from peft import get_peft_model

            from sweeper.trial.workload import lora_config

            with torch.device("meta"):
                wrapped = get_peft_model(model, lora_config(adapter))
            trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
        except Exception as e:  # no peft, or target modules the model lacks
            trainable = None
            adapter_error = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    return {
        "params": params,
        "trainable": trainable,
        "adapter_error": adapter_error,
        "layers": getattr(config, "num_hidden_layers", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "error": None,
    }
