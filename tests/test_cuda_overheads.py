from memcalc.cuda_allocator import replay
from memcalc.cuda_overheads import (
    CONTEXT_TABLE,
    CUDNN_KERNELS_BYTES,
    ModuleLoading,
    context_bytes,
    cublas_workspace_bytes,
    workspace_allocations,
)
from memcalc.gpus import find_gpu

MIB = 2**20


def test_cublas_workspace_sizes_follow_cublas_handle_pool():
    # 4096 KiB x 2 + 16 KiB x 8 before Hopper, 4096 x 8 KiB from compute capability 9.0
    assert cublas_workspace_bytes(find_gpu("A100-80GB")) == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680
    assert cublas_workspace_bytes(find_gpu("H100")) == 32 * MIB
    assert cublas_workspace_bytes(None) == 8_519_680


def test_two_workspaces_only_when_the_step_multiplies_matrices():
    assert workspace_allocations(None, uses_matmul=True) == [8_519_680, 8_519_680]
    assert workspace_allocations(find_gpu("H200"), uses_matmul=False) == []


def test_workspaces_share_one_20_mib_segment_before_hopper_and_take_two_on_hopper():
    # an 8.1 MiB request is a 1-10 MiB request: one 20 MiB segment, split for the second
    assert replay([], resident_bytes=workspace_allocations(None, True)).peak_reserved_bytes == 20 * MIB
    # 32 MiB requests are rounded to 2 MiB multiples: one segment each
    hopper = workspace_allocations(find_gpu("H100"), True)
    assert replay([], resident_bytes=hopper).peak_reserved_bytes == 64 * MIB


def test_context_table_lookups():
    assert context_bytes(ModuleLoading.EAGER, uses_conv=False) == 1343 * MIB
    assert context_bytes(ModuleLoading.EAGER, uses_conv=True) == 1343 * MIB  # all loaded already
    lazy = CONTEXT_TABLE[ModuleLoading.LAZY].context_bytes
    # the lazy row is nvidia-smi minus reserved in its source: 3559.39 MB - 2910.85 MB
    assert abs(lazy - (3559.391232e6 - 2910.846976e6)) < 1e6
    assert context_bytes(ModuleLoading.LAZY, uses_conv=True) == lazy + CUDNN_KERNELS_BYTES
