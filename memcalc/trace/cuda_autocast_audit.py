"""Every op that one of CPU and CUDA autocast registers and the other does not, and what the
trace does about it (``tests/test_cuda_autocast.py`` checks this covers the installed torch's
``AutocastCUDA`` / ``AutocastCPU`` registrations, and that each substitution gives CUDA's dtype).
"""

from __future__ import annotations

_SUBSTITUTED = "substituted in cuda_autocast"
_SAME = ("same result: CPU autocast reaches the same dtype through the op it registers or the "
         "one this op decomposes into")
_RARE = ("left at CPU autocast's float32: linear algebra and quantization rarely run inside a "
         "training step, and CUDA's kernels mostly refuse half inputs")

AUDIT: dict[str, str] = {
    **dict.fromkeys([
        # lower precision on CUDA only
        "addmv", "addr", "mv", "lstm_cell", "gru_cell", "rnn_relu_cell", "rnn_tanh_cell",
        "_thnn_fused_gru_cell", "_thnn_fused_lstm_cell",
        # float32 on CUDA only
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log1p", "log2",
        "reciprocal", "rsqrt", "sinh", "tan", "pow.Scalar", "pow.Tensor_Scalar",
        "pow.Tensor_Tensor", "softplus", "logsumexp", "renorm", "dist", "pdist",
        "cosine_similarity", "group_norm", "layer_norm", "native_layer_norm", "rms_norm",
        "frobenius_norm.dim", "nuclear_norm", "nuclear_norm.dim", "upsample_nearest1d",
        "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
        "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "upsample_linear1d",
        "upsample_bilinear2d", "upsample_trilinear3d", "upsample_bicubic2d",
        "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa",
        # fp32_set_opt_dtype on CUDA only
        "softmax.int", "log_softmax.int", "sum", "sum.dim_IntList", "cumsum", "cumprod",
        "norm.Scalar", "norm.ScalarOpt_dim", "linalg_vector_norm", "linalg_matrix_norm",
        "linalg_matrix_norm.str_ord",
        # promote on CUDA only
        "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "index_put",
        "scatter_add", "tensordot",
        # float32 on CPU only: the input's dtype on CUDA
        "adaptive_avg_pool3d", "adaptive_max_pool3d", "avg_pool3d", "max_pool3d",
        "max_unpool2d", "max_unpool3d", "fractional_max_pool2d", "fractional_max_pool3d",
        "reflection_pad1d", "reflection_pad2d", "replication_pad1d", "replication_pad2d",
        "replication_pad3d", "grid_sampler_2d", "grid_sampler_3d", "_grid_sampler_2d_cpu_fallback",
        "trace", "stft", "stft.center", "fft_fft", "fft_fft2", "fft_fftn", "fft_hfft", "fft_ifft",
        "fft_ifft2", "fft_ifftn", "fft_ihfft", "fft_irfft", "fft_irfft2", "fft_irfftn",
        "fft_rfft", "fft_rfft2", "fft_rfftn",
        # float32 on CPU; CUDA runs its parts (log_softmax in the input dtype, nll_loss fp32)
        "cross_entropy_loss",
    ], _SUBSTITUTED),
    **dict.fromkeys([
        "_convolution", "convolution", "cudnn_convolution", "cudnn_convolution_transpose",
        "conv1d.padding", "conv2d.padding", "conv3d.padding", "einsum", "chain_matmul",
        "linalg_multi_dot", "_scaled_dot_product_flash_attention", "_addmm_activation",
        "cat", "stack", "index_copy", "multilabel_margin_loss_forward",
    ], _SAME),
    **dict.fromkeys([
        "_lu_with_info", "cholesky", "cholesky_inverse", "cholesky_solve", "geqrf", "inverse",
        "linalg_cholesky", "linalg_cholesky_ex", "linalg_cond", "linalg_cond.p_str",
        "linalg_eig", "linalg_eigh", "linalg_eigvals", "linalg_eigvalsh",
        "linalg_householder_product", "linalg_inv", "linalg_inv_ex", "linalg_lstsq",
        "linalg_matrix_rank", "linalg_matrix_rank.atol_rtol_float",
        "linalg_matrix_rank.atol_rtol_tensor", "linalg_matrix_rank.tol_tensor", "linalg_qr",
        "linalg_solve", "linalg_svd", "linalg_svdvals", "linalg_tensorinv",
        "linalg_tensorsolve", "lu_solve", "orgqr", "ormqr", "pinverse", "qr", "svd",
        "triangular_solve", "nanquantile", "nanquantile.scalar", "quantile", "quantile.scalar",
        "polar", "view_as_complex", "fake_quantize_per_tensor_affine",
    ], _RARE),
    "ctc_loss.IntList": "left at CPU autocast's float32: CUDA's ctc_loss takes float32 or float64 only",
    "ctc_loss.Tensor": "left at CPU autocast's float32: CUDA's ctc_loss takes float32 or float64 only",
    "_native_multi_head_attention": "inference fast path of nn.MultiheadAttention (no grad): "
                                    "not taken in a training step",
    "mkldnn_rnn_layer": "CPU's RNN kernel; CUDA runs cuDNN's, which the trace does not model "
                        "(listed as unsupported in reports)",
}


LEFT_AT_CPU_POLICY = frozenset(name.split(".")[0] for name, decision in AUDIT.items()
                               if not decision.startswith((_SUBSTITUTED, _SAME)))
"""The ops (ATen names) whose CUDA autocast policy the trace does not apply."""


def left_at_cpu_policy(op_names) -> list[str]:
    """The traced ops (ATen names) whose CUDA autocast policy the trace does not apply."""
    return sorted(LEFT_AT_CPU_POLICY & set(op_names))
