"""How long a training step takes on a catalog GPU, kernel by kernel.

Each op the traced step launches (``memcalc.trace.kernels``) takes the longest of: its FLOPs
at its engine's peak for its precision times the efficiency measured for its class, the bytes
it touches at the card's memory bandwidth times the share a kernel reaches, and the shortest
time a kernel takes at all. The host issues the ops one after another (eager PyTorch: Python,
the dispatcher, autograd, the launch), each in ``host_seconds_per_op``; the GPU runs each when
it has been issued and the one before has finished. The step ends when the last kernel does:
a step of many small kernels is paced by the host, one of a few large ones by the GPU, and
most lie in between. MFU is an output: the step's FLOPs over the time at the dense peak.

The constants are fitted to the training steps timed on an H100 SXM
(``benchmarks/gpu_data/h100-steps.json``; ``python -m benchmarks.step_time`` refits them and
prints the fit and each model left out of it).

Known limitations: one ATen op is one kernel (a convolution's backward launches two, a
foreach op one per chunk of tensors); efficiencies are per class, not per shape (a small
matmul runs further below the peak than a large one, which the minimum time only partly
covers); the host's speed is that of the H100 machine's CPU; caches, streams overlapping,
CUDA graphs and compiled (fused) kernels are not modelled.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from memcalc.device.gpus import GpuSpec
from memcalc.trace.kernels import Kernel, KernelClass


class KernelRates(BaseModel):
    """The step-time model's constants (seconds; efficiencies as shares of a peak)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host_seconds_per_op: float
    """Host time to issue one op in eager PyTorch."""
    min_kernel_seconds: float
    """The shortest a kernel runs (launch latency on the GPU, a tail of idle SMs)."""
    bandwidth_share: float
    """Share of the memory bandwidth an element-wise or reduction kernel reaches."""
    conv2d_efficiency: float
    """Share of the tensor-core peak (TF32 or half) a 2D convolution reaches; likewise:"""
    conv3d_efficiency: float
    matmul_efficiency: float
    attention_efficiency: float
    fp32_conv_efficiency: float
    """Share of the plain fp32 peak a convolution reaches without tensor cores; likewise:"""
    fp32_matmul_efficiency: float
    """(matmuls and attention)."""
    depthwise_efficiency: float
    """Share of the plain fp32 peak a depthwise convolution reaches, in any precision."""

    def efficiency(self, kind: KernelClass, tensor_cores: bool) -> float:
        if tensor_cores or kind is KernelClass.DEPTHWISE:
            return getattr(self, f"{kind.value}_efficiency")
        return (self.fp32_conv_efficiency if kind in (KernelClass.CONV2D, KernelClass.CONV3D)
                else self.fp32_matmul_efficiency)


H100_FIT = KernelRates(host_seconds_per_op=35e-6, min_kernel_seconds=4e-6,
                       bandwidth_share=0.7, conv2d_efficiency=0.10, conv3d_efficiency=0.10,
                       matmul_efficiency=0.6, attention_efficiency=0.4,
                       fp32_conv_efficiency=0.19, fp32_matmul_efficiency=0.51,
                       depthwise_efficiency=0.95)
"""Fitted to the H100 step timings (see the module's docstring): the host time and the
convolution and fp32 efficiencies. Not fitted, as those steps cannot tell them apart: the
shortest kernel (a few µs on the GPU), the share of the bandwidth an element-wise kernel
reaches (70 %; large copies reach about 90 % on an H100), the tensor-core matmul and attention
efficiencies (cuBLAS and FlashAttention's usual shares of the peak at transformer widths)."""


class StepTime(BaseModel):
    """A step's predicted time, what paces it, and the MFU it implies."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seconds: float
    host_seconds: float
    """The host's time to issue every op (the step is never shorter)."""
    kernel_seconds: float
    """The GPU's busy time, every kernel back to back (the step is never shorter)."""
    ops: int
    mfu: float
    """The step's FLOPs ÷ (its time × the dense peak of its precision)."""

    @property
    def paced_by_host(self) -> bool:
        return self.host_seconds >= self.kernel_seconds


def peak_rate(gpu: GpuSpec, kind: KernelClass, half: str,
              cudnn_tf32: bool = True) -> tuple[float, bool]:
    """FLOP/s of ``kind``'s engine on ``gpu`` and whether it is a tensor-core rate: half
    precision ("bf16", "fp16") on its tensor cores where the card has them (else emulated at
    the fp32 rate), fp32 convolutions on TF32 tensor cores where cuDNN may use them (PyTorch's
    default), fp32 matmuls on plain fp32 (PyTorch leaves TF32 off for them); depthwise
    convolutions on plain fp32 in any precision."""
    if kind is KernelClass.DEPTHWISE:
        return gpu.fp32_tflops * 1e12, False
    tensor_cores = {"bf16": gpu.bf16_tflops, "fp16": gpu.fp16_tflops}.get(half)
    if tensor_cores:
        return tensor_cores * 1e12, True
    if half:
        return gpu.fp32_tflops * 1e12, False
    if kind in (KernelClass.CONV2D, KernelClass.CONV3D) and cudnn_tf32 and gpu.tf32_tflops:
        return gpu.tf32_tflops * 1e12, True
    return gpu.fp32_tflops * 1e12, False


def kernel_seconds(kernel: Kernel, gpu: GpuSpec, rates: KernelRates, cudnn_tf32: bool = True,
                   scale: float = 1.0) -> float:
    """One kernel's time on the GPU; ``scale`` multiplies the FLOPs and bytes of a kernel that
    grows with the batch (the same step at another batch, roughly)."""
    scale = scale if kernel.batched else 1.0
    seconds = kernel.bytes * scale / (gpu.memory_bandwidth_gbps * 1e9 * rates.bandwidth_share)
    return max(seconds, _flop_seconds(kernel, gpu, rates, cudnn_tf32) * scale,
               rates.min_kernel_seconds)


def _flop_seconds(kernel: Kernel, gpu: GpuSpec, rates: KernelRates, cudnn_tf32: bool) -> float:
    """The kernel's FLOPs at its engine's peak × its class's efficiency (0 for a kernel
    bounded by memory)."""
    if not kernel.flops or kernel.kind is KernelClass.MEMORY:
        return 0.0
    peak, tensor_cores = peak_rate(gpu, kernel.kind, kernel.half, cudnn_tf32)
    return kernel.flops / (peak * rates.efficiency(kernel.kind, tensor_cores))


def compute_floor_seconds(kernels: Sequence[Kernel], gpu: GpuSpec, cudnn_tf32: bool = True,
                          rates: KernelRates = H100_FIT) -> float:
    """The least time the batch-grown kernels' FLOPs take, each at its engine's rate × its
    class's efficiency, with no host, bytes or shortest time: a lower bound that holds for
    the same layers on a share of each one's outputs (a spatial slab) at that share."""
    return sum(_flop_seconds(kernel, gpu, rates, cudnn_tf32) for kernel in kernels
               if kernel.batched)


def step_time(kernels: Sequence[Kernel], gpu: GpuSpec, dense_peak: float,
              cudnn_tf32: bool = True, scale: float = 1.0,
              rates: KernelRates = H100_FIT) -> StepTime:
    """The step of ``kernels`` on ``gpu``, issued by the host in order; ``dense_peak``: the
    FLOP/s its MFU is taken against; ``scale``: FLOPs and bytes multiplied (another batch)."""
    issued = gpu_done = busy = 0.0
    for kernel in kernels:
        issued += rates.host_seconds_per_op
        took = kernel_seconds(kernel, gpu, rates, cudnn_tf32, scale)
        gpu_done = max(gpu_done, issued) + took
        busy += took
    flops = sum(kernel.flops * (scale if kernel.batched else 1.0) for kernel in kernels)
    return StepTime(seconds=gpu_done, host_seconds=issued, kernel_seconds=busy,
                    ops=len(kernels), mfu=flops / (gpu_done * dense_peak) if gpu_done else 0.0)
