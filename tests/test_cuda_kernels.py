import pytest
import torch
import torch.nn.functional as F

from memcalc.trace.cuda_kernels import CudaKernelMode, cuda_substitute, substituted_functions
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec

BATCH, SEQ, HEADS = 2, 256, 4


def test_sdpa_with_dropout_keeps_no_attention_matrix_on_cuda():
    spec = TrainingSpec(model="tests.fixtures.models:attention_with_dropout",
                        sample_shape=(SEQ, 64), loss="sum", optimizer="sgd", batch_size=BATCH)
    on_cpu = estimate(spec.with_changes(device="cpu")).device
    on_cuda = estimate(spec).device
    probabilities = BATCH * HEADS * SEQ * SEQ * 4
    # CPU's math kernel keeps three S x S fp32 tensors for backward (the probabilities, the
    # scaled float dropout mask, the dropped probabilities); CUDA's kernels keep instead one
    # fp32 log-sum-exp per row (the output is kept by both)
    log_sum_exp = BATCH * HEADS * SEQ * 4
    # the memory-efficient kernel (float32) also returns its RNG seed and offset, two int64
    # scalars that CUDA keeps on the host and the trace's fake kernel makes beside the rest
    seed_and_offset = 2 * 8
    difference = on_cpu.breakdown.activations - on_cuda.breakdown.activations
    assert difference == 3 * probabilities - log_sum_exp - seed_and_offset


def test_double_registration_is_an_error():
    assert "scaled_dot_product_attention" in substituted_functions()
    with pytest.raises(ValueError, match="registered already"):
        cuda_substitute(F.scaled_dot_product_attention)(lambda *a, **k: None)


WIDTH, ROWS, LAYERS = 16, 4096, 8  # masks of 256 KiB and 64 KiB; activations dominate


def dropout_after_linear():
    """LAYERS x (Linear(16 -> 16), Dropout(0.5)): each dropout keeps a ROWS x WIDTH mask."""
    layers = [(torch.nn.Linear(WIDTH, WIDTH), torch.nn.Dropout(0.5)) for _ in range(LAYERS)]
    return torch.nn.Sequential(*[module for pair in layers for module in pair])


def test_dropout_keeps_a_one_byte_mask_on_cuda():
    spec = TrainingSpec(model="tests.test_cuda_kernels:dropout_after_linear",
                        sample_shape=(WIDTH,), loss="sum", optimizer="sgd", batch_size=ROWS)
    on_cpu = estimate(spec.with_changes(device="cpu")).device
    on_cuda = estimate(spec).device
    # CPU (Dropout.cpp ``_dropout``): input * noise keeps the noise in float32, 4 bytes each;
    # CUDA (``native_dropout``): one bool per element. The peak comes in backward, once the
    # last dropout's backward has freed its mask: LAYERS - 1 masks are alive there.
    elements = (LAYERS - 1) * ROWS * WIDTH
    assert on_cpu.breakdown.activations - on_cuda.breakdown.activations == elements * (4 - 1)


@pytest.mark.parametrize("call", [lambda x: F.dropout(x, 0.1), lambda x: torch.dropout(x, 0.1, True),
                                  lambda x: torch.nn.Dropout(0.1)(x)],
                         ids=["F.dropout", "torch.dropout", "nn.Dropout"])
def test_fused_dropout_saves_a_bool_mask_of_the_input_shape(call):
    x = torch.randn(3, 5, requires_grad=True)
    with CudaKernelMode():
        y = call(x)
    assert y.grad_fn.name() == "NativeDropoutBackward0"
    assert y.grad_fn._saved_result1.dtype == torch.bool
    assert y.grad_fn._saved_result1.shape == x.shape


@pytest.mark.parametrize("call", [lambda x: F.dropout(x, 0.1, training=False),
                                  lambda x: F.dropout(x, 0.0), lambda x: F.dropout(x.clone(), 0.1, inplace=True)],
                         ids=["eval", "p=0", "inplace"])
def test_dropout_outside_the_fused_kernels_conditions_is_left_alone(call):
    x = torch.randn(3, 5, requires_grad=True)
    with CudaKernelMode():
        y = call(x)
    assert y.grad_fn is None or y.grad_fn.name() != "NativeDropoutBackward0"


def batch_norm_net():
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8))


def lstm_net():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 8, batch_first=True)

        def forward(self, x):
            return self.lstm(x)[0]

    return Net()


@pytest.mark.parametrize("model, line", [("batch_norm_net", "cuDNN batch norm"),
                                         ("lstm_net", "cuDNN RNN")])
def test_kernels_whose_cuda_memory_is_not_modelled_are_listed(model, line):
    spec = TrainingSpec(model=f"tests.test_cuda_kernels:{model}", sample_shape=(3, 8),
                        loss="sum", optimizer="sgd", batch_size=4)
    if model == "batch_norm_net":
        spec = spec.with_changes(sample_shape=(8,))
    report = estimate(spec)
    assert report.device.method == "traced"
    assert any(entry.startswith(line) for entry in report.unsupported)
    assert report.device.unmodelled_kernels
    on_cpu = estimate(spec.with_changes(device="cpu"))
    assert not any(entry.startswith(line) for entry in on_cpu.unsupported)


@pytest.mark.parametrize("dtype,output_projection_copies", [
    (torch.float32, False),   # memory-efficient: output (batch, seq, heads, dim) always
    (torch.bfloat16, True)])  # cuDNN on sm90: output laid out as the query is
def test_attention_output_is_laid_out_as_cudas_kernel_lays_it_out(dtype, output_projection_copies):
    # a query made contiguous as (batch, heads, seq, dim), as rotary embeddings leave it:
    # `out.transpose(1, 2).contiguous()` before the output projection copies only where the
    # kernel's output follows that layout (aten's _efficient_attention_forward allocates
    # {B, M, num_heads, Kv}; cuDNN's matches the query's)
    from memcalc.trace._torch_internals import fake_cpu_mode

    with fake_cpu_mode(), CudaKernelMode((9, 0)):
        query = torch.randn(BATCH, HEADS, SEQ, 64, dtype=dtype, requires_grad=True)
        out = F.scaled_dot_product_attention(query, query, query, is_causal=True)
        assert out.shape == query.shape
        assert out.transpose(1, 2).is_contiguous() is not output_projection_copies
        out.sum().backward()
        assert query.grad.shape == query.shape
