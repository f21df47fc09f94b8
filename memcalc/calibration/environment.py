"""The floor of a CUDA training process: context, library handles, their workspaces.

Each stage is measured as NVML's bytes for this process minus the caching allocator's
reserved bytes (what lies outside the allocator), and the allocator bytes that stay
allocated once every tensor is gone (library workspaces made through the allocator).
"""

from __future__ import annotations

import gc
import os

import torch

from memcalc.calibration import nvml


def versions() -> dict[str, str]:
    """What the measurements depend on, as this process sees it."""
    properties = torch.cuda.get_device_properties(0)
    return {
        "gpu": properties.name,
        "compute_capability": f"{properties.major}.{properties.minor}",
        "total_memory_bytes": str(properties.total_memory),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "driver": nvml.driver_version(),
        "nvml_total_memory_bytes": str(nvml.device_total_bytes()),
        "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", "(unset: LAZY)"),
        "pytorch_cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }


def _stage() -> dict[str, int | None]:
    torch.cuda.synchronize()
    used = nvml.process_used_bytes()
    reserved = torch.cuda.memory_reserved()
    return {"process_bytes": used, "reserved_bytes": reserved,
            "allocated_bytes": torch.cuda.memory_allocated(),
            "outside_bytes": None if used is None else used - reserved}


def _matmul_step() -> None:
    """A linear layer's forward and backward: forward on this thread, backward on autograd's
    device thread, each with its own cuBLAS handle and workspace."""
    weight = torch.randn(512, 512, device="cuda", requires_grad=True)
    inputs = torch.randn(64, 512, device="cuda", requires_grad=True)
    (inputs @ weight).sum().backward()


def _conv_step() -> None:
    conv = torch.nn.Conv2d(16, 16, 3, padding=1).cuda()
    conv(torch.randn(4, 16, 32, 32, device="cuda", requires_grad=True)).sum().backward()


STEPS = {"cublas": _matmul_step, "cudnn": _conv_step}


def measure_floor(order: tuple[str, ...] = ("cublas", "cudnn")) -> dict[str, dict[str, int | None]]:
    """Stages: ``context`` (first CUDA tensor), then after each library's first forward and
    backward in ``order`` (``cublas``: a matmul; ``cudnn``: a convolution). Call it in a
    fresh process before any other CUDA work."""
    torch.empty(1, device="cuda")
    stages = {"context": _stage()}
    for name in order:
        STEPS[name]()
        gc.collect()
        stages[name] = _stage()
    return stages
