"""What a real CUDA process holds besides the traced tensors, each rule cited to its source.

Two kinds: memory *outside* the caching allocator (the CUDA context with the kernels loaded
into it, which nvidia-smi shows but ``max_memory_reserved`` does not), and allocations the
libraries make *through* the allocator that no traced tensor owns (cuBLAS workspaces).

Known limitations: context sizes are measured values for a few cards and CUDA versions
(±150 MiB between drivers and cards); cuDNN convolution workspaces are not added because
PyTorch skips any algorithm whose workspace does not fit (see ``CUDNN_WORKSPACE_NOTE``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from memcalc.gpus import GpuSpec

MIB = 1 << 20


class ModuleLoading(str, Enum):
    """``CUDA_MODULE_LOADING``: PyTorch ≥ 1.13 sets LAZY when CUDA ≥ 11.7 (pytorch#86509)."""

    LAZY = "lazy"
    EAGER = "eager"


@dataclass(frozen=True)
class ContextRow:
    """Device memory outside the allocator during training, as nvidia-smi counts it."""

    loading: ModuleLoading
    context_bytes: int
    source: str


# Measured nvidia-smi minus max_memory_reserved during training; one row per loading mode.
CONTEXT_TABLE: dict[ModuleLoading, ContextRow] = {
    ModuleLoading.LAZY: ContextRow(
        ModuleLoading.LAZY, 648_529_920,
        "optimum-benchmark (Hugging Face) GPT-2 training, torch 2.3.0+cu121: max_global_vram "
        "3559.39 MB - max_reserved 2910.85 MB; bare context with lazy loading is 287 MB "
        "(pytorch#86509), kernels loaded by a training step add the rest"),
    ModuleLoading.EAGER: ContextRow(
        ModuleLoading.EAGER, 1343 * MIB,
        "Hugging Face 'Model training anatomy' guide: 1343 MiB after the first CUDA tensor, "
        "V100-SXM2-16GB, CUDA 11.2 (every kernel loaded at start-up)"),
}

# cuDNN's convolution kernels loaded lazily on the first conv: a tiny CNN measured about
# 250 MiB above a tiny MLP on one A100 (nvidia-smi, same torch build).
CUDNN_KERNELS_BYTES = 250 * MIB

# CublasHandlePool.cpp, getChosenWorkspaceSize(): 4096 KiB x 2 + 16 KiB x 8 by default,
# 32 MiB on compute capability 9.0 and newer. One workspace per (handle, stream); handles are
# per thread, and autograd runs backward on its own device thread, so a training step that
# multiplies matrices in forward and backward holds two.
CUBLAS_WORKSPACE_BYTES_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_BYTES_HOPPER = 4096 * 8 * 1024
CUBLAS_HANDLE_THREADS = 2

CUDNN_WORKSPACE_NOTE = (
    "cuDNN convolution workspaces are not added: PyTorch tries cuDNN's algorithms in order and "
    "skips one whose workspace allocation fails (aten/src/ATen/native/cudnn/Conv_v7.cpp, "
    "Conv_v8.cpp catch the out-of-memory error), so they use memory that is free rather than "
    "cause an OOM; the headroom leaves room for them")


def cublas_workspace_bytes(gpu: GpuSpec | None) -> int:
    """One cuBLAS workspace for this card (the pre-Hopper default when the card is unknown)."""
    if gpu is not None and gpu.compute_capability_tuple >= (9, 0):
        return CUBLAS_WORKSPACE_BYTES_HOPPER
    return CUBLAS_WORKSPACE_BYTES_DEFAULT


def workspace_allocations(gpu: GpuSpec | None, uses_matmul: bool) -> list[int]:
    """Sizes of the cuBLAS workspaces a training step allocates through the caching allocator."""
    if not uses_matmul:
        return []
    return [cublas_workspace_bytes(gpu)] * CUBLAS_HANDLE_THREADS


def context_bytes(loading: ModuleLoading, uses_conv: bool) -> int:
    """CUDA context and loaded kernels, outside the caching allocator."""
    extra = CUDNN_KERNELS_BYTES if uses_conv and loading is ModuleLoading.LAZY else 0
    return CONTEXT_TABLE[loading].context_bytes + extra
