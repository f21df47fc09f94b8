"""How long FLOPs take on a catalog GPU: peak rate for the precision × utilisation (MFU)."""

from __future__ import annotations

from memcalc.gpus import GpuSpec
from memcalc.specs import Precision


def peak_flops(gpu: GpuSpec, precision: Precision) -> tuple[float, str]:
    """Dense peak FLOP/s for the precision's matmuls, and which rate was used. fp32 is the
    plain fp32 rate: PyTorch leaves TF32 off for matmuls by default."""
    wanted = {Precision.FP32: "fp32", Precision.BF16_MIXED: "bf16", Precision.BF16: "bf16",
              Precision.FP16_MIXED: "fp16", Precision.FP16: "fp16"}[precision]
    rate = getattr(gpu, f"{wanted}_tflops")
    if rate is None:
        return gpu.fp32_tflops * 1e12, "fp32 (no " + wanted + " tensor cores)"
    return rate * 1e12, wanted


def compute_seconds(flops: float, gpu: GpuSpec, precision: Precision, mfu: float) -> float:
    return flops / (peak_flops(gpu, precision)[0] * mfu)
