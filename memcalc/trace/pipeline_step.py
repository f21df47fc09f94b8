"""One pipeline rank's training iteration: ``torch.distributed.pipelining``'s schedule runs
this rank's stages over the microbatches (their forwards, the loss on the last stage, their
backwards, in the schedule's order; activations sent and received through the process
group), then the optimizer steps and zeroes the gradients as ``TrainingIteration`` does.

Written once: the tracer runs it on fake tensors in a fake process group (every send and
receive a no-op, every buffer the stages allocate for them real in the ledger), the CPU
truth in ``tests/fixtures`` on real gloo ranks. The schedule is stepped with
``return_outputs=False`` (torchtitan's loop), so the last stage does not concatenate the
microbatches' outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from memcalc.distributed.pipeline_split import chains, note_passthroughs
from memcalc.distributed.specs import ParallelSpec, PipelineSchedule
from memcalc.errors import InputError
from memcalc.model.inputs import ModelCall
from memcalc.specs import LossKind
from memcalc.trace._torch_internals import schedule_stages
from memcalc.trace.ledger import Phase
from memcalc.trace.losses import compute_loss, make_target, model_loss, primary_output
from memcalc.trace.precision import cpu_autocast
from memcalc.trace.step import StepBody, StepObserver

SCHEDULES: dict[PipelineSchedule, str] = {
    PipelineSchedule.GPIPE: "ScheduleGPipe",
    PipelineSchedule.ONE_F_ONE_B: "Schedule1F1B",
    PipelineSchedule.INTERLEAVED: "ScheduleInterleaved1F1B",
}
"""Each schedule's class in ``torch.distributed.pipelining``."""


@dataclass(frozen=True)
class StageShapes:
    """What one stage receives and sends for one microbatch (tensors without data)."""

    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]


def stage_shapes(stages: list[nn.Module], model: nn.Module,
                 microbatch: ModelCall) -> list[StageShapes]:
    """Every stage run in turn on one microbatch (each on the previous one's output), before
    the step, to give the schedule its buffers' shapes; raises InputError when the stages do
    not chain or the last one does not give ``model``'s own output."""
    args, kwargs = microbatch.args, microbatch.kwargs
    shapes = []
    with torch.no_grad():
        whole = primary_output(model(*args, **kwargs))
        for index, stage in enumerate(stages):
            note_passthroughs(stage)
            try:
                output = stage(*args, **kwargs)
            except Exception as error:  # the split model's own forward
                raise InputError(_unsplittable(f"stage {index} fails on the previous stage's "
                                               f"output ({type(error).__name__}: {error})"))
            if not chains(stage, args[0] if args else None):
                raise InputError(_unsplittable(f"stage {index}'s forward gives the modules "
                                               "of other stages more than its input"))
            outputs = output if isinstance(output, tuple) else (output,)
            if not all(isinstance(value, torch.Tensor) for value in outputs):
                raise InputError(_unsplittable(f"stage {index} returns "
                                               f"{type(output).__name__}, not tensors"))
            outputs = tuple(value.detach().requires_grad_(value.is_floating_point())
                            for value in outputs)
            shapes.append(StageShapes(tuple(args), outputs))
            args, kwargs = outputs, {}
    if tuple(outputs[0].shape) != tuple(whole.shape):
        raise InputError(_unsplittable(f"the last stage gives {tuple(outputs[0].shape)}, the "
                                       f"model {tuple(whole.shape)}"))
    return shapes


def _unsplittable(why: str) -> str:
    return (f"the model does not split into pipeline stages at its repeated blocks: {why}; "
            "pipeline parallelism needs a forward that runs the modules before the blocks, "
            "the blocks, then the modules after them (as LLaMA-style decoders do), or no --pp")


def build_schedule(spec: ParallelSpec, modules: list[nn.Module], indices: list[int],
                   shapes: list[StageShapes], microbatches: int, group,
                   loss: Callable) -> object:
    """The spec's schedule over this rank's stage ``modules`` (global stage ``indices``)."""
    from torch.distributed import pipelining

    stages = [pipelining.PipelineStage(module, index, len(shapes), torch.device("cpu"),
                                       input_args=shapes[index].inputs,
                                       output_args=shapes[index].outputs, group=group)
              for module, index in zip(modules, indices)]
    schedule_class = getattr(pipelining, SCHEDULES[spec.pp_schedule])
    if spec.stages_per_rank == 1:
        return schedule_class(stages[0], microbatches, loss_fn=loss)
    return schedule_class(stages, microbatches, loss_fn=loss)


def microbatch_count(spec: ParallelSpec, batch: int) -> int:
    """⌈batch ÷ microbatch size⌉."""
    return -(-batch // spec.microbatch_size)


class PipelineIteration:
    """The step of one pipeline rank as a callable (``TrainingIteration``'s contract). The
    first stage's rank feeds ``batch``; the last stage's computes the loss of each microbatch
    (its target made once from the first microbatch's output and kept)."""

    def __init__(self, body: StepBody, schedule, modules: list[nn.Module], batch_size: int,
                 batch: ModelCall | None, optimizer: torch.optim.Optimizer | None, *,
                 observer: StepObserver | None = None,
                 step: Callable[[], object] | None = None,
                 output_shape: tuple[int, ...] = ()) -> None:
        self.body, self.schedule, self.modules, self.batch = body, schedule, modules, batch
        self.batch_size = batch_size
        self.optimizer, self.observer = optimizer, observer or StepObserver()
        self._step = step or (optimizer.step if optimizer is not None else None)
        self._target: list[torch.Tensor | None] = []
        self._backward_began = False
        self.output_shape = output_shape
        for stage in schedule_stages(schedule):
            stage.backward_one_chunk = self._phase_backward(stage.backward_one_chunk)

    def _phase_backward(self, backward: Callable) -> Callable:
        def run(*args, **kwargs):
            if not self._backward_began:
                self._backward_began = True
                self.observer.enter(Phase.BACKWARD)
            return backward(*args, **kwargs)
        return run

    def loss(self, output, _target) -> torch.Tensor:
        """The schedule's loss function (the last stage's output of one microbatch)."""
        body = self.body
        self.observer.loss_begins()
        if body.loss is LossKind.MODEL:
            value = model_loss(output)
        else:
            output = primary_output(output)
            if not self._target:
                self._target.append(make_target(body.loss, output, body.classes_last))
                if self._target[0] is not None:
                    self.observer.target_made(self._target[0])
            value = compute_loss(body.loss, output, self._target[0], body.classes_last)
        self.observer.loss_ends()
        return value

    def __call__(self) -> tuple[int, ...]:
        body, observer = self.body, self.observer
        self._backward_began = False
        observer.enter(Phase.FORWARD)
        args, kwargs = (self.batch.args, self.batch.kwargs) if self.batch else ((), {})
        with cpu_autocast(body.autocast_dtype):
            # the schedule splits a target into microbatches; the loss makes its own, so
            # it is given a zero-byte one
            self.schedule.step(*args, target=torch.empty(self.batch_size, 0),
                               return_outputs=False, **kwargs)
        if not self._backward_began:
            observer.enter(Phase.BACKWARD)
        if self.optimizer is not None:
            observer.enter(Phase.OPTIMIZER)
            if body.clip_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(
                    [p for module in self.modules for p in module.parameters()],
                    body.clip_grad_norm)
            self._step()
            observer.enter(Phase.ZERO_GRAD)
            self.optimizer.zero_grad(set_to_none=not body.keep_zeroed_grads)
        return self.output_shape


def check_microbatches(spec: ParallelSpec, microbatches: int) -> None:
    """The schedules' own rule, said before the trace: 1F1B-family schedules need at least
    as many microbatches as stages."""
    if microbatches < spec.min_microbatches:
        raise InputError(f"the {spec.pp_schedule.value} schedule needs at least {spec.stages} "
                         f"microbatches (one per stage); it has {microbatches}: give "
                         f"--batch-size {spec.batch_step} or more, lower --microbatch-size, "
                         "or use --pp-schedule gpipe")
