"""The assumptions and the known gaps every report states, in words."""

from __future__ import annotations

from memcalc.cuda_overheads import (
    CONTEXT_TABLE,
    CUBLAS_HANDLE_THREADS,
    CUDNN_KERNELS_BYTES,
    CUDNN_WORKSPACE_NOTE,
    cublas_workspace_bytes,
)
from memcalc.gpus import GpuSpec
from memcalc.optimizers import optimizer_rule
from memcalc.precision import precision_policy
from memcalc.specs import DeviceKind, LossKind, OptimizerImpl, TrainingSpec
from memcalc.units import format_bytes

_LOSS_TEXT = {
    LossKind.CROSS_ENTROPY: (
        "loss: cross-entropy against int64 class targets shaped like the output minus its "
        "class dim (dim 1; the last dim for token-id models, flattened as in LM training)"
    ),
    LossKind.MSE: "loss: MSE against a float target shaped like the output",
    LossKind.SUM: "loss: output.sum() (no target)",
}


def assumptions(spec: TrainingSpec, gpu: GpuSpec | None, *, model_has_conv: bool,
                foreach: bool, traced: bool) -> list[str]:
    rule = optimizer_rule(spec.optimizer)
    implementation = ("foreach implementation (CUDA's default; parameter-sized temporaries "
                      "during step())" if foreach else "for-loop implementation (CPU's default; "
                      "one parameter-sized temporary at a time)")
    if spec.optimizer_impl is OptimizerImpl.FUSED:
        implementation += "; fused was asked for and is traced as for-loop (neither holds a "
        implementation += "whole-model temporary)"
    lines = [
        precision_policy(spec.precision).assumption,
        f"optimizer {rule.name}: {rule.description}; {rule.state_copies} parameter-sized state "
        f"tensor(s) per parameter" + (", plus a 4-byte step counter per parameter tensor"
                                       if rule.step_counter else "") + f"; {implementation}",
        _LOSS_TEXT[spec.loss],
        "model in train mode; every parameter trainable unless the model sets requires_grad=False",
    ]
    if traced:
        lines += [
            "traced on fake CPU tensors: 2 iterations of forward, loss, backward, optimizer "
            f"step, zero_grad(set_to_none={spec.zero_grad_to_none}); the peak is the maximum over both, so the "
            "optimizer state created lazily at step 1 is included",
            "the step is a function: its output and loss are released when it returns (a "
            "plain for-loop that keeps `output` until the next forward holds it one step longer)",
            "activations = tensors made in forward and loss that are still alive when backward "
            "starts; temporaries = everything else the step makes",
        ]
    if spec.device is DeviceKind.CUDA:
        lines += _cuda_assumptions(spec, gpu, model_has_conv)
    if spec.device is DeviceKind.CUDA and traced:
        lines.append(
            "CUDA reserved memory: the traced allocations and frees are replayed through a "
            "model of PyTorch's caching allocator (512 B rounding; requests up to 1 MiB packed "
            "in 2 MiB segments, 1-10 MiB in 20 MiB segments, larger rounded to 2 MiB; best fit "
            "with splitting and merging; default settings, one stream); peak_bytes is that "
            "reserved peak, reached without memory pressure: near capacity the allocator frees "
            "cached blocks and retries, so a run may still fit in less")
    if spec.device is DeviceKind.CPU and model_has_conv:
        lines.append("CPU convolutions (oneDNN/mkldnn) allocate workspaces the trace does not "
                     "see; a real CPU run of a conv net peaks higher (see README)")
    return lines


def _cuda_assumptions(spec: TrainingSpec, gpu: GpuSpec | None, model_has_conv: bool) -> list[str]:
    row = CONTEXT_TABLE[spec.cuda_module_loading]
    card = (f"GPU {gpu.name} (compute capability {gpu.compute_capability}, "
            f"{format_bytes(gpu.memory_bytes)})" if gpu else "GPU not named (pre-Hopper assumed)")
    lines = [
        card,
        f"CUDA context with {row.loading.value} module loading: {format_bytes(row.context_bytes)} "
        f"outside the allocator ({row.source}); ±150 MiB between cards and drivers",
        f"cuBLAS workspace: {CUBLAS_HANDLE_THREADS} x {format_bytes(cublas_workspace_bytes(gpu))} "
        "(forward and autograd threads each hold a handle; CublasHandlePool.cpp) when the "
        "step multiplies matrices, allocated through the caching allocator",
        "scaled-dot-product attention: CUDA's flash/memory-efficient kernels (no stored S x S "
        "matrix or dropout mask, also with dropout)",
        f"headroom: {spec.headroom_fraction:.0%} of capacity kept free",
    ]
    if model_has_conv:
        lines.append(f"cuDNN convolution kernels: +{format_bytes(CUDNN_KERNELS_BYTES)} of context "
                     "(lazy loading); " + CUDNN_WORKSPACE_NOTE)
    return lines


def unsupported(spec: TrainingSpec) -> list[str]:
    if spec.device is not DeviceKind.CUDA:
        return []
    return [
        "allocator settings (max_split_size_mb, expandable_segments, roundup_power2_divisions) "
        "and blocks held for other streams: not modelled",
        "CUDA autocast's float32 list beyond softmax, log_softmax, layer_norm and group_norm "
        "(exp, pow, losses...): those ops keep the CPU autocast dtype",
        "NCCL buffers and DDP gradient buckets: one GPU is assumed",
    ]
