"""A distributed job's layout (``memcalc.distributed.specs.ParallelSpec``): DDP's own options
are refused where no DDP wraps the model, and said where one does."""

import pytest
from pydantic import ValidationError

from memcalc.distributed.specs import DDP_BUCKET_CAP_MB, REPLICATED, DataParallel, ParallelSpec

DDP_OPTIONS = {"gradient_as_bucket_view": True, "static_graph": True, "bucket_cap_mb": 1.0}


@pytest.mark.parametrize("strategy", sorted(set(DataParallel) - REPLICATED, key=str))
@pytest.mark.parametrize("option", sorted(DDP_OPTIONS))
def test_a_ddp_option_without_ddp_is_refused(strategy, option):
    with pytest.raises(ValidationError, match=rf"options of DDP .* --strategy {strategy.value} "
                                              "does not wrap the model in DDP"):
        ParallelSpec(strategy=strategy, gpus_per_node=4, **{option: DDP_OPTIONS[option]})


@pytest.mark.parametrize("strategy", sorted(REPLICATED, key=str))
def test_ddps_options_are_named_in_the_layout(strategy):
    layout = ParallelSpec(strategy=strategy, gpus_per_node=4, **DDP_OPTIONS)
    assert layout.describe() == (f"{strategy.value} on 4 GPUs, gradient_as_bucket_view, "
                                 "static_graph, buckets of 1 MiB")
    default = ParallelSpec(strategy=strategy, gpus_per_node=4)
    assert default.bucket_cap_mb == DDP_BUCKET_CAP_MB      # torch's own default, not said
    assert default.describe() == f"{strategy.value} on 4 GPUs"


@pytest.mark.parametrize("gpus, tp, cp", [(8, 1, 2), (16, 2, 4), (4, 1, 4)])
def test_context_parallel_ranks_share_their_samples_and_fsdp_shards_over_them(gpus, tp, cp):
    """A context-parallel group takes one replica's samples (split on the sequence): the
    data-parallel degree is what tensor and context parallelism leave, and FSDP2 shards over
    the data- and context-parallel ranks (torchtitan's ``dp_shard_cp``)."""
    layout = ParallelSpec(strategy="fsdp", gpus_per_node=gpus, tp=tp, cp=cp)
    assert layout.dp * tp * cp == gpus
    assert layout.shard_ranks == gpus // tp
    assert f"context parallel {cp}" in layout.describe()
    # the GPUs that share one replica's batch: every GPU of the group's tensor-parallel pairs
    group = f"group of {cp} × {tp} GPUs" if tp > 1 else f"group of {cp} GPUs"
    assert group in layout.per_gpu() and cp * tp == gpus // layout.dp


@pytest.mark.parametrize("strategy", sorted(REPLICATED, key=str))
def test_context_parallel_is_refused_with_replicated_states(strategy):
    with pytest.raises(ValidationError, match="use --strategy fsdp or zero2"):
        ParallelSpec(strategy=strategy, gpus_per_node=4, cp=2)
