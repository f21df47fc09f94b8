from memcalc.device.allocator import replay
from memcalc.device.cuda_overheads import (
    EAGER_CONTEXT,
    context_bytes,
    cublas_workspace_bytes,
    workspace_allocations,
)
from memcalc.device.env_profile import builtin_profile
from memcalc.device.gpus import find_gpu
from memcalc.specs import ModuleLoading

MIB = 2**20
GENERIC = builtin_profile("generic.json")
H100 = builtin_profile("h100-torch2.11-cu130.json")


def test_cublas_workspace_sizes_follow_cublas_handle_pool():
    # 4096 KiB x 2 + 16 KiB x 8 before Hopper, 4096 x 8 KiB from compute capability 9.0
    assert cublas_workspace_bytes(find_gpu("A100-80GB")) == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680
    assert cublas_workspace_bytes(find_gpu("H100-80GB")) == 32 * MIB
    assert cublas_workspace_bytes(None) == 8_519_680


def test_generic_profile_uses_the_rule_and_a_measured_profile_its_measurement():
    assert workspace_allocations(GENERIC, None, uses_matmul=True) == [8_519_680, 8_519_680]
    assert workspace_allocations(GENERIC, find_gpu("H200"), uses_matmul=False) == []
    # measured on the H100: 64 MiB stayed allocated after a matmul forward and backward
    assert workspace_allocations(H100, None, uses_matmul=True) == [32 * MIB, 32 * MIB]


def test_workspaces_share_one_20_mib_segment_before_hopper_and_take_two_on_hopper():
    # an 8.1 MiB request is a 1-10 MiB request: one 20 MiB segment, split for the second
    pre_hopper = workspace_allocations(GENERIC, None, True)
    assert replay([], resident_bytes=pre_hopper).peak_reserved_bytes == 20 * MIB
    # 32 MiB requests are rounded to 2 MiB multiples: one segment each
    hopper = workspace_allocations(GENERIC, find_gpu("H100-80GB"), True)
    assert replay([], resident_bytes=hopper).peak_reserved_bytes == 64 * MIB


def test_eager_loading_uses_its_published_row_whatever_the_step_runs():
    for matmul, conv in ((False, False), (True, True)):
        assert context_bytes(H100, ModuleLoading.EAGER, uses_matmul=matmul,
                             uses_conv=conv) == EAGER_CONTEXT.context_bytes == 1343 * MIB


def test_lazy_loading_adds_each_library_the_step_runs():
    floor = H100.floor
    outside = {(m, c): context_bytes(H100, ModuleLoading.LAZY, uses_matmul=m, uses_conv=c)
               for m in (False, True) for c in (False, True)}
    assert outside[False, False] == floor.context_bytes
    assert outside[True, False] == floor.context_bytes + floor.cublas_bytes
    assert outside[False, True] == floor.context_bytes + floor.cudnn_bytes
    assert outside[True, True] == (floor.context_bytes + floor.cublas_bytes
                                   + floor.cudnn_after_cublas_bytes)
    # the generic profile keeps the published lazy row: context + cuBLAS = 648.5 MB
    # (optimum-benchmark GPT-2 training: 3559.39 MB nvidia-smi - 2910.85 MB reserved)
    generic = context_bytes(GENERIC, ModuleLoading.LAZY, uses_matmul=True, uses_conv=False)
    assert abs(generic - (3559.391232e6 - 2910.846976e6)) < 1e6


def test_a_rank_on_cuda_holds_nccls_buffers_per_communicator_of_its_mesh():
    from memcalc.device.cuda_overheads import NCCL_COMMUNICATOR_BYTES, nccl_communicators
    from memcalc.distributed.specs import ParallelSpec
    from memcalc.pipeline import estimate
    from memcalc.specs import TrainingSpec

    assert nccl_communicators() == 0 and nccl_communicators(dp=8) == 1
    assert nccl_communicators(dp=4, tp=2) == 2 and nccl_communicators(dp=2, tp=2, pp=2) == 3
    # context parallel: its ring, and FSDP2's group over the dp × cp ranks where both exist
    assert nccl_communicators(cp=8) == 1 and nccl_communicators(dp=2, cp=4) == 3
    mlp = dict(model="tests.fixtures.models:tiny_mlp", sample_shape=(8,), batch_size=4,
               gpu="H100-80GB")
    one = estimate(TrainingSpec(**mlp)).device
    fsdp = estimate(TrainingSpec(**mlp, parallel=ParallelSpec(strategy="fsdp",
                                                              gpus_per_node=8))).device
    assert fsdp.context_bytes - one.context_bytes == NCCL_COMMUNICATOR_BYTES
    assert fsdp.total_bytes - fsdp.peak_reserved_bytes == fsdp.context_bytes
    on_cpu = estimate(TrainingSpec(**(mlp | {"gpu": None}), device="cpu",
                                   parallel=ParallelSpec(strategy="fsdp", gpus_per_node=8)))
    assert not on_cpu.device.context_bytes
