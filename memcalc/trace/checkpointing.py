"""Activation checkpointing of a model's repeated blocks, as users apply it.

The blocks are the instances of the module class that repeats (two or more instances, not a
container) and holds the most parameters in total: residual blocks, transformer layers.
Each block's ``forward`` is replaced by ``torch.utils.checkpoint.checkpoint(...,
use_reentrant=False)``: its inner activations are dropped after forward and recomputed in
backward; only its inputs are kept.

The recomputation runs in the autograd engine, which clears the torch-function modes of the
forward (``memcalc.trace.cuda_kernels`` substitutes CUDA's fused dropout there): the
checkpoint's recompute context enters the forward's modes again, so the recomputed tensors
are those of the forward (torch's metadata check passes for a model with dropout).
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter, defaultdict

from torch import nn
from torch.utils.checkpoint import checkpoint

from memcalc.trace._torch_internals import function_mode_stack

_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def repeated_blocks(model: nn.Module) -> list[str]:
    """Qualified names of the blocks to checkpoint (empty when nothing repeats)."""
    instances: dict[type, list[str]] = defaultdict(list)
    parameters: Counter = Counter()
    for name, module in model.named_modules():
        if not name or isinstance(module, _CONTAINERS) or not any(True for _ in module.children()):
            continue
        instances[type(module)].append(name)
        parameters[type(module)] += sum(p.numel() for p in module.parameters())
    repeated = [kind for kind, names in instances.items() if len(names) >= 2 and parameters[kind]]
    if not repeated:
        return []
    chosen = max(repeated, key=lambda kind: parameters[kind])
    return instances[chosen]


def apply_checkpointing(model: nn.Module, names: list[str]) -> None:
    """Wrap each named block's forward in non-reentrant checkpointing, in place."""
    modules = dict(model.named_modules())
    for name in names:
        module = modules[name]
        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False,
                                           context_fn=forward_modes_in_recompute)


def forward_modes_in_recompute() -> tuple[contextlib.AbstractContextManager,
                                          contextlib.AbstractContextManager]:
    """``checkpoint``'s ``context_fn``: nothing around the forward; around the recomputation,
    the torch-function modes that were active when the forward ran."""
    modes = function_mode_stack()
    return contextlib.nullcontext(), _entered(modes)


@contextlib.contextmanager
def _entered(modes):
    with contextlib.ExitStack() as stack:
        for mode in modes:
            stack.enter_context(mode)
        yield
