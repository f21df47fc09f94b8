"""Library entry points with plain arguments (the CLI and notebooks call these)."""

from __future__ import annotations

from typing import Any

from memcalc.pipeline import estimate as estimate_spec
from memcalc.report import Report
from memcalc.specs import TrainingSpec


def estimate(model: str, sample_shape: tuple[int, ...] | None = None, *, batch_size: int = 1,
             **options: Any) -> Report:
    """Estimate one training step of ``model`` (zoo name or ``package.module:callable``).

    ``options`` are the other ``TrainingSpec`` fields: ``optimizer``, ``precision``,
    ``loss``, ``device``, ``input_dtype``, ``layout``, ``model_args``, ``loader``, ``machine``.
    """
    spec = TrainingSpec(model=model, sample_shape=tuple(sample_shape) if sample_shape else None,
                        batch_size=batch_size, **options)
    return estimate_spec(spec)
