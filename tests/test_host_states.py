"""FSDP2's CPU offload in the trace (``memcalc.trace.host_states``): host and GPU told apart
on a CPU trace. Against closed forms here; against real ranks measured on an H200 in
``test_gpu_ranks`` (allocated and reserved, three offloaded jobs)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from memcalc.distributed.specs import ParallelSpec
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from models_zoo import ZOO
from tests.fixtures.gpu_rank_cases import TINY_LLAMA3

WORLD = 4
TENSOR_TO = torch.Tensor.to        # before any trace of this module ran


def _spec(offload: bool, optimizer: str = "sgd") -> TrainingSpec:
    return TrainingSpec(model="llama3_8b", model_args=TINY_LLAMA3, sample_shape=(64,),
                        batch_size=2, optimizer=optimizer, gpu="H200", headroom_fraction=0.0,
                        parallel=ParallelSpec(strategy="fsdp", gpus_per_node=WORLD,
                                              cpu_offload=offload))


def _shard_bytes() -> int:
    """Rank 0's fp32 parameter shards: FSDP2 cuts every parameter on dim 0 into WORLD
    chunks of ⌈dim 0 ÷ WORLD⌉ rows (the last ones padded)."""
    with torch.device("meta"):
        model = ZOO["llama3_8b"].build(**TINY_LLAMA3)
    return sum(math.ceil(p.shape[0] / WORLD) * p[0].numel() * 4 for p in model.parameters())


@pytest.fixture(scope="module")
def ranks():
    return {offload: estimate(_spec(offload), card_fits=False).device
            for offload in (False, True)}


def test_host_ram_holds_the_parameter_and_gradient_shards(ranks):
    # plain SGD updates in place: the host holds exactly the shards and their gradients
    assert ranks[True].method == "traced"
    assert ranks[True].offloaded_state_bytes == 2 * _shard_bytes()
    assert ranks[False].offloaded_state_bytes == 0


def test_the_gpu_holds_no_parameter_shard_and_gathers_each_unit(ranks):
    offloaded, resident = ranks[True], ranks[False]
    assert offloaded.breakdown.parameters == 0 and offloaded.breakdown.gradients == 0
    assert resident.breakdown.parameters > 0
    # the unsharded parameters a unit gathers are on the GPU either way: the peak drops by
    # the states alone
    assert 0 < resident.peak_allocated_bytes - offloaded.peak_allocated_bytes <= \
        2 * _shard_bytes()


def test_the_trace_leaves_tensor_to_as_it_found_it(ranks):
    # the offloaded trace wraps Tensor.to while it runs (FSDP2's copies across)
    assert torch.Tensor.to is TENSOR_TO


def test_adams_state_stays_on_the_host_too():
    device = estimate(_spec(True, "adamw"), card_fits=False).device
    # parameters, gradients and two moments: four shard-sized tensors at least
    assert device.offloaded_state_bytes >= 4 * _shard_bytes()
    assert device.breakdown.optimizer_state < 1024      # a step count per tensor at most


def test_offload_needs_fsdp2_and_a_gpu():
    with pytest.raises(ValidationError, match="--cpu-offload is FSDP2's CPUOffloadPolicy"):
        ParallelSpec(strategy="ddp", gpus_per_node=2, cpu_offload=True)
    with pytest.raises(ValidationError, match="with --device cpu there is no GPU"):
        _spec(True).with_changes(device="cpu")


@pytest.mark.parametrize("gpus, tp", [(1, 1), (2, 2)])
def test_offload_over_one_shard_rank_is_refused_not_traced_wrong(gpus, tp):
    """One shard rank (one GPU, or tensor parallel over all of them): FSDP2 skips its
    all-gather, and the trace put the whole step in host RAM (808 MiB on an H100 for a batch
    whose step needs 1.9 GiB without offload); refused until that path is followed."""
    with pytest.raises(ValidationError, match="--cpu-offload over one shard rank is not traced"):
        ParallelSpec(strategy="fsdp", gpus_per_node=gpus, tp=tp, cpu_offload=True)
    assert ParallelSpec(strategy="fsdp", gpus_per_node=4, tp=2, cpu_offload=True).shard_ranks == 2
