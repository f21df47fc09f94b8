"""CUDA autocast's policies as the trace applies them, held to the installed torch's own
AutocastCUDA kernels on fake CUDA tensors (tests/fixtures/cuda_autocast_reference.py)."""

import pytest
import torch
import torch.nn.functional as F

from memcalc.trace.cuda_autocast_audit import AUDIT
from memcalc.trace.cuda_kernels import CudaKernelMode
from tests.fixtures.cuda_autocast_reference import (
    emulated_cuda_autocast,
    output_dtypes,
    real_cuda_autocast,
)

# call(low_precision, fp32, ints): one per op of either autocast list the trace can reach
CALLS = {
    # lower precision on CUDA
    "mm": lambda h, f, i: torch.mm(f(4, 4), f(4, 4)),
    "matmul": lambda h, f, i: f(2, 4, 4) @ f(4, 4),
    "linear": lambda h, f, i: F.linear(f(2, 4), f(3, 4), f(3)),
    "bmm": lambda h, f, i: torch.bmm(f(2, 4, 4), f(2, 4, 4)),
    "baddbmm": lambda h, f, i: torch.baddbmm(f(2, 4, 4), f(2, 4, 4), f(2, 4, 4)),
    "addmm": lambda h, f, i: torch.addmm(f(4, 4), f(4, 4), f(4, 4)),
    "addbmm": lambda h, f, i: torch.addbmm(f(4, 4), f(2, 4, 4), f(2, 4, 4)),
    "addmv": lambda h, f, i: torch.addmv(f(4), f(4, 4), f(4)),
    "addr": lambda h, f, i: torch.addr(f(4, 4), f(4), f(4)),
    "mv": lambda h, f, i: torch.mv(f(4, 4), f(4)),
    "dot": lambda h, f, i: torch.dot(f(4), f(4)),
    "vdot": lambda h, f, i: torch.vdot(f(4), f(4)),
    "einsum": lambda h, f, i: torch.einsum("ij,jk->ik", f(4, 4), f(4, 4)),
    "chain_matmul": lambda h, f, i: torch.linalg.multi_dot([f(4, 4), f(4, 4), f(4, 4)]),
    "prelu": lambda h, f, i: F.prelu(f(2, 3, 4), f(3)),
    "conv2d": lambda h, f, i: F.conv2d(f(1, 2, 5, 5), f(3, 2, 3, 3)),
    "conv_transpose2d": lambda h, f, i: F.conv_transpose2d(f(1, 2, 5, 5), f(2, 3, 3, 3)),
    "conv1d": lambda h, f, i: F.conv1d(f(1, 2, 5), f(3, 2, 3)),
    "conv3d": lambda h, f, i: F.conv3d(f(1, 2, 5, 5, 5), f(3, 2, 3, 3, 3)),
    "conv2d_same": lambda h, f, i: F.conv2d(f(1, 2, 5, 5), f(3, 2, 3, 3), padding="same"),
    "bilinear": lambda h, f, i: F.bilinear(f(2, 4), f(2, 5), f(3, 4, 5)),
    "sdpa": lambda h, f, i: F.scaled_dot_product_attention(
        f(1, 2, 8, 16), f(1, 2, 8, 16), f(1, 2, 8, 16)
    ),
    "cat_mixed": lambda h, f, i: torch.cat([h(2, 2), f(2, 2)]),
    "stack_mixed": lambda h, f, i: torch.stack([h(2, 2), f(2, 2)]),
    "cat_low": lambda h, f, i: torch.cat([h(2, 2), h(2, 2)]),
    # fp32
    "acos": lambda h, f, i: torch.acos(h(4)),
    "asin": lambda h, f, i: h(4).asin(),
    "cosh": lambda h, f, i: h(4).cosh(),
    "erfinv": lambda h, f, i: h(4).erfinv(),
    "exp": lambda h, f, i: h(4).exp(),
    "expm1": lambda h, f, i: h(4).expm1(),
    "log": lambda h, f, i: h(4).log(),
    "log10": lambda h, f, i: h(4).log10(),
    "log2": lambda h, f, i: h(4).log2(),
    "log1p": lambda h, f, i: h(4).log1p(),
    "reciprocal": lambda h, f, i: h(4).reciprocal(),
    "rsqrt": lambda h, f, i: h(4).rsqrt(),
    "sinh": lambda h, f, i: h(4).sinh(),
    "tan": lambda h, f, i: h(4).tan(),
    "pow_scalar": lambda h, f, i: h(4) ** 2,
    "rpow": lambda h, f, i: 2 ** h(4),
    "pow_tt": lambda h, f, i: torch.pow(h(4), h(4)),
    "torch_pow": lambda h, f, i: torch.pow(h(4), 3.0),
    "softplus": lambda h, f, i: F.softplus(h(4)),
    "layer_norm": lambda h, f, i: F.layer_norm(h(2, 4), (4,), f(4), f(4)),
    "group_norm": lambda h, f, i: F.group_norm(h(2, 4, 3), 2, f(4), f(4)),
    "rms_norm": lambda h, f, i: F.rms_norm(h(2, 4), (4,), f(4)),
    "frobenius_norm": lambda h, f, i: torch.norm(h(4, 4), dim=(0, 1)),
    "nuclear_norm": lambda h, f, i: torch.norm(f(4, 4), p="nuc"),
    "cosine_similarity": lambda h, f, i: F.cosine_similarity(h(2, 4), h(2, 4)),
    "poisson_nll_loss": lambda h, f, i: F.poisson_nll_loss(h(4), h(4)),
    "cosine_embedding_loss": lambda h, f, i: F.cosine_embedding_loss(
        h(2, 4), h(2, 4), torch.ones(2, device=h(1).device)
    ),
    "nll_loss": lambda h, f, i: F.nll_loss(h(2, 3), i(2)),
    "nll_loss2d": lambda h, f, i: F.nll_loss(h(2, 3, 4, 4), i(2, 4, 4)),
    "hinge_embedding_loss": lambda h, f, i: F.hinge_embedding_loss(h(4), h(4)),
    "kl_div": lambda h, f, i: F.kl_div(h(4), h(4), reduction="batchmean"),
    "l1_loss": lambda h, f, i: F.l1_loss(h(4), h(4)),
    "smooth_l1_loss": lambda h, f, i: F.smooth_l1_loss(h(4), h(4)),
    "huber_loss": lambda h, f, i: F.huber_loss(h(4), h(4)),
    "mse_loss": lambda h, f, i: F.mse_loss(h(4), h(4)),
    "margin_ranking_loss": lambda h, f, i: F.margin_ranking_loss(h(4), h(4), h(4)),
    "multilabel_margin_loss": lambda h, f, i: F.multilabel_margin_loss(h(2, 3), i(2, 3)),
    "soft_margin_loss": lambda h, f, i: F.soft_margin_loss(h(4), h(4)),
    "triplet_margin_loss": lambda h, f, i: F.triplet_margin_loss(h(2, 4), h(2, 4), h(2, 4)),
    "multi_margin_loss": lambda h, f, i: F.multi_margin_loss(h(2, 3), i(2)),
    "bce_with_logits": lambda h, f, i: F.binary_cross_entropy_with_logits(h(4), h(4)),
    "cross_entropy": lambda h, f, i: F.cross_entropy(h(2, 3), i(2)),
    "cross_entropy_ls": lambda h, f, i: F.cross_entropy(h(2, 3), i(2), label_smoothing=0.1),
    "dist": lambda h, f, i: torch.dist(h(4), h(4)),
    "pdist": lambda h, f, i: F.pdist(h(3, 4)),
    "cdist": lambda h, f, i: torch.cdist(h(3, 4), h(3, 4)),
    "renorm": lambda h, f, i: h(3, 4).renorm(2, 0, 1.0),
    "logsumexp": lambda h, f, i: h(3, 4).logsumexp(-1),
    "upsample_nearest": lambda h, f, i: F.interpolate(h(1, 1, 4, 4), scale_factor=2),
    "upsample_bilinear": lambda h, f, i: F.interpolate(
        h(1, 1, 4, 4), scale_factor=2, mode="bilinear"
    ),
    "upsample_trilinear": lambda h, f, i: F.interpolate(
        h(1, 1, 4, 4, 4), scale_factor=2, mode="trilinear"
    ),
    "upsample_nearest_exact": lambda h, f, i: F.interpolate(
        h(1, 1, 4, 4), scale_factor=2, mode="nearest-exact"
    ),
    "upsample_bicubic": lambda h, f, i: F.interpolate(
        h(1, 1, 4, 4), scale_factor=2, mode="bicubic"
    ),
    "grid_sample3d": lambda h, f, i: F.grid_sample(
        h(1, 1, 4, 4, 4), h(1, 2, 2, 2, 3), align_corners=False
    ),
    # set opt dtype
    "softmax": lambda h, f, i: h(3, 4).softmax(-1),
    "log_softmax": lambda h, f, i: F.log_softmax(h(3, 4), -1),
    "softmax_dtype": lambda h, f, i: h(3, 4).softmax(-1, dtype=torch.float16),
    "sum": lambda h, f, i: h(3, 4).sum(),
    "sum_dim": lambda h, f, i: h(3, 4).sum(-1),
    "sum_dtype": lambda h, f, i: h(3, 4).sum(dtype=torch.float16),
    "prod": lambda h, f, i: h(3, 4).prod(),
    "prod_dim": lambda h, f, i: h(3, 4).prod(-1),
    "cumsum": lambda h, f, i: h(3, 4).cumsum(0),
    "cumprod": lambda h, f, i: h(3, 4).cumprod(0),
    "norm": lambda h, f, i: h(3, 4).norm(),
    "norm_dim": lambda h, f, i: h(3, 4).norm(dim=1),
    "vector_norm": lambda h, f, i: torch.linalg.vector_norm(h(3, 4)),
    "matrix_norm": lambda h, f, i: torch.linalg.matrix_norm(h(3, 4)),
    "mean": lambda h, f, i: h(3, 4).mean(),
    # promote
    "addcdiv": lambda h, f, i: torch.addcdiv(h(4), h(4), f(4)),
    "addcmul": lambda h, f, i: torch.addcmul(h(4), f(4), h(4)),
    "atan2": lambda h, f, i: torch.atan2(h(4), f(4)),
    "cross": lambda h, f, i: torch.cross(h(2, 3), f(2, 3), dim=1),
    "grid_sample_mixed": lambda h, f, i: F.grid_sample(
        h(1, 1, 4, 4, 4), f(1, 2, 2, 2, 3), align_corners=False
    ),
    "dot_mixed": lambda h, f, i: torch.dot(h(4), f(4)),
    "vdot_mixed": lambda h, f, i: torch.vdot(h(4), f(4)),
    "conv_tbc": lambda h, f, i: torch.conv_tbc(f(5, 2, 3), f(3, 3, 4), f(4)),
    "matrix_power": lambda h, f, i: torch.linalg.matrix_power(f(3, 3), 2),
    "outer": lambda h, f, i: torch.outer(f(3), f(3)),
    "inner": lambda h, f, i: torch.inner(f(3), f(3)),
    "kron": lambda h, f, i: torch.kron(f(2, 2), f(2, 2)),
    "cosine_similarity_mixed": lambda h, f, i: F.cosine_similarity(h(2, 4), f(2, 4)),
    "index_put": lambda h, f, i: h(4).index_put((i(2, high=4),), f(2)),
    "scatter_add": lambda h, f, i: h(4).scatter_add(0, i(2, high=4), f(2)),
    "tensordot": lambda h, f, i: torch.tensordot(h(2, 3), f(3, 2), dims=1),
    "index_copy": lambda h, f, i: h(4).index_copy(0, i(2, high=4), h(2)),
    # CPU-only fp32
    "max_pool3d": lambda h, f, i: F.max_pool3d(h(1, 1, 4, 4, 4), 2),
    "avg_pool3d": lambda h, f, i: F.avg_pool3d(h(1, 1, 4, 4, 4), 2),
    "adaptive_avg_pool3d": lambda h, f, i: F.adaptive_avg_pool3d(h(1, 1, 4, 4, 4), 2),
    "adaptive_max_pool3d": lambda h, f, i: F.adaptive_max_pool3d(h(1, 1, 4, 4, 4), 2),
    "max_pool2d": lambda h, f, i: F.max_pool2d(h(1, 1, 4, 4), 2),
    "reflect_pad2d": lambda h, f, i: F.pad(h(1, 1, 4, 4), (1, 1, 1, 1), mode="reflect"),
    "replicate_pad3d": lambda h, f, i: F.pad(
        h(1, 1, 4, 4, 4), (1, 1, 1, 1, 1, 1), mode="replicate"
    ),
    "constant_pad": lambda h, f, i: F.pad(h(1, 1, 4, 4), (1, 1)),
    "fft": lambda h, f, i: torch.fft.rfft(f(8)),
    "stft": lambda h, f, i: torch.stft(f(64), 16, return_complex=True),
    "trace": lambda h, f, i: torch.trace(h(3, 3)),
    "gelu": lambda h, f, i: F.gelu(h(4)),
    "silu": lambda h, f, i: F.silu(h(4)),
    "embedding": lambda h, f, i: F.embedding(i(3, high=5), f(5, 4)),
}


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_the_trace_runs_each_op_in_the_dtype_cuda_autocast_does(name, low):
    expected = output_dtypes(CALLS[name], low, real_cuda_autocast)
    assert output_dtypes(CALLS[name], low, emulated_cuda_autocast) == expected


def _registrations(key: str) -> set[str]:
    return {
        name.removeprefix("aten::")
        for name in torch._C._dispatch_get_registrations_for_dispatch_key(key)
    }


def test_every_op_only_one_autocast_registers_is_audited():
    cuda, cpu = _registrations("AutocastCUDA"), _registrations("AutocastCPU")
    assert len(cuda) > 50 and len(cpu) > 50
    assert sorted((cuda ^ cpu) - AUDIT.keys()) == []


@pytest.mark.parametrize(
    "call",
    [
        lambda h, f: torch.lstm_cell(h(2, 4), (f(2, 3), f(2, 3)), f(12, 4), f(12, 3)),
        lambda h, f: torch.gru_cell(f(2, 4), f(2, 3), f(9, 4), f(9, 3)),
        lambda h, f: torch.addmv(f(4), f(4, 4), f(4)),
    ],
    ids=["lstm_cell", "gru_cell", "addmv"],
)
def test_cuda_only_lower_precision_ops_run_in_the_autocast_dtype(call):
    # lstm_cell and gru_cell are on CUDA's lower-precision list (AutocastCUDA registers
    # them, AutocastCPU does not); their fake CUDA kernels need a real device
    with torch.autocast("cpu", dtype=torch.bfloat16), CudaKernelMode():
        out = call(lambda *s: torch.randn(*s).bfloat16(), torch.randn)
    assert all(t.dtype == torch.bfloat16 for t in torch.utils._pytree.tree_leaves(out))


def test_binary_cross_entropy_is_refused_as_cuda_autocast_refuses_it():
    with (
        real_cuda_autocast(torch.float16) as device,
        pytest.raises(RuntimeError, match="unsafe to autocast"),
    ):
        F.binary_cross_entropy(torch.rand(4, device=device), torch.rand(4, device=device))
    with (
        emulated_cuda_autocast(torch.float16),
        pytest.raises(RuntimeError, match="unsafe to autocast"),
    ):
        F.binary_cross_entropy(torch.rand(4), torch.rand(4))
    with CudaKernelMode():  # without autocast it runs
        F.binary_cross_entropy(torch.rand(4), torch.rand(4))


def test_float16_softmax_reads_its_input_without_a_float32_copy():
    # SoftMax.cpp: a Half input asked for a Float result runs _softmax(half_to_float=True) on
    # CUDA; the rewrite calls that kernel (its meta function accepts it)
    seen = []

    class Ops(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with emulated_cuda_autocast(torch.float16):
        x = torch.randn(4, 8).half()
        with Ops():
            y = x.softmax(-1)
    assert y.dtype == torch.float32 and seen == ["_softmax.default"]


def test_ops_left_at_cpu_policy_are_named_in_the_report():
    from memcalc.pipeline import estimate
    from memcalc.specs import TrainingSpec

    spec = TrainingSpec(model="tests.test_cuda_autocast:inverse_net", sample_shape=(4, 4),
                        loss="sum", optimizer="sgd", batch_size=2, precision="bf16-mixed")
    lines = estimate(spec).unsupported
    assert any(line.startswith("CUDA autocast: linalg_inv") for line in lines), lines
    fp32 = estimate(spec.with_changes(precision="fp32")).unsupported
    assert not any(line.startswith("CUDA autocast:") for line in fp32)


def inverse_net():
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.linalg.inv(self.linear(x) + 4 * torch.eye(4))

    return Net()
