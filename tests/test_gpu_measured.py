"""memcalc held to training steps measured on a real H100 (benchmarks/gpu_data/), no GPU needed.

The issue's targets: allocated within 3 %, reserved and nvidia-smi within 8 % (medians) for
the convolution nets, on the second sizes, whose cuDNN calls the built-in profile was not
fitted to. The allocator model is also run over the real allocation histories.
"""

import statistics

import pytest
import torch

from tests.fixtures import gpu_data
from tests.fixtures.gpu_compare import FIGURES, case_errors, is_conv_net, replay_error
from tests.fixtures.gpu_profile import fitted_case, h100_profile
from memcalc.device.env_profile import builtin_profile

HELD_OUT = [(case, row) for case, row in gpu_data.measured_cases()
            if is_conv_net(case) and not fitted_case(case.name)]
TARGET_PERCENT = {"allocated": 3.0, "reserved": 8.0, "nvidia-smi": 8.0}


def test_the_stored_measurements_name_hardware_versions_and_cases():
    steps = gpu_data.steps()
    assert steps["versions"]["gpu"].startswith("NVIDIA H100")
    assert {"torch", "cuda", "cudnn", "driver"} <= set(steps["versions"])
    assert len(steps["steps"]) >= 70 and len(HELD_OUT) >= 30
    precisions = {case.precision for case, _ in HELD_OUT}
    assert {"fp32", "bf16-mixed", "fp16-mixed"} <= precisions
    assert {case.benchmark for case, _ in HELD_OUT} == {False, True}


def test_fp16_steps_were_measured_with_every_optimizer_step_taken():
    # GradScaler's default scale skips the first steps (Adam's state never appears then)
    fp16 = [row for _, row in gpu_data.measured_cases() if row["case"]["precision"] == "fp16-mixed"]
    assert fp16 and all(row.get("skipped_optimizer_steps") == 0 for row in fp16)


@pytest.mark.slow
def test_held_out_convolution_steps_meet_the_targets():
    errors = [case_errors(case, row) for case, row in HELD_OUT]
    for figure in FIGURES:
        median = statistics.median(abs(error[figure]) for error in errors)
        assert median <= TARGET_PERCENT[figure], (figure, median)


def test_the_allocator_model_reproduces_real_allocation_histories():
    errors = [abs(replay_error(history)) for history in gpu_data.traces().values()]
    assert len(errors) >= 70
    assert statistics.median(errors) <= 2.0
    assert max(errors) <= 12.0


def test_the_built_in_profile_is_the_fit_of_the_first_sizes_only():
    # refitted from the stored measurements: the shipped rules are exactly these
    shipped = builtin_profile("h100-torch2.11-cu130.json")
    refit = h100_profile()
    assert refit.cudnn == shipped.cudnn and refit.floor == shipped.floor
    assert shipped.driver_reserved_bytes == 480 << 20


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_a_measured_step_agrees_with_the_prediction():
    from tests.fixtures.gpu_step import measure_step

    case = HELD_OUT[0][0]
    errors = case_errors(case, measure_step(case), profile=gpu_data.PROFILE)
    assert abs(errors["allocated"]) <= 5 and abs(errors["reserved"]) <= 20


def _measured_bf16_over_fp32() -> list[float]:
    """Reserved peak of bf16-mixed over fp32 (TF32) for each measured conv net, batch, shape."""
    rows = {case.name: row for case, row in gpu_data.measured_cases() if is_conv_net(case)}
    return [row["max_reserved_bytes"] / rows[name.replace("bf16-mixed", "fp32 tf32")]["max_reserved_bytes"]
            for name, row in rows.items()
            if name.endswith("bf16-mixed") and name.replace("bf16-mixed", "fp32 tf32") in rows]


def test_mixed_precision_3d_resnet_50_needs_less_than_fp32_as_measured_nets_do():
    # a 3D 1x1x1 rule fitted to two calls once predicted 224 GiB of workspace here (bf16
    # 413 GiB against fp32 17 GiB); every measured conv net holds 50-71 % of fp32 in bf16
    from tests.fixtures.gpu_compare import predicted_figures
    from tests.fixtures.gpu_cases import GpuCase

    ratios = _measured_bf16_over_fp32()
    assert len(ratios) >= 8 and max(ratios) < 1
    reserved = {precision: predicted_figures(GpuCase("resnet3d", (3, 16, 112, 112), 4, precision,
                                                     model_args={"depth": 50}))["reserved"]
                for precision in ("fp32", "bf16-mixed")}
    assert min(ratios) <= reserved["bf16-mixed"] / reserved["fp32"] <= max(ratios)
