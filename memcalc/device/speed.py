"""How long a training step takes on a catalog GPU: kernel by kernel where the trace listed
its kernels (``memcalc.device.kernel_time``; MFU is then an output), else — or where the user
gives an MFU — its FLOPs at the peak rate for the precision × that MFU, but never less than the
host's time to launch its ops."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from memcalc.device.gpus import GpuSpec
from memcalc.device.kernel_time import H100_FIT, step_time
from memcalc.specs import Precision

if TYPE_CHECKING:
    from memcalc.trace.flops import StepFlops

DEFAULT_MFU = 0.4
"""The MFU a step is timed at when its kernels are not known (a report read back from JSON)."""


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


HOST_SECONDS_PER_OP = H100_FIT.host_seconds_per_op
"""Host time per ATen op an eager step launches (Python, the dispatcher, autograd): the
GPU cannot run a step faster than the host issues it. Fitted with the per-kernel model to the
steps timed on the H100 host of benchmarks/gpu_data/h100-steps.json (16-core VM, torch 2.11).
A faster or slower host CPU moves it."""


def launch_floor_seconds(ops: int) -> float:
    """The least time a step of ``ops`` traced ops takes: the host launching them."""
    return ops * HOST_SECONDS_PER_OP


def step_seconds(flops: float, ops: int, gpu: GpuSpec, precision: Precision, mfu: float,
                 convolution_fraction: float = 0.0, cudnn_tf32: bool = True) -> float:
    """The step's FLOPs at ``mfu`` of the peak, or its ops' launch time if that is longer."""
    return max(compute_seconds(flops, gpu, precision, mfu, convolution_fraction, cudnn_tf32),
               launch_floor_seconds(ops))


class StepSeconds(NamedTuple):
    """A step's predicted seconds, the MFU that implies, and how it was timed."""

    seconds: float
    mfu: float
    how: str


def timed_step(step: StepFlops | None, flops: float, gpu: GpuSpec, precision: Precision,
               cudnn_tf32: bool = True, mfu: float | None = None,
               launched_steps: float = 1.0) -> StepSeconds:
    """``launched_steps`` launches of the traced ``step``, computing ``flops`` FLOPs in all:
    kernel by kernel, each launch's batch-grown kernels scaled to its share of ``flops``
    (another batch), unless ``mfu`` is given or the kernels are unknown; then the FLOPs at
    that MFU (``DEFAULT_MFU`` if none), no faster than the host launches the ops."""
    share = step.convolution_fraction if step is not None else 0.0
    dense_peak, rate_name = peak_flops(gpu, precision, share, cudnn_tf32)
    if mfu is None and step is not None and step.kernels and launched_steps > 0:
        scale = flops / launched_steps / step.total if step.total else 1.0
        time = step_time(step.kernels, gpu, dense_peak, cudnn_tf32, scale)
        paced = "the host issuing them" if time.paced_by_host else "the GPU running them"
        return StepSeconds(time.seconds * launched_steps, time.mfu,
                           f"{time.ops} kernels on {gpu.name} timed one by one, paced by "
                           f"{paced}; MFU {time.mfu:.0%}")
    used = DEFAULT_MFU if mfu is None else mfu
    ops = round((step.launched_ops if step is not None else 0) * launched_steps)
    seconds = step_seconds(flops, ops, gpu, precision, used, share, cudnn_tf32)
    why = "--mfu" if mfu is not None else "the default; no kernels listed"
    how = (f"FLOPs on {gpu.name} at {used:.0%} of its {rate_name} peak ({why})"
           if seconds > launch_floor_seconds(ops)
           else f"{ops} ops launched by the host at {HOST_SECONDS_PER_OP * 1e6:.0f} µs each, "
                f"longer than its FLOPs at {used:.0%} of {gpu.name}'s peak ({why})")
    return StepSeconds(seconds, flops / (seconds * dense_peak) if seconds else 0.0, how)
