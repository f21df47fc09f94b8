"""Spatial parallelism: slab arithmetic, which models split, halo bytes in closed form, and a
real two-rank gloo run with halo exchange (exact numerics, its measured peak)."""

import math
import re

import pytest

from memcalc.errors import InputError
from memcalc.device.gpus import find_gpu
from memcalc.model.source import resolve_model
from memcalc.pipeline import estimate
from memcalc.trace.halos import (
    MAX_ALIGNMENT,
    not_splittable_reason,
    slab_length,
    split_axis,
)
from memcalc.specs import TrainingSpec
from memcalc.api import pipeline_estimator
from memcalc.strategies import ClusterSpec, Strategy
from memcalc.strategies.candidates import PlanContext
from memcalc.strategies.rules import rule_for
from memcalc.strategies.sharding import ModelStates
from memcalc.strategies.variants import traced_variant
from tests.fixtures.gloo import run_ranks
from tests.fixtures.spatial_reference import (
    HALO_NET,
    spatial_rank,
    traced_bytes,
    unsharded_peak_bytes,
)

FLOAT_BYTES = 4
GIB = 2**30


@pytest.mark.parametrize("length", [7, 10, 32, 64, 100, 224, 834, 1000])
@pytest.mark.parametrize("parts", [1, 2, 3, 4, 8])
def test_the_largest_slab_covers_its_share_and_keeps_the_axis_alignment(length, parts):
    share = math.ceil(length / parts)
    alignment = min(math.gcd(length, MAX_ALIGNMENT), 2 ** int(math.log2(share)))
    slab = slab_length(length, parts)
    assert slab % alignment == 0 and share <= slab < share + alignment
    assert slab_length(length, 1) == length


def test_the_longest_spatial_axis_is_split_first_of_equals():
    assert split_axis((3, 834, 224, 834)) == 1
    assert split_axis((1, 16, 64, 32)) == 2


@pytest.mark.parametrize("name, splittable", [("resnet3d", True), ("unet3d", True),
                                              ("resnet50", True), ("vit_b16", False),
                                              ("gpt2", False), ("mlp", False)])
def test_convolutional_models_split_and_attention_or_linear_ones_do_not(name, splittable):
    source = resolve_model(name, {})
    reason = not_splittable_reason(source.build_meta(), source.default_shape)
    assert (reason is None) is splittable
    if name == "vit_b16":
        assert "attention" in reason


def test_an_unsplittable_model_is_refused_with_the_reason():
    with pytest.raises(InputError, match=r"'gpt2' cannot be split spatially: it has no conv"):
        estimate(TrainingSpec(model="gpt2", spatial_parts=2, device="cpu", batch_size=1))


def test_a_slab_that_cannot_be_traced_is_named_not_dropped():
    spec = TrainingSpec(model="tests.fixtures.models:conv_then_linear",
                        sample_shape=(1, 64, 32, 32), gpu_memory_bytes=GIB << 4)
    line = estimate(spec).device.plan
    # one sample does not fit, half of one would
    capacity = (line.model_bytes + line.per_sample_bytes // 2) / (1 - spec.headroom_fraction)
    estimator = pipeline_estimator()
    base = traced_variant(rule_for(Strategy.BASELINE),
                          spec.with_changes(gpu_memory_bytes=int(capacity)), estimator)
    assert base.report.device.plan.max_batch_size == 0
    states = ModelStates(0, 0, 0, 0)
    spatial = rule_for(Strategy.SPATIAL)
    context = PlanContext(ClusterSpec(), find_gpu("T4"), estimator)
    [(candidate, failure)], skipped = spatial.search(spatial, [(base, states)], context, [])
    assert candidate is None and skipped == []
    assert re.match(r"spatial×\d+ \+ baseline: the slab could not be traced \(traced step: .*"
                    r"RuntimeError: .*\d+\] X \[524288, 2\]", failure)


def test_halo_bytes_are_the_padding_rows_of_every_padded_layer():
    batch, height, width = 2, 48, 48
    report = estimate(TrainingSpec(model=HALO_NET, sample_shape=(2, 64, height, width),
                                   device="cpu", batch_size=batch, spatial_parts=2))
    assert report.input.traced_batch_shape == (batch, 2, 32, height, width)
    # (channels in, rows per side, height, width) of the layers padded along depth
    padded = [(2, 1, height, width), (8, 1, height, width),
              (16, 1, height // 2, width // 2), (8, 2, height, width)]
    expected = sum(2 * rows * channels * h * w for channels, rows, h, w in padded)
    assert report.device.halo_exchange_bytes == batch * FLOAT_BYTES * expected


@pytest.mark.slow
def test_a_real_two_rank_halo_exchange_matches_the_traced_slab():
    """Two gloo ranks, each with half of every volume, reproduce the unsharded model, and the
    trace of one slab is each rank's profiler peak within 1 %, as the trace of the whole
    volume is the unsharded step's (convolutions on ATen's native path, whose buffers the
    trace counts on any CPU: ``spatial_reference.native_convolutions``)."""
    world, batch_shape = 2, (2, 2, 64, 48, 48)
    ranks = run_ranks(spatial_rank, world, batch_shape)
    slab = traced_bytes(batch_shape, world)
    for _, output_error, grad_error, peak in ranks:
        assert output_error < 1e-5 and grad_error < 1e-5
        assert slab == pytest.approx(peak, rel=0.01)
    assert traced_bytes(batch_shape, 1) == pytest.approx(unsharded_peak_bytes(batch_shape),
                                                         rel=0.01)
    # halving the depth halves the step's activations, not its weights and optimizer state
    assert 0.5 < slab / traced_bytes(batch_shape, 1) < 0.6


def test_a_slab_that_fits_one_sample_is_shown_at_its_own_traced_figure():
    """The plan's spatial row at batch 1 is the slab's own trace at batch 1 plus NCCL's
    buffers: the allocator's reserve is the one at the batch that fits, not at batch 2,
    which went over and was replayed at the limit (a 3D volume's row read 23.9 GiB where its
    slab's own estimate said 34.5)."""
    from memcalc.strategies.candidates import _nccl_bytes, distributed_candidate

    estimator = pipeline_estimator()
    roomy = TrainingSpec(model=HALO_NET, sample_shape=(2, 128, 96, 96), spatial_parts=2,
                         gpu_memory_bytes=64 * GIB)
    points = {p.batch_size: p.total_bytes
              for p in traced_variant(rule_for(Strategy.BASELINE), roomy,
                                      estimator).report.device.plan.points}
    usable = points[1] + (points[8] - points[1]) / 7 / 5    # a fifth of a sample's growth
    tight = roomy.with_changes(gpu_memory_bytes=int(usable / (1 - roomy.headroom_fraction)) + 1)
    slab = traced_variant(rule_for(Strategy.BASELINE), tight, estimator)
    plan = slab.report.device.plan
    assert plan.max_batch_size == 1 and plan.fit_batches == (1, 2)
    rule = rule_for(Strategy.SPATIAL)
    candidate = distributed_candidate(rule, slab, 2, ClusterSpec(), find_gpu("T4"),
                                      ModelStates(0, 0, 0, 0))
    assert candidate.per_gpu_peak_bytes == (slab.report.device.total_bytes
                                            + _nccl_bytes(rule, "cuda", 2, 1))
