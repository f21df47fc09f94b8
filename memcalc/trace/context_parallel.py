"""A context-parallel rank's step: torch's ``context_parallel`` around the traced iterations,
and the model's attention taken to the fused kernels torch's ring attention runs.

``context_parallel(mesh, buffers=…)`` shards the batch's sequence in place (load-balanced
head and tail chunks for causal attention) and patches ``F.scaled_dot_product_attention``
so that query, key and value become DTensors on the ``cp`` mesh; DTensor then runs ring
attention on the flash, memory-efficient or cuDNN op (all-gathering keys and values, by
torch's default rotate method), forward and backward. On a CUDA target the kernel
substitution (``memcalc.trace.cuda_kernels``) picks the fused op CUDA would run; on a CPU
target (whose own attention op torch's ring attention does not take) the flash op, whose
fake kernel is CUDA's.

Known limitations: every attention of the model must call ``F.scaled_dot_product_attention``
through the module attribute (torch patches it there), causal, without a mask; inputs are
sharded on axis 1 (tokens or embeddings: batch, sequence, …).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from memcalc.distributed.specs import ParallelSpec
from memcalc.errors import InputError, MemcalcError, TraceError
from memcalc.model.inputs import ModelCall
from memcalc.trace.sdpa_backend import fused_attention

SEQUENCE_AXIS = 1
"""The inputs' sequence axis (batch first)."""
_SDPA = F.scaled_dot_product_attention


@contextlib.contextmanager
def context_parallel_step(parallel: ParallelSpec | None, mesh, batch: ModelCall,
                          cuda_target: bool, backward: Callable[[], bool]
                          ) -> Iterator[RingAttention | None]:
    """The traced iterations of one context-parallel rank (nothing without ``parallel.cp``),
    yielding the ring attention that counts their attention calls and what its ring moves.
    ``cuda_target``: the CUDA kernel substitution is active below (it picks the fused op);
    ``backward``: whether the step is in its backward pass (a recomputation)."""
    if parallel is None or parallel.cp == 1:
        yield None
        return
    from torch.distributed.tensor.experimental import context_parallel

    buffers = sequence_buffers(batch, parallel.cp)
    attention = RingAttention(cuda_target, backward)
    try:
        with (context_parallel(mesh.cp, buffers=buffers,
                               buffer_seq_dims=[SEQUENCE_AXIS] * len(buffers),
                               no_restore_buffers=set(buffers)), attention):
            yield attention
    except MemcalcError:
        raise
    except Exception as error:   # the model's own code, on an input split on axis 1
        if attention.calls:
            raise
        first = (str(error).splitlines() or [""])[0]
        raise TraceError(f"context parallelism: the model failed on its input split on axis 1 "
                         f"before any attention ran ({type(error).__name__}: {first})"
                         ) from error
    if not attention.calls:
        raise InputError("--cp: the model ran no torch.nn.functional.scaled_dot_product_"
                         "attention on its input split on axis 1; context parallelism splits "
                         "attention's sequence over the ranks: drop --cp for this model")


def sequence_buffers(batch: ModelCall, cp: int) -> list[torch.Tensor]:
    """The batch's tensors with a sequence axis, each to be sharded over the ``cp`` ranks
    (in 2 × cp chunks: torch's load balancer gives each rank a head and a tail chunk)."""
    tensors = [tensor for tensor in batch.tensors() if tensor.dim() > SEQUENCE_AXIS]
    if not tensors:
        raise InputError("--cp shards the input's sequence (axis 1 of a batch-first input); "
                         "this model's input has none")
    for tensor in tensors:
        length = tensor.shape[SEQUENCE_AXIS]
        if length % (2 * cp):
            raise InputError(f"--cp {cp}: the sequence length {length} does not split into "
                             f"2 × {cp} equal chunks (torch's load-balanced context "
                             f"parallelism); give a length that is a multiple of {2 * cp}")
    return tensors


def ring_exchange_bytes(moved_bytes: int, cp: int) -> int:
    """Bytes one rank of a ``cp``-rank ring receives of ``moved_bytes`` (``RingAttention.
    moved_bytes``, whole sequence): the (cp − 1)/cp of them it does not hold."""
    return moved_bytes * (cp - 1) // cp


class RingAttention(TorchFunctionMode):
    """``F.scaled_dot_product_attention`` on the DTensors ``context_parallel`` made, run on a
    fused op (ring attention); an attention torch did not patch (the model bound the
    function before the job patched it) or one ring attention cannot run is an error."""

    def __init__(self, cuda_target: bool, backward: Callable[[], bool]) -> None:
        super().__init__()
        self.cuda_target = cuda_target
        self.backward = backward
        self.calls = 0
        self.moved_bytes = 0
        """Keys and values (the DTensors' global size) the ring moves round, whole sequence:
        every run gathers its keys and values (a checkpointed block's recomputation in
        backward too), and every forward run's backward gathers them again and passes their
        gradients round (torch's default all-gather rotation, gradients all-to-all)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not _SDPA:
            return func(*args, **kwargs)
        query, key, value = args[:3]
        _check_ring(query, kwargs.get("attn_mask", args[3] if len(args) > 3 else None),
                    kwargs.get("is_causal", args[5] if len(args) > 5 else False),
                    kwargs.get("enable_gqa", False))
        self.calls += 1
        key_value = sum(tensor.numel() * tensor.element_size() for tensor in (key, value))
        self.moved_bytes += key_value if self.backward() else 3 * key_value
        if self.cuda_target:     # the kernel substitution below picks CUDA's fused op
            return func(*args, **kwargs)
        scale = kwargs.get("scale", args[6] if len(args) > 6 else None)
        return fused_attention("flash", query, key, value, True, scale)


def _check_ring(query: torch.Tensor, mask, is_causal: bool, gqa: bool) -> None:
    if not hasattr(query, "placements"):
        raise TraceError("context parallelism: an attention of the model was not run by "
                         "torch's context_parallel (it patches "
                         "torch.nn.functional.scaled_dot_product_attention; call it through "
                         "the module, not a name bound at import)")
    if mask is not None or not is_causal or gqa:
        raise TraceError("context parallelism is traced for causal attention without a mask "
                         "or enable_gqa (torch's load-balanced ring attention); this model's "
                         "attention has "
                         + ("a mask" if mask is not None else
                            "is_causal=False" if not is_causal else "enable_gqa=True"))
