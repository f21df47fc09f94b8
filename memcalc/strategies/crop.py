"""When nothing fits: the largest sample, cropped in proportion, whose batch of one fits."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memcalc.strategies.variants import TracedVariant, VariantEstimator

CROP_SEARCH_TRACES = 7


def largest_fitting_sample(variant: TracedVariant, usable: int,
                           estimator: VariantEstimator) -> tuple[int, ...] | None:
    """When nothing fits: the largest sample, every non-channel (non-feature) axis scaled by
    one factor (multiples of 16 from 32 on), whose batch of one fits with ``variant``
    (traced); None where the sample has no other axis."""
    spec, report = variant.spec, variant.report
    shape = spec.sample_shape or tuple(report.input.traced_batch_shape[1:])
    channel_axis = {"channels-last": len(shape) - 1, "channels-first": 0,
                    "features-last": len(shape) - 1}.get(report.input.layout)
    if channel_axis is not None and len(shape) == 1:
        return None         # a feature vector: its size is the model's, nothing to scale

    def scaled(factor: float) -> tuple[int, ...]:
        return tuple(dim if axis == channel_axis else _round_dim(dim * factor)
                     for axis, dim in enumerate(shape))

    def fits(candidate: tuple[int, ...]) -> bool:
        trial = spec.with_changes(sample_shape=candidate, batch_size=1, gpu=None,
                                  gpu_memory_bytes=None)
        return estimator.report(trial).device.total_bytes <= usable

    low, high, best = 0.0, 1.0, None
    for _ in range(CROP_SEARCH_TRACES):
        factor = (low + high) / 2
        candidate = scaled(factor)
        if fits(candidate):
            low, best = factor, candidate
        else:
            high = factor
    return best


def _round_dim(value: float) -> int:
    return max(16, int(value) // 16 * 16) if value >= 32 else max(1, int(value))
