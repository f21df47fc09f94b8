"""One training iteration, written once: forward (under autocast when mixed precision), loss,
backward, optimizer step, ``zero_grad``.

The tracer runs it on fake tensors (an observer stamps every storage with the phase), the FLOP
count is taken from the tracer's first iteration, and the CPU truth in ``tests/fixtures``
runs it on real tensors — so the three cannot drift apart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from memcalc.model.inputs import ModelCall
from memcalc.specs import GradMode, LossKind
from memcalc.trace.ledger import Phase
from memcalc.trace.losses import (compute_loss, make_target, model_loss, output_shape,
                                  primary_output)
from memcalc.trace.precision import cpu_autocast


@dataclass(frozen=True)
class StepBody:
    """What the iteration does besides running the model."""

    loss: LossKind
    classes_last: bool
    """Integer targets index the last axis (token ids) rather than axis 1 (classes)."""
    autocast_dtype: torch.dtype | None = None
    keep_zeroed_grads: bool = False
    """``zero_grad(set_to_none=False)``: gradients stay allocated (PyTorch < 2.0 default)."""
    free_output: bool = False
    """The loop drops the model's output before backward (torchtitan's ``del pred``); what
    autograd saved of it stays."""
    clip_grad_norm: float | None = None
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)`` between backward and the step
    (its foreach norms and scaling make per-gradient temporaries)."""
    evaluation: GradMode | None = None
    """An evaluation step under this grad mode (``model.eval()``, forward and loss, then both
    dropped); None: a training step."""
    autocast_cache: bool = True
    """Autocast keeps its half-precision weight copies for the region (off under
    ``inference_mode``, which the tracer runs as no_grad without the cache)."""


_GRAD_MODES: dict[GradMode | None, Callable[[], contextlib.AbstractContextManager]] = {
    None: contextlib.nullcontext, GradMode.ENABLED: contextlib.nullcontext,
    GradMode.NO_GRAD: torch.no_grad, GradMode.INFERENCE_MODE: torch.inference_mode,
}


class StepObserver:
    """Told where the iteration is; the defaults do nothing."""

    def enter(self, phase: Phase) -> None:
        """The iteration enters ``phase`` (forward, backward, optimizer, zero_grad)."""

    def target_made(self, target: torch.Tensor) -> None:
        """The loss target was made (once, at the first forward)."""

    def loss_begins(self) -> None:
        """The loss is about to be computed (inside the forward phase)."""

    def loss_ends(self) -> None:
        """The loss was computed."""


def prime_optimizer_state(optimizer: torch.optim.Optimizer, keep_grads: bool,
                          observer: StepObserver) -> None:
    """The state a training job's optimizer holds while it validates: one step over zero
    gradients makes it as the first real step does, then the gradients go (``keep_grads``:
    kept, zeroed, as ``zero_grad(set_to_none=False)`` leaves them)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.requires_grad:
                param.grad = torch.zeros_like(param)
    observer.enter(Phase.OPTIMIZER)
    optimizer.step()
    observer.enter(Phase.ZERO_GRAD)
    optimizer.zero_grad(set_to_none=not keep_grads)


def sharded_classes(output: object) -> bool:
    """``output`` is a DTensor sharded on its last (class) axis: tensor parallel's head kept
    the logits sharded, for ``loss_parallel``."""
    placements = getattr(output, "placements", None)
    if not placements or not isinstance(output, torch.Tensor):
        return False
    last = output.dim() - 1
    return any(getattr(placement, "dim", None) in (-1, last) and placement.is_shard()
               for placement in placements)


def loss_parallel_if(sharded: bool) -> contextlib.AbstractContextManager:
    """torch's ``loss_parallel()`` (cross-entropy on vocabulary-sharded logits, forward and
    backward) where the logits are sharded, else nothing."""
    if not sharded:
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel

    return loss_parallel()


class TrainingIteration:
    """The step as a callable: each call runs one iteration and returns the output's shape.
    Output and loss are released when the call returns; the target is made once and kept.
    Without an optimizer the iteration ends after backward; an evaluation step (the body's
    ``evaluation``) puts the model in eval mode and ends after the loss. ``step`` steps the
    optimizer (default ``optimizer.step``; the tracer may replay a recorded step instead)."""

    def __init__(self, body: StepBody, model: nn.Module, batch: torch.Tensor | ModelCall,
                 optimizer: torch.optim.Optimizer | None = None,
                 observer: StepObserver | None = None,
                 step: Callable[[], object] | None = None) -> None:
        self.body, self.model = body, model
        self.call = batch if isinstance(batch, ModelCall) else ModelCall((batch,))
        self.optimizer, self.observer = optimizer, observer or StepObserver()
        self._step = step or (optimizer.step if optimizer is not None else None)
        self._target: list[torch.Tensor | None] = []
        self._sharded_logits = False
        if body.evaluation is not None:
            model.eval()

    def __call__(self) -> tuple[int, ...]:
        body, observer = self.body, self.observer
        observer.enter(Phase.FORWARD)
        with cpu_autocast(body.autocast_dtype, body.autocast_cache), _GRAD_MODES[body.evaluation]():
            output = self.model(*self.call.args, **self.call.kwargs)
            if body.loss is not LossKind.MODEL:
                output = primary_output(output)
                if not self._target:
                    self._target.append(make_target(body.loss, output, body.classes_last))
                    if self._target[0] is not None:
                        observer.target_made(self._target[0])
            observer.loss_begins()
            self._sharded_logits = sharded_classes(output)
            with loss_parallel_if(self._sharded_logits):
                loss = (model_loss(output) if body.loss is LossKind.MODEL
                        else compute_loss(body.loss, output, self._target[0], body.classes_last))
            observer.loss_ends()
        shape = output_shape(output)
        if body.evaluation is not None:
            return shape           # output and loss dropped, as a validation loop does
        if body.free_output:
            del output
        # else ``output`` stays alive through backward and the optimizer step, as in most loops
        return self._backward_and_step(loss, shape)

    def _backward_and_step(self, loss: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, ...]:
        body, observer = self.body, self.observer
        observer.enter(Phase.BACKWARD)
        with loss_parallel_if(self._sharded_logits):
            loss.backward()
        if self.optimizer is not None:
            observer.enter(Phase.OPTIMIZER)
            if body.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), body.clip_grad_norm)
            self._step()
            observer.enter(Phase.ZERO_GRAD)
            self.optimizer.zero_grad(set_to_none=not body.keep_zeroed_grads)
        return shape
