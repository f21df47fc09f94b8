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
