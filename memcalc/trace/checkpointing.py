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

import torch
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

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


SELECTIVE = "selective"
FULL = "full"


def policy_blocks(policy: str, blocks: list[str]) -> list[str]:
    """The blocks a policy checkpoints: all of them (``full``, ``selective``), or every N-th
    (``every:N``, torchtitan's layer frequency: blocks N, 2N, … counted from 1)."""
    if policy.startswith("every:"):
        every = int(policy.removeprefix("every:"))
        return blocks[every - 1::every]
    return blocks


def apply_checkpointing(model: nn.Module, names: list[str], policy: str = FULL) -> None:
    """Wrap each named block's forward in non-reentrant checkpointing, in place; with
    ``selective``, per-op selective checkpointing inside each block (``selective_contexts``)."""
    modules = dict(model.named_modules())
    context_fn = selective_contexts if policy == SELECTIVE else forward_modes_in_recompute
    for name in names:
        module = modules[name]
        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False,
                                           context_fn=context_fn)


def forward_modes_in_recompute() -> tuple[contextlib.AbstractContextManager,
                                          contextlib.AbstractContextManager]:
    """``checkpoint``'s ``context_fn``: nothing around the forward; around the recomputation,
    the torch-function modes that were active when the forward ran."""
    modes = function_mode_stack()
    return contextlib.nullcontext(), _entered(modes)


SAVED_OPS = frozenset(name for name in (
    "mm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "max") if hasattr(torch.ops.aten, name))
"""torchtitan's ``_save_list`` (``activation_checkpoint.py``): matmuls, the fused attention
kernels (CPU's flash kernel stands for CUDA's in the trace) and ``max`` (low-precision
scaling); its reduce-scatter entry concerns async tensor parallelism, not traced."""


def selective_contexts() -> tuple[contextlib.AbstractContextManager,
                                  contextlib.AbstractContextManager]:
    """torchtitan's per-op selective checkpointing (``ac_mode="selective"``, ``op``): the
    outputs of ``SAVED_OPS`` are kept, except every second matmul, the rest recomputed;
    the recomputation also enters the forward's torch-function modes again."""
    counts = {False: 0, True: 0}

    def policy(ctx, func, *args, **kwargs):
        name = func.overloadpacket.__name__
        if name == "mm":
            counts[ctx.is_recompute] += 1
        keep = name in SAVED_OPS and not (name == "mm" and counts[ctx.is_recompute] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    forward, recompute = create_selective_checkpoint_contexts(policy)
    modes = function_mode_stack()
    return forward, _entered(modes, recompute)


@contextlib.contextmanager
def _entered(modes, *contexts):
    with contextlib.ExitStack() as stack:
        for mode in modes:
            stack.enter_context(mode)
        for context in contexts:
            stack.enter_context(context)
        yield
