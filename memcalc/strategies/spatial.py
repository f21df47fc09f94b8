"""Spatial-parallel candidates: when one sample does not fit a GPU, split every sample over
the fewest GPUs (powers of two) whose traced slab fits (``memcalc.trace.halos``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memcalc.strategies.candidates import distributed_candidate
from memcalc.strategies.variants import traced_variant
from memcalc.trace.halos import split_axis

if TYPE_CHECKING:
    from memcalc.strategies.candidates import PlanContext, Sized
    from memcalc.strategies.rules import DerivedRule
    from memcalc.strategies.sharding import ModelStates
    from memcalc.strategies.specs import ClusterSpec
    from memcalc.strategies.variants import TracedVariant

MAX_TRACES_PER_BASE = 3
"""Slab sizes traced per base variant, from the predicted fewest GPUs upwards."""


def part_counts(cluster: ClusterSpec, axis_length: int) -> list[int]:
    """GPUs per sample to try: powers of two from 2; they divide the GPUs given, or, with one
    GPU given, reach ``cluster.max_gpus``; never more than the axis has positions."""
    limit = cluster.gpus if cluster.gpus > 1 else cluster.max_gpus
    counts, parts = [], 2
    while parts <= min(limit, axis_length):
        if cluster.gpus == 1 or cluster.gpus % parts == 0:
            counts.append(parts)
        parts *= 2
    return counts


def predicted_parts(base: TracedVariant, counts: list[int]) -> list[int]:
    """The counts from the first whose share of the base's per-sample line fits; the halo
    exchange adds to that, so the prediction is a lower bound confirmed by tracing."""
    plan = base.report.device.plan
    for index, parts in enumerate(counts):
        if plan.model_bytes + plan.per_sample_bytes / parts <= plan.usable_bytes:
            return counts[index:]
    return []


def fewest_spatial_parts(rule: DerivedRule, base: TracedVariant, states: ModelStates,
                         context: PlanContext) -> Sized:
    """``base`` split spatially over the fewest GPUs that fit (traced there), or the last one
    traced when none of ``MAX_TRACES_PER_BASE`` fits; no candidate when no count can fit, and
    none but the reason when a slab cannot be traced. Tried only when the model can split a
    sample and one sample of ``base`` does not fit one GPU, or when the strategy is forced."""
    cluster = context.cluster
    forced = cluster.strategy is rule.strategy
    if context.not_splittable is not None or not (
            base.report.device.plan.max_batch_size == 0 or forced):
        return None, None
    sample_shape = base.report.input.traced_batch_shape[1:]
    counts = part_counts(cluster, sample_shape[split_axis(sample_shape)])
    candidate = None
    for parts in predicted_parts(base, counts)[:MAX_TRACES_PER_BASE]:
        variant = traced_variant(base.rule, base.spec.with_changes(spatial_parts=parts),
                                 context.estimator)
        if variant.report.device.method != "traced":
            failure = next((u for u in variant.report.unsupported if "traced step" in u), "")
            return None, f"spatial×{parts} + {base.label}: the slab could not be traced ({failure})"
        gpus = cluster.gpus if cluster.gpus > 1 else parts
        candidate = distributed_candidate(rule, variant, gpus, cluster, context.gpu, states)
        usable = variant.report.device.plan.usable_bytes
        if candidate.fits or candidate.per_gpu_peak_bytes <= usable:
            return candidate, None   # fits, or held back by host RAM: more GPUs do not help
    return candidate, None
