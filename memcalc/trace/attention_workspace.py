"""cuDNN attention's backward workspace, for the trace of a CUDA target.

Flash and cuDNN attention run in the trace as CPU's flash kernel (``cuda_kernels``), whose
backward allocates the three gradients only. cuDNN's backward also takes a workspace from
the caching allocator for the call: a float32 accumulator of the query's gradient
(batch × heads × query length × head dim) and a float32 sum per query row (cudnn-frontend's
SDPA backward: ``dQ_accum`` and ``softmax_sum``). Measured on an H200 (torch 2.11, cuDNN
9.19): a request of 258 MiB and 256 bytes for Llama 3 8B's attention at (2, 32, 8192, 128),
after the gradients and freed at once — 256 MiB + 2 MiB by this rule, and 256 bytes more
(``benchmarks/gpu_data/h200-rank-traces.json.gz``).

Known limitations: the workspace of flash attention's backward (its own float32 ``dq_accum``
and ``softmax_d``, as separate blocks) and of cuDNN's forward are not modelled.
"""

from __future__ import annotations

from collections.abc import Callable

from memcalc.trace.sdpa_backend import AttentionCall, cuda_sdpa_backend

_BACKWARD = "_scaled_dot_product_flash_attention_for_cpu_backward"
_FLOAT32_BYTES = 4
_EXTRA_BYTES = 256
"""What the measured request holds beyond the two buffers (cudnn-frontend's workspace layout)."""


def cudnn_backward_workspace_bytes(query) -> int:
    """cuDNN attention backward's workspace for a (batch, heads, length, head dim) query."""
    batch, heads, length, head_dim = query.shape
    return batch * heads * length * (head_dim + 1) * _FLOAT32_BYTES + _EXTRA_BYTES


class AttentionWorkspaces:
    """Op hook for ``StorageWatcher``: after a fused attention backward that CUDA would run on
    cuDNN, its workspace as a transient allocation."""

    def __init__(self, capability: tuple[int, int], transient: Callable[[int], None]) -> None:
        self._capability, self._transient = capability, transient

    def __call__(self, name: str, args: tuple, outputs, watch: Callable) -> bool:
        if name != _BACKWARD:
            return False
        _, query, key, value, _, _, dropout_p, is_causal = args[:8]
        call = AttentionCall(query.dtype, query.shape[-1], value.shape[-1], query.shape[-2],
                             key.shape[-2], False, float(dropout_p), bool(is_causal), True)
        watch(outputs)
        if cuda_sdpa_backend(call, self._capability) == "cudnn":
            self._transient(cudnn_backward_workspace_bytes(query))
        return True


def first_taker(*hooks) -> Callable | None:
    """One op hook from several: each op goes to the first hook that handles it."""
    hooks = [hook for hook in hooks if hook is not None]
    if len(hooks) < 2:
        return hooks[0] if hooks else None
    return lambda *call: any(hook(*call) for hook in hooks)
