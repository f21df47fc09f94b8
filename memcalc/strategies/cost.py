"""Step time from FLOPs and the GPU catalog; communication volume over the interconnect.

Compute time = FLOPs ÷ (peak FLOP/s of the precision × MFU). Collectives follow NCCL's ring
costs: all-reduce moves 2(N−1)/N of the bytes per GPU, all-gather and reduce-scatter
(N−1)/N each. Communication is not overlapped with compute (an upper bound).
"""

from __future__ import annotations

from memcalc.gpus import GpuSpec
from memcalc.specs import Precision
from memcalc.strategies.specs import INTERCONNECT_GBPS, ClusterSpec, Interconnect


def peak_flops(gpu: GpuSpec, precision: Precision) -> tuple[float, str]:
    """Dense peak FLOP/s for the precision's matmuls, and which rate was used."""
    wanted = {Precision.FP32: "fp32", Precision.BF16_MIXED: "bf16", Precision.BF16: "bf16",
              Precision.FP16_MIXED: "fp16", Precision.FP16: "fp16"}[precision]
    rate = getattr(gpu, f"{wanted}_tflops")
    if rate is None:
        return gpu.fp32_tflops * 1e12, "fp32 (no " + wanted + " tensor cores)"
    return rate * 1e12, wanted


def compute_seconds(flops: float, gpu: GpuSpec, precision: Precision, mfu: float) -> float:
    return flops / (peak_flops(gpu, precision)[0] * mfu)


def bandwidth_bytes_per_s(cluster: ClusterSpec, gpus: int) -> float:
    """Across nodes the slower InfiniBand link sets the pace."""
    link = cluster.interconnect
    if gpus > cluster.gpus_per_node and cluster.gpus > 1 or (cluster.gpus == 1 and gpus > 8):
        link = Interconnect.INFINIBAND
    return INTERCONNECT_GBPS[link] * 1e9


def all_reduce_seconds(nbytes: int, gpus: int, bandwidth: float) -> float:
    return 2 * (gpus - 1) / gpus * nbytes / bandwidth if gpus > 1 else 0.0


def fsdp_seconds(parameter_bytes: int, gradient_bytes: int, gpus: int, bandwidth: float) -> float:
    """All-gather parameters in forward and again in backward, reduce-scatter gradients."""
    if gpus == 1:
        return 0.0
    return (gpus - 1) / gpus * (2 * parameter_bytes + gradient_bytes) / bandwidth
