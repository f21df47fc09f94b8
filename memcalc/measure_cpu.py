"""Ground truth: the peak of a real CPU training step, measured by the PyTorch profiler.

Runs the same step the tracer runs (forward under optional autocast, loss, backward,
optimizer step, ``zero_grad(set_to_none=True)``, twice) on real tensors, with
``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)``, and
reads the peak of ``export_memory_timeline(device="cpu")`` (tensors that existed before
profiling, such as parameters, appear there as pre-existing). For validation: it allocates
everything for real, so keep the model and batch small.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Callable

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from memcalc.checkpointing import apply_checkpointing, repeated_blocks
from memcalc.losses import compute_loss, make_target, primary_output
from memcalc.model_source import resolve_model
from memcalc.optimizers import OptimizerRule, optimizer_rule
from memcalc.precision import cpu_autocast, precision_policy
from memcalc.specs import INPUT_DTYPES, LossKind, TrainingSpec


class TrainingStep:
    """One real training step, callable: forward (under autocast when mixed), loss,
    backward, optimizer step, ``zero_grad(set_to_none=True)``."""

    def __init__(self, model: nn.Module, batch: torch.Tensor, loss: LossKind,
                 optimizer: OptimizerRule, *, classes_last: bool,
                 autocast_dtype: torch.dtype | None = None) -> None:
        self.model, self.batch, self.loss = model.train(), batch, loss
        self.optimizer = optimizer.build(model.parameters(), False)
        self.classes_last, self.autocast_dtype = classes_last, autocast_dtype
        self._target: list[torch.Tensor | None] = []

    def __call__(self) -> None:
        with cpu_autocast(self.autocast_dtype):
            output = primary_output(self.model(self.batch))
            if not self._target:
                self._target.append(make_target(self.loss, output, self.classes_last))
            step_loss = compute_loss(self.loss, output, self._target[0], self.classes_last)
        step_loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def measure_cpu_peak_bytes(step: Callable[[], None], iterations: int = 2) -> int:
    """Peak live CPU tensor bytes over ``iterations`` calls of a real training ``step``."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as profiler:
        for _ in range(iterations):
            step()
    return _timeline_peak(profiler)


def _timeline_peak(profiler: profile) -> int:
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "timeline.json")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # deprecated, still the CPU truth
            profiler.export_memory_timeline(path, device="cpu")
        with open(path) as handle:
            times, sizes = json.load(handle)
    return max(sum(per_category) for per_category in sizes) if times else 0


def spec_training_step(spec: TrainingSpec, traced_batch_shape: tuple[int, ...]) -> TrainingStep:
    """The training step of the spec's model with real weights (checkpointed when the spec
    says so) on a real batch.

    ``traced_batch_shape`` is the report's ``input.traced_batch_shape`` (channels-first).
    Token ids are drawn below 100, so the model's vocabulary must be larger.
    """
    torch.manual_seed(0)
    source = resolve_model(spec.model, spec.model_args)
    model = source.factory(**spec.model_args)
    if spec.activation_checkpointing:
        apply_checkpointing(model, repeated_blocks(model))
    token_ids = not INPUT_DTYPES[spec.input_dtype or source.default_input_dtype
                                 or "float32"].is_floating_point
    batch = (torch.randint(0, 100, traced_batch_shape) if token_ids
             else torch.randn(traced_batch_shape))
    policy = precision_policy(spec.precision)
    if policy.autocast_dtype is None:
        model = model.to(policy.parameter_dtype)
    batch = batch.to(policy.batch_dtype(batch.dtype))
    return TrainingStep(model, batch, spec.loss, optimizer_rule(spec.optimizer),
                        classes_last=token_ids, autocast_dtype=policy.autocast_dtype)


def measure_spec_cpu_peak(spec: TrainingSpec, traced_batch_shape: tuple[int, ...]) -> int:
    """Build the spec's model with real weights and measure its step on CPU."""
    return measure_cpu_peak_bytes(spec_training_step(spec, traced_batch_shape))
