"""memcalc: memory of a PyTorch training step, predicted before launch, without a GPU.

    >>> import memcalc
    >>> report = memcalc.estimate("resnet3d", (834, 224, 834, 3), batch_size=2)
    >>> report.device.peak_bytes
"""

from __future__ import annotations

from typing import Any

from memcalc.errors import (
    InputError,
    LayoutError,
    MemcalcError,
    MemoryBudgetError,
    ModelSourceError,
    TraceError,
)
from memcalc.estimate import estimate as estimate_spec
from memcalc.report import Report
from memcalc.specs import TrainingSpec

__all__ = ["estimate", "estimate_spec", "TrainingSpec", "Report", "MemcalcError", "InputError",
           "LayoutError", "ModelSourceError", "TraceError", "MemoryBudgetError"]


def estimate(model: str, sample_shape: tuple[int, ...] | None = None, *, batch_size: int = 1,
             **options: Any) -> Report:
    """Estimate one training step of ``model`` (zoo name or ``package.module:callable``).

    ``options`` are the other ``TrainingSpec`` fields: ``optimizer``, ``precision``,
    ``loss``, ``device``, ``input_dtype``, ``layout``, ``model_args``.
    """
    spec = TrainingSpec(model=model, sample_shape=tuple(sample_shape) if sample_shape else None,
                        batch_size=batch_size, **options)
    return estimate_spec(spec)
