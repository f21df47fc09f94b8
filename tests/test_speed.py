"""Step time from FLOPs: fp32 convolutions at the TF32 peak (cuDNN's default), matmuls at fp32."""

import pytest

from memcalc.device.speed import compute_seconds, peak_flops
from memcalc.device.gpus import find_gpu
from memcalc.specs import Precision

A100 = find_gpu("A100-80GB")


def test_fp32_matmuls_use_the_fp32_peak():
    assert peak_flops(A100, Precision.FP32)[0] == A100.fp32_tflops * 1e12


def test_fp32_convolutions_use_the_tf32_peak_unless_turned_off():
    assert peak_flops(A100, Precision.FP32, convolution_fraction=1.0)[0] == A100.tf32_tflops * 1e12
    assert peak_flops(A100, Precision.FP32, 1.0, cudnn_tf32=False)[0] == A100.fp32_tflops * 1e12


def test_a_mixed_step_adds_the_time_of_each_part():
    flops, share = 1e15, 0.25
    expected = (flops * share / (A100.tf32_tflops * 1e12)
                + flops * (1 - share) / (A100.fp32_tflops * 1e12)) / 0.5
    assert compute_seconds(flops, A100, Precision.FP32, 0.5, share) == pytest.approx(expected)


def test_cards_without_tf32_keep_the_fp32_peak():
    v100 = find_gpu("V100-16GB")
    assert peak_flops(v100, Precision.FP32, 1.0)[0] == v100.fp32_tflops * 1e12


def test_a_step_takes_no_less_than_the_host_launching_its_ops():
    from memcalc.device.speed import HOST_SECONDS_PER_OP, step_seconds

    # 1 TFLOP at 40 % of the A100's fp32 peak is 128 ms; 1,000 ops launch in 25 ms
    flops = 1e12
    at_mfu = compute_seconds(flops, A100, Precision.FP32, 0.4)
    assert step_seconds(flops, 1000, A100, Precision.FP32, 0.4) == pytest.approx(at_mfu)
    # a small step is paced by its launches whatever the card (ResNet-50 on CIFAR: ~400 ops)
    assert step_seconds(1e9, 1000, A100, Precision.FP32, 0.4) == pytest.approx(
        1000 * HOST_SECONDS_PER_OP)


def test_a_step_is_timed_kernel_by_kernel_unless_an_mfu_is_given():
    from memcalc.device.speed import DEFAULT_MFU, timed_step
    from memcalc.trace.flops import StepFlops
    from memcalc.trace.kernels import Kernel, KernelClass

    flops = 10**15
    step = StepFlops(total=flops, convolution=0, launched_ops=1,
                     kernels=(Kernel(KernelClass.MATMUL, "", flops, 1 << 20),))
    by_kernel = timed_step(step, flops, A100, Precision.FP32)
    assert "timed one by one" in by_kernel.how
    # the MFU is an output: the FLOPs over the time at the dense peak
    assert by_kernel.mfu == pytest.approx(flops / (by_kernel.seconds * A100.fp32_tflops * 1e12))
    # twice the FLOPs (another batch): twice the kernel's time, one host issue
    assert timed_step(step, 2 * flops, A100, Precision.FP32).seconds == pytest.approx(
        2 * by_kernel.seconds, rel=1e-3)
    given = timed_step(step, flops, A100, Precision.FP32, mfu=0.25)
    assert given.seconds == pytest.approx(compute_seconds(flops, A100, Precision.FP32, 0.25))
    assert "--mfu" in given.how
    unlisted = timed_step(step.model_copy(update={"kernels": ()}), flops, A100, Precision.FP32)
    assert unlisted.seconds == pytest.approx(compute_seconds(flops, A100, Precision.FP32,
                                                             DEFAULT_MFU))
    assert "no kernels listed" in unlisted.how
