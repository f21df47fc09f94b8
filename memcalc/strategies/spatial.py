"""Spatial-parallel candidates: when one sample does not fit a GPU, split every sample over
the fewest GPUs (powers of two) whose traced slab fits (``memcalc.trace.halos``).

This module sizes one base on one part count; ``memcalc.strategies.spatial_search`` walks
every base's part counts in turn and skips those that cannot rank higher."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memcalc.device.kernel_time import compute_floor_seconds
from memcalc.device.speed import peak_flops
from memcalc.strategies.candidates import distributed_candidate
from memcalc.strategies.variants import planned_spec, traced_variant
from memcalc.trace.halos import split_axis

if TYPE_CHECKING:
    from memcalc.specs import TrainingSpec
    from memcalc.strategies.candidates import PlanContext
    from memcalc.strategies.report import Candidate
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


def counts_to_trace(rule: DerivedRule, base: TracedVariant, context: PlanContext) -> list[int]:
    """The part counts ``base``'s slabs are traced on, fewest GPUs first (at most
    ``MAX_TRACES_PER_BASE``): none unless the model can split a sample and one sample of
    ``base`` does not fit one GPU, or the strategy is forced."""
    forced = context.cluster.strategy is rule.strategy
    if context.not_splittable is not None or not (
            base.report.device.plan.max_batch_size == 0 or forced):
        return []
    sample_shape = base.report.input.traced_batch_shape[1:]
    counts = part_counts(context.cluster, sample_shape[split_axis(sample_shape)])
    return predicted_parts(base, counts)[:MAX_TRACES_PER_BASE]


def slab_spec(base: TracedVariant, parts: int) -> TrainingSpec:
    """The spec whose report traces one of ``parts`` GPUs' slabs of ``base``."""
    return planned_spec(base.spec.with_changes(spatial_parts=parts))


@dataclass(frozen=True)
class SlabOutcome:
    """One slab traced: its candidate, or why the slab could not be traced; ``final`` when
    no more GPUs are tried for this base (it fits, or host RAM holds it back, or it failed)."""

    candidate: Candidate | None
    failure: str | None
    final: bool


def slab_outcome(rule: DerivedRule, base: TracedVariant, parts: int, states: ModelStates,
                 context: PlanContext) -> SlabOutcome:
    """``base`` split over ``parts`` GPUs per sample, its slab traced and sized."""
    variant = traced_variant(base.rule, base.spec.with_changes(spatial_parts=parts),
                             context.estimator)
    if variant.report.device.method != "traced":
        failure = next((u for u in variant.report.unsupported if "traced step" in u), "")
        return SlabOutcome(None, f"spatial×{parts} + {base.label}: the slab could not be "
                                 f"traced ({failure})", True)
    cluster = context.cluster
    candidate = distributed_candidate(rule, variant, gpus_for(parts, cluster), cluster,
                                      context.gpu, states)
    usable = variant.report.device.plan.usable_bytes
    # fits, or held back by host RAM: more GPUs do not help
    return SlabOutcome(candidate, None, candidate.fits or candidate.per_gpu_peak_bytes <= usable)


def gpus_for(parts: int, cluster: ClusterSpec) -> int:
    """GPUs a candidate split over ``parts`` GPUs per sample uses."""
    return cluster.gpus if cluster.gpus > 1 else parts


def samples_ceiling(base: TracedVariant, gpus: int, context: PlanContext) -> float:
    """Most samples/s any spatial candidate of ``base`` on ``gpus`` GPUs can reach: every GPU
    computing its share of the base's FLOPs per sample at the card's fastest rate for the
    precision, with no communication. A slab's FLOPs are at least 1/G of the whole sample's
    (each output position is computed on one rank; halo rows and replicated layers only add),
    so its candidate's compute time is at least this; infinite when the FLOPs are unknown."""
    if base.flops_per_sample <= 0:
        return math.inf
    spec, cluster, step = base.spec, context.cluster, base.step
    if cluster.mfu is None and step is not None and step.kernels and step.total:
        # timed kernel by kernel, each layer of a slab computes at least 1/G of the whole's
        # layer's FLOPs at that layer's rate: the base's compute floor, per sample, over G
        floor = compute_floor_seconds(step.kernels, context.gpu, spec.cudnn_tf32)
        return gpus * step.total / (floor * base.flops_per_sample) if floor else math.inf
    rate = max(peak_flops(context.gpu, spec.precision, share, spec.cudnn_tf32)[0]
               for share in (0.0, 1.0))
    return gpus * rate * (cluster.mfu or 1.0) / base.flops_per_sample
