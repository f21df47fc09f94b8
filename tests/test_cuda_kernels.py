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
    difference = on_cpu.breakdown.activations - on_cuda.breakdown.activations
    assert difference == 3 * probabilities - log_sum_exp


def test_double_registration_is_an_error():
    assert "scaled_dot_product_attention" in substituted_functions()
    with pytest.raises(ValueError, match="registered already"):
        cuda_substitute(F.scaled_dot_product_attention)(lambda *a, **k: None)


@pytest.mark.parametrize("call", [
    lambda y: torch.softmax(y, -1), lambda y: y.log_softmax(-1),
    lambda y: F.layer_norm(y, (8,)), lambda y: torch.nn.GroupNorm(2, 4)(y.view(2, 4, 2)),
], ids=["softmax", "log_softmax", "layer_norm", "group_norm"])
def test_cuda_autocast_runs_normalisations_in_float32(call):
    x, weight = torch.randn(2, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.float16):
        assert call(x @ weight).dtype == torch.float16          # CPU autocast policy
        with CudaKernelMode():
            assert call(x @ weight).dtype == torch.float32      # CUDA autocast policy
    with CudaKernelMode():
        assert call(x.half() @ weight.half()).dtype == torch.float16   # no autocast: untouched


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


@pytest.mark.parametrize("call", [
    lambda y: torch.exp(y), lambda y: y.log(), lambda y: torch.pow(y, 3.0), lambda y: y ** 2,
    lambda y: y.rsqrt(), lambda y: F.softplus(y), lambda y: y.sum(), lambda y: y.cumsum(0),
    lambda y: torch.logsumexp(y, -1), lambda y: y.norm(), lambda y: torch.cdist(y, y),
    lambda y: F.mse_loss(y, y.detach()), lambda y: F.cross_entropy(y, torch.zeros(2).long()),
    lambda y: F.binary_cross_entropy_with_logits(y, torch.ones_like(y)),
], ids=["exp", "log", "pow", "__pow__", "rsqrt", "softplus", "sum", "cumsum", "logsumexp",
        "norm", "cdist", "mse_loss", "cross_entropy", "bce_with_logits"])
def test_cuda_autocast_fp32_list_runs_in_float32(call):
    x, weight = torch.randn(2, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.float16), CudaKernelMode():
        assert call(x @ weight).dtype == torch.float32      # autocast_mode.cpp, CUDA fp32


def test_set_opt_dtype_ops_keep_an_explicit_dtype():
    x, weight = torch.randn(2, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.float16), CudaKernelMode():
        assert (x @ weight).sum(dtype=torch.float16).dtype == torch.float16


def test_promote_ops_run_in_the_widest_floating_dtype():
    x, weight = torch.randn(2, 8), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.float16), CudaKernelMode():
        low = x @ weight
        assert torch.addcmul(low, low, x).dtype == torch.float32
        assert torch.atan2(low, low).dtype == torch.float16
