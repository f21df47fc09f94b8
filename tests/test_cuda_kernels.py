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
