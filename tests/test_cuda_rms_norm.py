"""RMSNorm as CUDA runs it (``memcalc.trace.cuda_rms_norm``): what the fused kernel saves for
backward (``derivatives.yaml``: ``_fused_rms_norm_backward`` reads the input, the weight and
``rstd``), its gradients against torch's own decomposition, and where torch does not fuse."""

import pytest
import torch
import torch.nn.functional as F

from memcalc.trace._torch_internals import fake_cpu_mode
from memcalc.trace.cuda_kernels import CudaKernelMode

ROWS, WIDTH = (3, 5), 8


def _norm(dtype=torch.bfloat16, weight_dtype=None):
    norm = torch.nn.RMSNorm(WIDTH, eps=1e-5).to(weight_dtype or dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    return norm


@pytest.mark.parametrize("call", [lambda norm, x: norm(x),
                                  lambda norm, x: F.rms_norm(x, (WIDTH,), norm.weight, 1e-5),
                                  lambda norm, x: torch.rms_norm(x, [WIDTH], norm.weight, 1e-5)],
                         ids=["nn.RMSNorm", "F.rms_norm", "torch.rms_norm"])
def test_the_fused_kernel_saves_its_input_weight_and_a_float_per_row(call):
    norm = _norm()
    x = torch.randn(*ROWS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    with CudaKernelMode():
        y = call(norm, x)
    saved_input, saved_weight, rstd = y.grad_fn.saved_tensors
    assert saved_input.data_ptr() == x.data_ptr() and saved_weight is norm.weight
    assert rstd.dtype == torch.float32 and rstd.shape == (*ROWS, 1)
    # the decomposition CPU runs instead saves a float32 copy of the input and the float32
    # normalized tensor, 8 bytes per element
    composite = F.rms_norm(x, (WIDTH,), norm.weight, 1e-5)
    assert composite.grad_fn.name() != y.grad_fn.name()


@pytest.mark.parametrize(("dtype", "eps"), [(torch.float32, 1e-5), (torch.bfloat16, None)],
                         ids=["float32", "bfloat16, eps by its dtype"])
def test_its_output_and_gradients_are_torchs_own(dtype, eps):
    norm = _norm(dtype)
    norm.eps = eps
    x = (0.05 * torch.randn(*ROWS, WIDTH)).to(dtype).requires_grad_()  # eps matters here
    expected = F.rms_norm(x, (WIDTH,), norm.weight, eps)
    expected_grads = torch.autograd.grad(expected.square().sum(), [x, norm.weight])
    with CudaKernelMode():
        y = norm(x)
    grads = torch.autograd.grad(y.square().sum(), [x, norm.weight])
    torch.testing.assert_close(y, expected)
    for grad, want in zip(grads, expected_grads):
        torch.testing.assert_close(grad, want)


def test_on_fake_tensors_it_allocates_only_the_kernels_outputs():
    with fake_cpu_mode():
        norm = torch.nn.RMSNorm(WIDTH, eps=1e-5, dtype=torch.bfloat16)
        x = torch.empty(*ROWS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
        with CudaKernelMode():
            y = norm(x)
        rstd = y.grad_fn.saved_tensors[2]
        (grad,) = torch.autograd.grad(y, [x], torch.ones_like(y))
    assert y.shape == x.shape and y.dtype == x.dtype
    assert grad.shape == x.shape and grad.dtype == x.dtype
    assert rstd.shape == (*ROWS, 1) and rstd.dtype == torch.float32


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
@pytest.mark.parametrize("case", ["weight of another dtype", "channels last"])
def test_where_torch_does_not_fuse_the_decomposition_runs(case):
    if case == "weight of another dtype":      # rms_norm_symint: a dtype mismatch decomposes
        norm, x = _norm(torch.bfloat16, torch.float32), torch.randn(*ROWS, WIDTH,
                                                                    dtype=torch.bfloat16)
        shape = (WIDTH,)
    else:
        norm = torch.nn.RMSNorm((4, 4), eps=1e-5)
        x = torch.randn(2, 3, 4, 4).to(memory_format=torch.channels_last)
        shape = (4, 4)
    x.requires_grad_()
    with CudaKernelMode():
        y = F.rms_norm(x, shape, norm.weight, 1e-5)
    assert y.grad_fn.name() == F.rms_norm(x, shape, norm.weight, 1e-5).grad_fn.name()
