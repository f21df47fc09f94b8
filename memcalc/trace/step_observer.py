"""What the tracer learns from the step as it runs: where it is (phase, iteration, module)
for every new storage, and what each tensor the step made is (target, activation, gradient,
optimizer state), with the first iteration's FLOPs."""

from __future__ import annotations

import torch
from torch import nn

from memcalc.trace._torch_internals import FlopCountingMode, StorageWatcher, local_tensor
from memcalc.trace.categories import MemoryCategory
from memcalc.trace.flops import StepFlops, step_flops_of
from memcalc.trace.ledger import MemoryLedger, Phase
from memcalc.trace.step import StepObserver

# Module paths given to storages made outside any submodule.
ROOT_MODULE_LABEL = "(model)"
LOSS_LABEL = "(loss)"


class Cursor:
    """Where the step is now; new storages are stamped with it."""

    def __init__(self, safe_point=lambda: None) -> None:
        self.phase, self.iteration, self.module_stack = Phase.SETUP, 0, []
        self.safe_point = safe_point
        """Called where a pending Ctrl-C may be delivered (``memcalc.trace.interrupts``)."""

    @property
    def module_path(self) -> str:
        return self.module_stack[-1] if self.module_stack else ""


class LedgerObserver(StepObserver):
    """Stamps new storages with the phase, labels what the step made (target, activations,
    gradients, optimizer state) and counts the first iteration's FLOPs (forward, loss,
    backward; recomputation included when checkpointing) and the kernels it launches, the
    optimizer's step included."""

    def __init__(self, watcher: StorageWatcher, cursor: Cursor, ledger: MemoryLedger,
                 model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.watcher, self.cursor, self.ledger = watcher, cursor, ledger
        self.model, self.optimizer = model, optimizer
        self.first_forward_record = 0
        self.counter: FlopCountingMode | None = None
        self.flops: StepFlops | None = None

    def enter(self, phase: Phase) -> None:
        self.cursor.safe_point()
        if phase is Phase.FORWARD:
            self.first_forward_record = len(self.ledger.records)
            if self.cursor.iteration == 1:
                self.counter = FlopCountingMode()
                self.counter.__enter__()
        elif phase is Phase.BACKWARD:
            for record in self.ledger.records[self.first_forward_record:]:
                if not record.freed and record.category is MemoryCategory.TEMPORARY:
                    record.category = MemoryCategory.ACTIVATION
        elif phase is Phase.OPTIMIZER:
            if self.counter is not None:   # the optimizer's step is timed, not counted
                self.counter.flops_closed = True
            label(self.watcher, (p.grad for p in self.model.parameters()
                                  if p.grad is not None), MemoryCategory.GRADIENT)
        elif phase is Phase.ZERO_GRAD:
            self.stop_counting()
            label(self.watcher, (value for state in self.optimizer.state.values()
                                  for value in state.values() if isinstance(value, torch.Tensor)),
                   MemoryCategory.OPTIMIZER_STATE)
        self.cursor.phase = phase

    def target_made(self, target: torch.Tensor) -> None:
        label(self.watcher, [target], MemoryCategory.INPUT)

    def loss_begins(self) -> None:
        self.cursor.module_stack.append(LOSS_LABEL)

    def loss_ends(self) -> None:
        self.cursor.module_stack.pop()

    def stop_counting(self) -> None:
        if self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.flops = step_flops_of(self.counter.by_op, self.counter.launched_ops,
                                       tuple(self.counter.kernels))
            self.counter = None


def label(watcher: StorageWatcher, tensors, category: MemoryCategory) -> None:
    for tensor in tensors:
        record = watcher.watch(local_tensor(tensor))
        if record is not None:
            record.category = category


def track_modules(model: nn.Module, cursor: Cursor) -> list:
    """Forward hooks that keep ``cursor.module_stack`` (hooks must return None)."""

    def enter(name: str) -> None:
        cursor.safe_point()
        cursor.module_stack.append(name)

    def leave() -> None:
        cursor.module_stack.pop()

    handles = []
    for name, module in model.named_modules():
        name = name or ROOT_MODULE_LABEL
        handles.append(module.register_forward_pre_hook(lambda _m, _a, name=name: enter(name)))
        handles.append(module.register_forward_hook(lambda _m, _a, _o: leave()))
    return handles


