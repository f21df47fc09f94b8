"""cuDNN attention's backward workspace (``memcalc.trace.attention_workspace``) against the
allocator history of a real Llama 3 8B rank on an H200, and the backend that takes it."""

from __future__ import annotations

import torch

from memcalc.trace.attention_workspace import (_BACKWARD, AttentionWorkspaces,
                                               cudnn_backward_workspace_bytes)
from tests.fixtures import gpu_data

LLAMA3_8B_QUERY = (2, 32, 8192, 128)     # batch 2 × 8192 tokens, 32 heads of 128
"""The query of the measured rank's attention (``tests.fixtures.gpu_rank_cases``)."""


def test_the_rule_gives_the_block_the_h200_allocated_after_each_attention_backward():
    history = gpu_data.rank_traces()["llama3-8b fsdp8 bf16 full b2 clip"]["trace"]
    nbytes = cudnn_backward_workspace_bytes(torch.empty(LLAMA3_8B_QUERY, device="meta"))
    blocks = [size for action, size, *_ in history if action == "alloc" and size == nbytes]
    assert len(blocks) == 2 * 32        # two steps × 32 blocks, one backward each
    assert nbytes == 2 * 32 * 8192 * (128 + 1) * 4 + 256


def _backward_call(dtype: torch.dtype, head_dim: int = 64) -> tuple:
    query = torch.empty(2, 4, 256, head_dim, dtype=dtype, device="meta")
    return (query, query, query, query, query, torch.empty(2, 4, 256, device="meta"), 0.0, True)


def test_only_a_call_cuda_runs_on_cudnn_takes_the_workspace():
    def taken(capability, dtype) -> list[int]:
        transients, watched = [], []
        hook = AttentionWorkspaces(capability, transients.append)
        assert hook(_BACKWARD, _backward_call(dtype), ("gradients",), watched.append)
        assert watched == [("gradients",)]          # the gradients first, then the workspace
        return transients

    assert taken((9, 0), torch.bfloat16) == [2 * 4 * 256 * 65 * 4 + 256]      # H100/H200: cuDNN
    assert taken((8, 0), torch.bfloat16) == []                          # A100: flash
    assert taken((9, 0), torch.float32) == []                           # memory-efficient
    assert not AttentionWorkspaces((9, 0), list().append)("mm", (), None, print)
