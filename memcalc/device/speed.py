"""How long a training step takes on a catalog GPU: its FLOPs at the peak rate for the
precision × utilisation (MFU), but never less than the host's time to launch its ops."""

from __future__ import annotations

from memcalc.device.gpus import GpuSpec
from memcalc.specs import Precision


def peak_flops(gpu: GpuSpec, precision: Precision, convolution_fraction: float = 0.0,
               cudnn_tf32: bool = True) -> tuple[float, str]:
    """Dense peak FLOP/s for the precision, and which rate was used. In fp32, matmuls run at
    the plain fp32 rate (PyTorch leaves TF32 off for them) and convolutions at the TF32 rate
    (``torch.backends.cudnn.allow_tf32`` is True by default): ``convolution_fraction`` of the
    FLOPs at one, the rest at the other."""
    wanted = {Precision.FP32: "fp32", Precision.BF16_MIXED: "bf16", Precision.BF16: "bf16",
              Precision.FP16_MIXED: "fp16", Precision.FP16: "fp16"}[precision]
    if wanted == "fp32":
        if gpu.tf32_tflops is None or not cudnn_tf32 or convolution_fraction <= 0:
            return gpu.fp32_tflops * 1e12, "fp32"
        share = min(1.0, convolution_fraction)
        seconds_per_flop = share / gpu.tf32_tflops + (1 - share) / gpu.fp32_tflops
        return 1e12 / seconds_per_flop, f"fp32 matmuls, TF32 convolutions ({share:.0%} of FLOPs)"
    rate = getattr(gpu, f"{wanted}_tflops")
    if rate is None:
        return gpu.fp32_tflops * 1e12, "fp32 (no " + wanted + " tensor cores)"
    return rate * 1e12, wanted


def compute_seconds(flops: float, gpu: GpuSpec, precision: Precision, mfu: float,
                    convolution_fraction: float = 0.0, cudnn_tf32: bool = True) -> float:
    rate = peak_flops(gpu, precision, convolution_fraction, cudnn_tf32)[0]
    return flops / (rate * mfu)


HOST_SECONDS_PER_OP = 25e-6
"""Host time per ATen op an eager step launches (Python, the dispatcher, autograd): the
GPU cannot run a step faster than the host issues it. Measured on the H100 host of
benchmarks/gpu_data/h100-steps.json (16-core VM, torch 2.11): 26-41 µs per traced op in the
steps that the host paced (ResNet-50, ConvNeXt, ViT-B/16, GPT-2 at small batches); the
smallest is taken, as a floor. A faster or slower host CPU moves it."""


def launch_floor_seconds(ops: int) -> float:
    """The least time a step of ``ops`` traced ops takes: the host launching them."""
    return ops * HOST_SECONDS_PER_OP


def step_seconds(flops: float, ops: int, gpu: GpuSpec, precision: Precision, mfu: float,
                 convolution_fraction: float = 0.0, cudnn_tf32: bool = True) -> float:
    """The step's FLOPs at ``mfu`` of the peak, or its ops' launch time if that is longer."""
    return max(compute_seconds(flops, gpu, precision, mfu, convolution_fraction, cudnn_tf32),
               launch_floor_seconds(ops))
