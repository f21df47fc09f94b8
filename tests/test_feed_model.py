"""The feeding model in closed form, and its verdict on the seeds' CIFAR-on-2-CPUs case."""

import math

import pytest
import torch
from torch import nn

from memcalc.device.speed import HOST_SECONDS_PER_OP
from memcalc.feed.model import feeding_report, utilization
from memcalc.device.gpus import find_gpu
from memcalc.model.source import resolve_model
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec


def test_utilization_closed_forms():
    assert utilization(0, 0.03, 0.04, cpus=8) == pytest.approx(0.03 / 0.07)
    assert utilization(1, 0.03, 0.04, cpus=8) == pytest.approx(0.75)
    assert utilization(2, 0.03, 0.04, cpus=8) == 1.0
    assert utilization(4, 0.01, 0.01, cpus=8, pin_s=0.02) == pytest.approx(0.5)  # pin thread


def test_more_runnable_processes_than_cores_share_them():
    # 8 workers and a sleeping main process on 2 cores: each worker gets a quarter core
    assert utilization(8, 0.01, 0.2, cpus=2, main_busy=0) == pytest.approx(8 * 0.25 * 0.05)
    # the main process spins while the GPU is busy (share u of the time), and then it and the
    # 8 workers share the 2 cores fairly (16/9 cores for the workers), all of them otherwise:
    # u = (u·16/9 + (1 − u)·2)·0.05 = 0.1 − u/90, so u = 9/91
    assert utilization(8, 0.01, 0.2, cpus=2) == pytest.approx(9 / 91)
    # other processes use one of 2 cores: two workers and a sleeping main share the other
    assert utilization(2, 0.01, 0.04, cpus=2, main_busy=0, other_busy_cpus=1) == \
        pytest.approx(2 * 0.5 * 0.25)
    # without workers the main process builds on a core of its own unless others leave less
    assert utilization(0, 0.01, 0.04, cpus=2, other_busy_cpus=1.5) == \
        pytest.approx(0.01 / (0.01 + 0.04 / 0.5))
    assert utilization(0, 0.01, 0.04, cpus=2, other_busy_cpus=1) == pytest.approx(0.2)
    # spare cores: a spinning main process costs the workers nothing
    assert utilization(2, 0.03, 0.04, cpus=4) == utilization(2, 0.03, 0.04, cpus=4, main_busy=0)


def test_the_main_process_takes_each_batch_between_steps():
    # workers to spare: a step starts every step + receive (20 ms step, 5 ms to take a batch)
    assert utilization(4, 0.02, 0.01, cpus=8, receive_s=0.005) == pytest.approx(0.02 / 0.025)
    # a spinning main process is runnable u·(20 + 5)/20 of the time, and two workers (40 ms a
    # batch) get 4/3 of the 2 cores beside it: u = (2 − (2/3)·1.25u)·0.5 = 12/17; but both
    # are building at each receive (40 ms > 20 / u), so the receive shares a core with one:
    # 0.02 / (0.02 + 2 × 0.005) = 2/3
    assert utilization(2, 0.02, 0.04, cpus=2, receive_s=0.005) == pytest.approx(2 / 3)
    # where batches wait for a worker's GIL (a slow hand-over) that fair share is lost again:
    # the main process keeps its whole core, u = (2 − 1.25u)·0.5 = 1/1.625
    assert utilization(2, 0.02, 0.04, cpus=2, receive_s=0.005, busy_receive_s=0.03) == \
        pytest.approx(1 / 1.625)
    # a sleeping main process uses only the receiving: u = (2 − 0.25u)·0.5, u = 1/1.125,
    # above the serial bound, which holds: each 40 ms build outlasts the time between
    # batches, so both workers are building at each receive and the receive shares a core,
    # 0.02 / (0.02 + 2 × 0.005) = 2/3
    assert utilization(2, 0.02, 0.04, cpus=2, main_busy=0, receive_s=0.005) == \
        pytest.approx(2 / 3)
    # with 4 cores a core is idle at each receive: 0.02 / 0.025
    assert utilization(2, 0.02, 0.04, cpus=4, main_busy=0, receive_s=0.005) == \
        pytest.approx(0.8)


def test_a_sleeping_main_process_waits_for_a_core_when_workers_keep_every_core_busy():
    # 12 ms step, 1.2 ms receive, 22.8 ms a batch per worker, 2 workers on 2 cores, a 2 ms wait
    # at a wake-up that finds no idle core. Batches come every 12 / u ms, less than a build
    # (u > 12 / 22.8), so at each receive the worker sent an index a batch earlier is still
    # building beside the one sent the next: no idle core, the wake waits 2 ms and the receive
    # shares a core (1.2 ms more): u = 12 / (12 + 1.2 + 2 + 1.2)
    costs = {"step_s": 0.012, "load_s": 0.0228, "cpus": 2, "receive_s": 0.0012}
    assert utilization(2, main_busy=0, wake_wait_s=0.002, **costs) == \
        pytest.approx(12 / 16.4)
    # a spinning process never sleeps; one worker on two cores always leaves a core idle
    assert utilization(2, main_busy=1, wake_wait_s=0.002, **costs) == \
        utilization(2, main_busy=1, **costs)
    assert utilization(1, main_busy=0, wake_wait_s=0.002, **costs) == \
        utilization(1, main_busy=0, **costs)


def test_builds_shorter_than_the_time_between_batches_leave_a_core_idle_at_each_receive():
    # 20 ms step, 2.7 ms receive, 18.7 ms a build: batches every 22.7 ms, so each worker has
    # finished before the next receive; only the one sent the next index is building
    costs = {"step_s": 0.020, "load_s": 0.0187, "cpus": 2, "receive_s": 0.0027}
    assert utilization(2, main_busy=0, wake_wait_s=0.002, **costs) == \
        pytest.approx(20 / 22.7)
    # a build a little longer than that keeps both workers busy at each receive:
    # u = 20 / (20 + 2.7 + 2 + 2.7), and 20 / u = 27.4 ms is still shorter than the build
    assert utilization(2, main_busy=0, wake_wait_s=0.002, **{**costs, "load_s": 0.030}) == \
        pytest.approx(20 / 27.4)


def test_without_workers_the_main_process_builds_at_its_own_speed():
    # a worker needs 40 ms a batch (it writes the batch into shared memory), the main
    # process 25 ms in its own memory
    assert utilization(0, 0.02, 0.04, cpus=2, main_load_s=0.025) == pytest.approx(0.02 / 0.045)
    assert utilization(0, 0.02, 0.04, cpus=2) == pytest.approx(0.02 / 0.06)
    # the worker's time still sets the pace with workers
    assert utilization(1, 0.02, 0.04, cpus=2, main_load_s=0.025) == pytest.approx(0.5)


def test_a_measured_receive_is_paid_between_steps_and_a_slow_hand_over_is_advice():
    # workers to spare: a step starts every 20 + 5 ms, whatever the workers, so the fewest
    # that reach it are recommended and the training process's receive is what to cut
    report = feeding_report(0.02, "given", 0.01, "measured", max_workers=4, cpus=8,
                            batch_bytes=1 << 20, pin_memory=False, receive_s=0.005,
                            busy_receive_s=0.030)
    assert report.by_workers[2].expected_gpu_utilization == pytest.approx(0.8)
    assert report.bound == "main" and report.num_workers == 1
    assert any("5 ms (measured in the probe)" in line for line in report.assumptions)
    assert "5 ms taking each batch" in report.advice[0]
    # 30 ms from a building worker against 5 ms from an idle one: the GIL hand-over
    assert any("set_sharing_strategy('file_system')" in line for line in report.advice)
    quick = feeding_report(0.02, "given", 0.01, "measured", max_workers=4, cpus=8,
                           batch_bytes=1 << 20, pin_memory=False, receive_s=0.005,
                           busy_receive_s=0.006)
    assert not any("file_system" in line for line in quick.advice)


def test_workers_are_recommended_with_capacity_to_spare():
    # 8 workers build a batch per 50 ms step exactly: no margin for a slower batch
    report = feeding_report(0.05, "given", 0.4, "given", max_workers=16, cpus=16,
                            batch_bytes=1 << 20, pin_memory=False)
    assert report.by_workers[8].expected_gpu_utilization >= 0.95
    assert report.workers_needed == math.ceil(1.2 * 0.4 / 0.05) == 10
    assert report.num_workers == 10 and report.bound == "gpu" and not report.advice
    # one worker at 95 % of the step: two recommended
    close = feeding_report(0.05, "given", 0.0475, "given", max_workers=4, cpus=8,
                           batch_bytes=1 << 20, pin_memory=False)
    assert close.by_workers[1].expected_gpu_utilization >= 0.95 and close.num_workers == 2
    # spare capacity is never bought with utilisation: 2 CPUs and the training process
    tight = feeding_report(0.05, "given", 0.09, "given", max_workers=2, cpus=2,
                           batch_bytes=1 << 20, pin_memory=False)
    assert tight.num_workers <= 2
    assert [row.num_workers for row in report.by_workers] == list(range(17))


def test_too_few_cpus_is_a_cpu_bound_verdict_with_advice():
    report = feeding_report(0.01, "given", 0.3, "given", max_workers=2, cpus=2,
                            batch_bytes=1 << 20, pin_memory=False)
    assert report.bound == "cpu" and report.num_workers == 2
    # the spinning main process shares the 2 cores with two workers while the GPU is busy:
    # u = (u·4/3 + (1 − u)·2)·(0.01/0.3), so u = 3/46
    assert report.expected_gpu_utilization == pytest.approx(3 / 46)
    assert "CPU-bound: 36 workers would keep the GPU busy (20% to spare)" in report.advice[0]
    io = feeding_report(0.01, "given", 0.3, "read bandwidth", max_workers=2, cpus=2,
                        batch_bytes=1 << 20, pin_memory=False)
    assert io.bound == "io" and "storage" in io.advice[1]


@pytest.mark.slow
def test_cifar_on_two_cpus_is_cpu_bound():
    spec = TrainingSpec(model="resnet50", model_args={"num_classes": 10}, sample_shape=(3, 32, 32),
                        batch_size=128, gpu="A100-80GB", feed={"sample_time_s": 0.002},
                        machine={"cpus": 2, "ram_bytes": 16 << 30})
    report = estimate(spec)
    throughput = report.throughput
    a100, (convolution, linear) = find_gpu("A100-80GB"), _training_flops_closed_form(128)
    # convolutions on TF32 tensor cores (cuDNN's default), the classifier's matmul in fp32
    seconds = (convolution / (a100.tf32_tflops * 1e12) + linear / (a100.fp32_tflops * 1e12)) / 0.4
    # ...but the host issues the step's ops one by one: at least one op per convolution,
    # batch norm and ReLU in forward and one more in backward, plus the optimizer's
    ops, kernels = report.device.flops.launched_ops, len(report.device.flops.kernels)
    layers = sum(isinstance(m, (nn.Conv2d, nn.BatchNorm2d, nn.ReLU))
                 for m in resolve_model("resnet50", {"num_classes": 10}).build_meta().modules())
    assert ops >= 2 * layers and ops * HOST_SECONDS_PER_OP > 10 * seconds
    # the step is paced by the host (it ends at most a few kernels after the last issue)
    assert kernels * HOST_SECONDS_PER_OP <= throughput.step_time_s < 1.2 * kernels * HOST_SECONDS_PER_OP
    assert "paced by the host" in throughput.step_time_source
    assert "MFU" in throughput.step_time_source
    assert throughput.batch_load_time_s == pytest.approx(128 * 0.002)
    assert throughput.bound == "cpu" and throughput.num_workers == 2
    assert throughput.expected_gpu_utilization < 0.2
    assert report.host.recommended_num_workers == 2


def test_without_a_sample_time_there_is_no_feeding_verdict():
    spec = TrainingSpec(model="mlp", model_args={"in_features": 784}, sample_shape=(784,),
                        batch_size=8, gpu="T4",
                        machine={"cpus": 4, "ram_bytes": 16 << 30})
    assert estimate(spec).throughput is None


def _training_flops_closed_form(batch: int) -> tuple[int, int]:
    """Convolution and matmul FLOPs of resnet50 (10 classes, 3×32×32) in one training step:
    2 × MACs per layer output in forward, the same again for the input gradient and for the
    weight gradient, except the stem's input gradient (the batch needs none)."""
    model = resolve_model("resnet50", {"num_classes": 10}).build_meta()
    forward = {}

    def count(module, _inputs, output):
        forward[module] = 2 * module.weight[0].numel() * output.numel()

    for module in model.modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            module.register_forward_hook(count)
    with torch.no_grad():
        model(torch.empty((batch, 3, 32, 32), device="meta"))
    stem = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    convolution = sum(3 * f for m, f in forward.items() if isinstance(m, nn.Conv2d)) - forward[stem]
    linear = sum(3 * f for m, f in forward.items() if isinstance(m, nn.Linear))
    return convolution, linear
