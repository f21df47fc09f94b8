"""Whole volumes evaluated window by window (``--roi``): MONAI's own
``sliding_window_inference`` traced with the model, checked against a real run of it on the
CPU (profiler memory timeline) and against the closed forms of its aggregation buffers."""

import pytest
import torch

import memcalc
from memcalc.errors import InputError
from memcalc.specs import TrainingSpec
from memcalc.trace.python_values import SCALAR_OP
from tests.fixtures.cpu_truth import measure_cpu_peak_bytes
from tests.fixtures.ecosystem_models import voxel_mlp

# no convolutions: a real CPU run then has no scratch the trace cannot see (oneDNN, vol2col)
NET = "tests.fixtures.ecosystem_models:voxel_mlp"
CASES = {   # volume (C, D, H, W), window, windows per forward, overlap, mode
    "constant": ((1, 64, 64, 64), (32, 32, 32), 2, 0.25, "constant"),
    "gaussian": ((1, 64, 48, 80), (32, 32, 32), 4, 0.5, "gaussian"),
    "one-window-at-a-time": ((1, 96, 64, 64), (48, 48, 48), 1, 0.25, "constant"),
}


def _estimate(volume, roi, sw_batch_size, overlap, mode, **options):
    return memcalc.estimate(NET, volume, batch_size=1, device="cpu", phase="eval", loss="sum",
                            sliding_window=dict(roi=roi, sw_batch_size=sw_batch_size,
                                                overlap=overlap, mode=mode), **options)


def _real_peak(volume, roi, sw_batch_size, overlap, mode) -> int:
    from monai.inferers import sliding_window_inference

    torch.manual_seed(0)
    model, batch = voxel_mlp().eval(), torch.randn(1, *volume)

    def step():
        with torch.no_grad():
            output = sliding_window_inference(batch, roi, sw_batch_size, model,
                                              overlap=overlap, mode=mode)
            output.sum()
    return measure_cpu_peak_bytes(step)


@pytest.mark.parametrize("case", list(CASES))
def test_sliding_window_inference_within_3_percent_of_a_real_one(case):
    report = _estimate(*CASES[case])
    assert report.device.method == "traced"
    assert report.device.peak_bytes == pytest.approx(_real_peak(*CASES[case]), rel=0.03)
    # MONAI reads its importance map's minimum (``.item()``): a constant map's is the constant
    # torch.ones filled it with, read back exactly; a Gaussian map's is computed, not followed
    reads = [use.keeps_most_work for use in report.device.bounded_sizes if use.op == SCALAR_OP]
    assert reads and all(reads) is (CASES[case][4] == "constant")


def test_the_aggregation_buffers_are_the_whole_volume_in_the_outputs_dtype():
    volume, roi = (1, 64, 64, 64), (32, 32, 32)
    classes = {channels: _estimate(volume, roi, 1, 0.25, "constant",
                                   model_args={"out_channels": channels}).device.peak_bytes
               for channels in (4, 12)}
    # eight more output channels: the aggregation buffer grows by 8·D·H·W float32 values, and
    # the window's own output (8 more channels of one window) comes and goes below that
    whole = 8 * 64 * 64 * 64 * 4
    grown = classes[12] - classes[4]
    assert whole <= grown <= whole + 8 * 32 ** 3 * 4 * 3


def _on_a_gpu(**placement):
    """One evaluation for a GPU: volume 1×64³, windows 32³ two at a time, four classes."""
    return memcalc.estimate(NET, (1, 64, 64, 64), batch_size=1, phase="eval", loss="sum",
                            model_args={"out_channels": 4},
                            sliding_window=dict(roi=(32, 32, 32), sw_batch_size=2,
                                                **placement)).device


VOXELS, WINDOW_VOXELS = 64 ** 3, 32 ** 3


def test_aggregating_on_the_cpu_moves_exactly_the_output_and_count_map_to_host_ram():
    on_gpu, on_host = _on_a_gpu(), _on_a_gpu(output_device="cpu")
    aggregation = (4 + 1) * VOXELS * 4          # output B·C·D·H·W and count map D·H·W, float32
    assert on_gpu.peak_allocated_bytes - on_host.peak_allocated_bytes == aggregation
    assert on_gpu.host_tensor_bytes == 0
    # on the host beside them: one window batch's output on its way in, and the window's
    # importance map MONAI copies there for the count map
    window_outputs, importance = 2 * 4 * WINDOW_VOXELS * 4, WINDOW_VOXELS * 4
    assert on_host.host_tensor_bytes == aggregation + window_outputs + importance


def test_a_volume_in_host_ram_sends_the_gpu_one_window_batch_at_a_time():
    on_gpu = _on_a_gpu()
    held = _on_a_gpu(volume_device="cpu", output_device="gpu")
    assert on_gpu.peak_allocated_bytes - held.peak_allocated_bytes == VOXELS * 4
    # beside the volume (the batch the host estimate holds): the window batch gathered from
    # it before its copy to the GPU
    assert held.host_tensor_bytes == 2 * WINDOW_VOXELS * 4
    both = _on_a_gpu(volume_device="cpu")       # the output follows the volume by default
    assert both.host_tensor_bytes > held.host_tensor_bytes + (4 + 1) * VOXELS * 4 - 1


def test_on_a_cpu_step_the_placement_changes_nothing():
    def peak(**placement):
        return memcalc.estimate(NET, (1, 64, 64, 64), batch_size=1, device="cpu", phase="eval",
                                loss="sum", sliding_window=dict(roi=(32, 32, 32),
                                                                sw_batch_size=2, **placement)
                                ).device
    plain, placed = peak(), peak(volume_device="cpu", output_device="cpu")
    assert (placed.peak_bytes, placed.host_tensor_bytes) == (plain.peak_bytes, 0)


def test_a_window_that_does_not_match_the_volume_is_refused():
    with pytest.raises(InputError, match="has 2 dims but the volume 1,64,64,64 has 3"):
        _estimate((1, 64, 64, 64), (32, 32), 1, 0.25, "constant")
    with pytest.raises(ValueError, match="give --phase eval"):
        TrainingSpec(model="unet3d", sliding_window={"roi": (32, 32, 32)})


def test_the_command_line_sets_the_window_and_refuses_its_options_without_one():
    import json

    from click.testing import CliRunner

    from memcalc.cli.commands import main

    args = ["estimate", "--model", NET, "--shape", "1,64,64,64", "--phase", "eval", "--device",
            "cpu", "--batch-size", "1", "--loss", "sum"]
    window = ["--roi", "32,32,32", "--sw-batch-size", "2", "--overlap", "0.5",
              "--sw-mode", "gaussian", "--volume-device", "cpu", "--output-device", "gpu"]
    result = CliRunner().invoke(main, [*args, *window, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["spec"]["sliding_window"] == {"roi": [32, 32, 32], "sw_batch_size": 2,
                                                "overlap": 0.5, "mode": "gaussian",
                                                "volume_device": "cpu", "output_device": "gpu"}
    assert report["device"]["peak_bytes"] == _estimate((1, 64, 64, 64), (32, 32, 32), 2, 0.5,
                                                       "gaussian").device.peak_bytes
    alone = CliRunner().invoke(main, [*args, "--overlap", "0.5"])
    assert alone.exit_code == 2 and "--overlap sets a sliding window" in alone.stderr
