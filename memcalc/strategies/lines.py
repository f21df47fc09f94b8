"""Linear batch models of a traced variant: live tensor bytes as ``fixed + per_sample × b``,
fitted on the two traced points of its batch plan. A derived strategy's rule moves these
lines (``Derivation`` in, ``PerGpuLines`` out)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memcalc.strategies.sharding import ModelStates
    from memcalc.strategies.specs import ClusterSpec
    from memcalc.strategies.variants import TracedVariant

UNBOUNDED_BATCH = 1 << 24
"""Largest batch reported when memory does not grow with the batch."""


@dataclass(frozen=True)
class Line:
    """bytes(b) = fixed + per_sample × b."""

    fixed: float
    per_sample: float

    def at(self, batch: int) -> float:
        """Bytes at ``batch``."""
        return self.fixed + self.per_sample * batch

    def largest_batch(self, budget: float) -> int:
        """Largest batch whose bytes stay within ``budget`` (0: not even one sample)."""
        if self.per_sample <= 0:
            return UNBOUNDED_BATCH if self.fixed <= budget else 0
        return max(0, math.floor((budget - self.fixed) / self.per_sample))

    def shifted(self, nbytes: float) -> Line:
        """The same line with ``nbytes`` more at every batch."""
        return Line(self.fixed + nbytes, self.per_sample)


@dataclass(frozen=True)
class FittedLines:
    """The traced forward/backward and optimizer-step lines and the allocator's reserve ratio
    (reserved ÷ allocated at the planned batch, else at the larger traced batch)."""

    compute: Line
    step: Line
    reserve: float


def fitted_lines(base: TracedVariant) -> FittedLines:
    """``base``'s compute and optimizer-step lines from its batch plan's two fitted points."""
    plan = base.report.device.plan
    points = {point.batch_size: point for point in plan.points}
    low, high = (points[b] for b in plan.fit_batches)
    span = high.batch_size - low.batch_size

    def line(field: str) -> Line:
        slope = (getattr(high, field) - getattr(low, field)) / span
        return Line(getattr(low, field) - slope * low.batch_size, slope)

    context = base.report.device.context_bytes or 0
    # the allocator's reserve where the variant fits: a batch over the capacity was replayed
    # at the limit, its cache freed and retried, a ratio that holds for no batch that fits
    # (a 3D volume's slab: 1.34 at batch 2, over, against 1.96 at batch 1, which fits)
    planned = points.get(plan.max_batch_size)
    at = planned if planned is not None and planned.fits and planned.allocated_bytes else high
    reserve = (at.total_bytes - context) / at.allocated_bytes
    return FittedLines(line("compute_peak_bytes"), line("optimizer_peak_bytes"), reserve)


@dataclass(frozen=True)
class Derivation:
    """What a derived strategy's memory rule sees: the base's traced lines (one GPU, whole
    states), the base itself, how many GPUs, the cluster and the unsharded model states."""

    compute: Line
    step: Line
    base: TracedVariant
    gpus: int
    cluster: ClusterSpec
    states: ModelStates


@dataclass(frozen=True)
class PerGpuLines:
    """One GPU's lines under a strategy, how many data-parallel ranks it has (each with its
    own samples) and the notes its candidate carries."""

    compute: Line
    step: Line
    data_ranks: int
    notes: tuple[str, ...] = ()
