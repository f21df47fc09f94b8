"""What a real CUDA process holds besides the traced tensors, from the environment profile.

Two kinds: memory *outside* the caching allocator (the CUDA context with the kernels loaded
into it, which nvidia-smi shows but ``max_memory_reserved`` does not), and allocations the
libraries keep *through* the allocator that no traced tensor owns (cuBLAS workspaces).
cuDNN's per-call workspaces are put into the trace itself (``memcalc.trace.workspaces``).

Known limitations: eager module loading uses one published measurement (a V100, CUDA 11.2);
a profile's floor holds for the driver, CUDA and libraries it was measured with.
"""

from __future__ import annotations

from dataclasses import dataclass

from memcalc.device.env_profile import EnvProfile
from memcalc.device.gpus import GpuSpec
from memcalc.distributed.specs import ParallelSpec
from memcalc.specs import ModuleLoading

MIB = 1 << 20


@dataclass(frozen=True)
class ContextRow:
    """Device memory outside the allocator during training, as nvidia-smi counts it."""

    loading: ModuleLoading
    context_bytes: int
    source: str


# Eager loading puts every kernel of every library in the context at start-up, whatever the
# step uses; lazy loading is measured per environment (the profile's floor).
EAGER_CONTEXT = ContextRow(
    ModuleLoading.EAGER, 1343 * MIB,
    "Hugging Face 'Model training anatomy' guide: 1343 MiB after the first CUDA tensor, "
    "V100-SXM2-16GB, CUDA 11.2 (every kernel loaded at start-up)")

# CublasHandlePool.cpp, getChosenWorkspaceSize(): 4096 KiB x 2 + 16 KiB x 8 by default,
# 32 MiB on compute capability 9.0 and newer. One workspace per (handle, stream); handles are
# per thread, and autograd runs backward on its own device thread, so a training step that
# multiplies matrices in forward and backward holds two.
CUBLAS_WORKSPACE_BYTES_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_BYTES_HOPPER = 4096 * 8 * 1024


def cublas_workspace_bytes(gpu: GpuSpec | None) -> int:
    """One cuBLAS workspace by CublasHandlePool's rule (pre-Hopper when the card is unknown)."""
    if gpu is not None and gpu.compute_capability_tuple >= (9, 0):
        return CUBLAS_WORKSPACE_BYTES_HOPPER
    return CUBLAS_WORKSPACE_BYTES_DEFAULT


def workspace_allocations(profile: EnvProfile, gpu: GpuSpec | None,
                          uses_matmul: bool) -> list[int]:
    """Sizes of the cuBLAS workspaces a training step keeps in the caching allocator: the
    profile's measured size, or CublasHandlePool's rule when the profile has none."""
    if not uses_matmul:
        return []
    size = profile.cublas_workspace_bytes or cublas_workspace_bytes(gpu)
    return [size] * profile.cublas_handles


NCCL_COMMUNICATOR_BYTES = 688 * 10**6
NCCL_SOURCE = ("NVIDIA/nccl#964: one communicator took 688 MB per process over 4 A100s on "
               "NVLink (544 MB over two), outside PyTorch's allocator; more with more channels "
               "or network interfaces (1.6 GB in NVIDIA/nccl#864)")


def nccl_communicators(dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1) -> int:
    """NCCL communicators a rank's job opens: one per mesh dimension wider than one rank
    (data parallel — DDP, ZeRO and FSDP collectives —, tensor parallel, the pipeline's
    point-to-point sends, context parallel's ring), and FSDP2's over the data- and
    context-parallel ranks together where both are."""
    dims = sum(1 for degree in (dp, tp, pp, cp) if degree > 1)
    return dims + (1 if dp > 1 and cp > 1 else 0)


def nccl_bytes(dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1) -> int:
    """NCCL's buffers of one rank of a ``dp × cp × tp × pp`` mesh (0 on one GPU)."""
    return NCCL_COMMUNICATOR_BYTES * nccl_communicators(dp, tp, pp, cp)


def job_nccl_bytes(parallel: ParallelSpec | None) -> int:
    """NCCL's buffers of one rank of ``parallel``'s job (0 on one GPU)."""
    if parallel is None:
        return 0
    return nccl_bytes(parallel.dp, parallel.tp, parallel.pp, parallel.cp)


def context_bytes(profile: EnvProfile, loading: ModuleLoading, *, uses_matmul: bool,
                  uses_conv: bool) -> int:
    """CUDA context and loaded library kernels, outside the allocator."""
    if loading is ModuleLoading.EAGER:
        return EAGER_CONTEXT.context_bytes
    return profile.floor.outside_bytes(uses_matmul, uses_conv)
