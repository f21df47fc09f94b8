"""The per-kernel step time: its queue against closed forms, its classes, and the steps timed
on a real H100 (benchmarks/gpu_data/h100-steps.json)."""

import statistics

import pytest

from memcalc.device.gpus import find_gpu
from memcalc.device.kernel_time import H100_FIT, peak_rate, step_time
from memcalc.device.speed import peak_flops
from memcalc.pipeline import training_step_flops
from memcalc.trace.kernels import Kernel, KernelClass, kernel_class
from tests.fixtures import gpu_data

H100 = find_gpu("H100-80GB")
PEAK = H100.bf16_tflops * 1e12


def test_many_small_kernels_are_paced_by_the_host():
    n = 1000
    tiny = [Kernel(KernelClass.MEMORY, "", 0, 1024)] * n
    time = step_time(tiny, H100, PEAK)
    # the host issues one every host_seconds_per_op; each runs for the shortest kernel time
    assert time.seconds == pytest.approx(n * H100_FIT.host_seconds_per_op
                                         + H100_FIT.min_kernel_seconds)
    assert time.paced_by_host and time.mfu == 0


def test_one_large_matmul_is_paced_by_the_gpu():
    flops = 10**15
    time = step_time([Kernel(KernelClass.MATMUL, "bf16", flops, 1 << 30)], H100, PEAK)
    running = flops / (PEAK * H100_FIT.matmul_efficiency)
    assert time.seconds == pytest.approx(H100_FIT.host_seconds_per_op + running)
    assert not time.paced_by_host
    assert time.mfu == pytest.approx(flops / (time.seconds * PEAK))


def test_a_memory_bound_kernel_runs_at_the_bandwidth_and_the_queue_absorbs_the_host():
    moved = 8 << 30
    big = Kernel(KernelClass.MEMORY, "", 0, moved)
    small = Kernel(KernelClass.MEMORY, "", 0, 1024)
    time = step_time([big] + [small] * 10, H100, PEAK)
    at_bandwidth = moved / (H100.memory_bandwidth_gbps * 1e9 * H100_FIT.bandwidth_share)
    # the ten small ones are issued while the big one runs, then run back to back
    assert time.seconds == pytest.approx(H100_FIT.host_seconds_per_op + at_bandwidth
                                         + 10 * H100_FIT.min_kernel_seconds)


def test_scale_grows_the_batched_kernels_only():
    batched = Kernel(KernelClass.MEMORY, "", 0, 4 << 30)
    optimizer = Kernel(KernelClass.MEMORY, "", 0, 4 << 30, batched=False)
    one = step_time([batched, optimizer], H100, PEAK).kernel_seconds
    doubled = step_time([batched, optimizer], H100, PEAK, scale=2.0).kernel_seconds
    assert doubled == pytest.approx(1.5 * one)


@pytest.mark.parametrize(("op", "dims", "per_group", "kind"), [
    ("convolution", 4, 64, KernelClass.CONV2D), ("convolution_backward", 5, 64, KernelClass.CONV3D),
    ("convolution", 4, 1, KernelClass.DEPTHWISE), ("addmm", None, None, KernelClass.MATMUL),
    ("_scaled_dot_product_flash_attention", None, None, KernelClass.ATTENTION),
    ("add_", None, None, KernelClass.MEMORY)])
def test_kernel_classes(op, dims, per_group, kind):
    assert kernel_class(op, dims, per_group) is kind


def test_fp32_matmuls_stay_off_tensor_cores_and_convolutions_take_tf32():
    assert peak_rate(H100, KernelClass.MATMUL, "") == (H100.fp32_tflops * 1e12, False)
    assert peak_rate(H100, KernelClass.CONV2D, "") == (H100.tf32_tflops * 1e12, True)
    assert peak_rate(H100, KernelClass.CONV2D, "", cudnn_tf32=False)[1] is False
    assert peak_rate(H100, KernelClass.MATMUL, "bf16") == (H100.bf16_tflops * 1e12, True)


def test_a_traced_step_lists_the_optimizer_step_apart():
    case = next(case for case, _ in gpu_data.measured_cases() if case.model == "gpt2")
    flops = training_step_flops(gpu_data.spec_of(case), case.batch_size)
    batched = [k for k in flops.kernels if k.batched]
    assert len(batched) == flops.launched_ops
    assert sum(k.flops for k in flops.kernels) == flops.total
    optimizer = [k for k in flops.kernels if not k.batched]
    # foreach AdamW: a handful of list ops, each touching every parameter
    assert 3 <= len(optimizer) <= 20
    assert max(k.bytes for k in optimizer) >= 4 * 124_000_000


def _ratios(models: set[str] | None = None) -> list[float]:
    cases = {row["name"]: case for case, row in gpu_data.measured_cases()}
    ratios = []
    for timing in gpu_data.steps()["timing"]:
        case = cases[timing["name"]]
        if models is not None and case.model not in models:
            continue
        flops = training_step_flops(gpu_data.spec_of(case), case.batch_size)
        peak = peak_flops(H100, case.precision, flops.convolution_fraction, case.tf32)[0]
        ratios.append(step_time(flops.kernels, H100, peak, case.tf32).seconds / timing["median_s"])
    return ratios


@pytest.mark.slow   # end to end, seconds of CPU: with the slow checks
def test_host_paced_and_gpu_paced_steps_against_the_h100():
    # ResNet-50 bf16 at batch 16 is paced by the host, GPT-2 fp32 by its fp32 matmuls
    ratios = _ratios({"resnet50", "gpt2"})
    assert all(0.7 <= ratio <= 1.5 for ratio in ratios), ratios


@pytest.mark.slow
def test_every_timed_h100_step():
    ratios = _ratios()
    assert len(ratios) == 16
    assert 0.85 <= statistics.median(ratios) <= 1.15
    assert all(0.5 <= ratio <= 2.0 for ratio in ratios), ratios


def test_bf16_on_a_card_without_bf16_tensor_cores_runs_at_its_fp32_rate():
    t4 = find_gpu("T4")
    assert peak_rate(t4, KernelClass.MATMUL, "bf16") == (t4.fp32_tflops * 1e12, False)
    assert peak_rate(t4, KernelClass.MATMUL, "fp16") == (t4.fp16_tflops * 1e12, True)
