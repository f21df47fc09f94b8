"""Measurements to profile (pure parts of memcalc.calibration) and calibrate without a GPU."""

import pytest
import torch

from memcalc.calibration.conv_grid import grid_layers
from memcalc.calibration.profile_builder import build_profile, floor_from_stages, workspace_model
from memcalc.trace.cudnn_workspace import ConvCall, ConvKind, MeasuredConv
from memcalc.device.env_profile import builtin_profile
from memcalc.errors import CalibrationError


def _stage(outside, allocated=0):
    return {"outside_bytes": outside, "allocated_bytes": allocated}


def test_floor_from_the_two_library_orders():
    cublas_first = {"context": _stage(500), "cublas": _stage(720), "cudnn": _stage(740)}
    cudnn_first = {"context": _stage(505), "cudnn": _stage(615), "cublas": _stage(742)}
    floor = floor_from_stages(cublas_first, cudnn_first)
    assert (floor.context_bytes, floor.cublas_bytes, floor.cudnn_bytes,
            floor.cudnn_after_cublas_bytes) == (500, 220, 110, 20)


def test_a_process_nvml_does_not_list_cannot_give_a_floor():
    stages = {"context": _stage(None), "cublas": _stage(1), "cudnn": _stage(2)}
    with pytest.raises(ValueError, match="NVML does not list"):
        floor_from_stages(stages, stages)


def _measured(nbytes, benchmark=False, first=True, batch=2):
    call = ConvCall(kind=ConvKind.FORWARD, input_shape=(batch, 8, 8, 8, 8),
                    weight_shape=(8, 8, 3, 3, 3), output_shape=(batch, 8, 8, 8, 8),
                    stride=(1, 1, 1), padding=(1, 1, 1), dilation=(1, 1, 1), groups=1,
                    transposed=False, dtype="float32", benchmark=benchmark)
    return MeasuredConv(call=call, backend="Cudnn", iteration=1, first_call=first,
                        transient_peak_bytes=nbytes, transient_total_bytes=nbytes,
                        transient_blocks=1, reserved_growth_bytes=0)


def test_searches_and_plans_are_fitted_apart():
    plans = [_measured(8192 * batch, batch=batch) for batch in (1, 2)]
    finds = [_measured(10 * 8192 * batch, benchmark=True, batch=batch) for batch in (1, 2)]
    finds.append(_measured(1, benchmark=True, first=False))  # a cached plan, not a search
    model = workspace_model(plans + finds, finds)
    call = plans[1].call
    # coefficients are stored to 4 decimals
    assert model.workspace_bytes(call) == pytest.approx(2 * 8192, rel=0.01)
    assert model.find_bytes(call) == pytest.approx(10 * 2 * 8192, rel=0.01)


def test_build_profile_splits_cublas_workspaces_per_handle():
    h100 = builtin_profile("h100-torch2.11-cu130.json")
    profile = build_profile("x", "test", {}, h100.floor, cublas_workspace_total_bytes=64 << 20,
                            cublas_handles=2, cudnn=h100.cudnn, driver_reserved_bytes=480 << 20)
    assert profile.cublas_workspace_bytes == 32 << 20 and profile.driver_reserved_bytes == 480 << 20


def test_the_grid_covers_both_dimensionalities_and_every_kernel_family():
    layers = [layer for dims in (2, 3) for layer, _ in grid_layers(dims)]
    assert any(isinstance(layer, torch.nn.Conv3d) for layer in layers)
    assert any(layer.groups > 1 for layer in layers)
    assert any(isinstance(layer, torch.nn.ConvTranspose3d) for layer in layers)


def test_calibrate_without_a_gpu_says_where_to_run_it(monkeypatch):
    from memcalc.calibration.run import calibrate

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(CalibrationError, match="no CUDA GPU is visible here"):
        calibrate()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_calibrate_round_trips_into_an_estimate(tmp_path):
    from click.testing import CliRunner

    from memcalc.cli.commands import main
    from memcalc.device.env_profile import load_profile

    out = tmp_path / "profile.json"
    assert CliRunner().invoke(main, ["calibrate", "--out", str(out)]).exit_code == 0
    profile = load_profile(out)
    assert profile.floor.context_bytes > 0 and profile.cudnn.rules
    result = CliRunner().invoke(main, ["estimate", "--model", "unet3d", "--shape", "1,32,32,32",
                                       "--json", "--env-profile", str(out)])
    assert f'"env_profile": "{profile.name}"' in result.stdout
