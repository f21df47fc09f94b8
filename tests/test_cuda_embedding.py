"""Embedding backward on a CUDA target keeps the sort-and-segment scratch that
``native/cuda/Embedding.cu`` allocates, in the sizes its source gives."""

import pytest
import torch

from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec

VOCAB, DIM, BATCH = 1000, 64, 2


def embedding_net(scale_grad_by_freq: bool = False):
    return torch.nn.Embedding(VOCAB, DIM, scale_grad_by_freq=scale_grad_by_freq)


def _temporaries(tokens: int, device: str, scale: bool = False) -> int:
    spec = TrainingSpec(model="tests.test_cuda_embedding:embedding_net", sample_shape=(tokens,),
                        input_dtype="int64", loss="sum", optimizer="sgd", batch_size=BATCH,
                        device=device, model_args={"scale_grad_by_freq": scale})
    report = estimate(spec).device
    assert report.method == "traced"
    return report.breakdown.temporaries


def _scratch_bytes(lookups: int, scale: bool) -> int:
    """Embedding.cu / EmbeddingBackwardKernel.cu, written out: int64 sorted_indices,
    orig_indices, (count), segment_offsets per lookup; partials_per_segment and its offsets
    per segment; partial_segment_offset and the float32 grad_weight_per_segment per partial
    segment, of which there are at most lookups / 10 + min(lookups, vocabulary)."""
    segments = min(lookups, VOCAB)
    partials = lookups // 10 + segments
    index_tensors = (4 if scale else 3) * lookups + 2 * segments + partials
    return 8 * index_tensors + 4 * partials * DIM


@pytest.mark.parametrize("tokens", [2048, 4096])
def test_over_3072_lookups_cuda_keeps_its_scratch_beside_the_gradient(tokens):
    lookups = BATCH * tokens
    extra = _temporaries(tokens, "cuda") - _temporaries(tokens, "cpu")
    assert extra == _scratch_bytes(lookups, scale=False)


def test_few_lookups_take_the_direct_kernel_with_no_scratch():
    assert BATCH * 1024 <= 3072
    assert _temporaries(1024, "cuda") == _temporaries(1024, "cpu")


def test_scale_grad_by_freq_always_sorts_and_counts():
    extra = _temporaries(1024, "cuda", scale=True) - _temporaries(1024, "cpu", scale=True)
    assert extra == _scratch_bytes(BATCH * 1024, scale=True)


@pytest.mark.parametrize("options", [{}, {"padding_idx": 3}, {"padding_idx": -2},
                                     {"scale_grad_by_freq": True}])
def test_the_rewrite_computes_the_same_gradient(options):
    from memcalc.trace.cuda_kernels import CudaKernelMode

    indices = torch.randint(0, 50, (4000,))
    indices[:10] = 3
    initial = torch.randn(50, 8)

    def step(mode):
        weight = initial.clone().requires_grad_()
        with mode:
            out = torch.nn.functional.embedding(indices, weight, **options)
        out.pow(2).sum().backward()
        return out.detach(), weight.grad, type(out.grad_fn).__name__

    (out_cuda, grad_cuda, rewritten), (out_cpu, grad_cpu, original) = (
        step(CudaKernelMode()), step(torch.enable_grad()))
    assert (rewritten, original) == ("_EmbeddingAsOnCudaBackward", "EmbeddingBackward0")
    assert torch.equal(out_cuda, out_cpu)
    assert torch.allclose(grad_cuda, grad_cpu)
