"""The first line of ``memcalc estimate``: the verdict agrees with the report under it and
with the GPU catalog, and fits an 80-column line for the usual sizes."""

import json

import pytest
from click.testing import CliRunner

from memcalc.cli.commands import main
from memcalc.device.gpus import gpu_catalog
from memcalc.units import format_bytes

TINY = ["--model", "mlp", "--model-arg", "in_features=64", "--model-arg", "hidden=128",
        "--shape", "64"]
SEED = ["--model", "resnet3d", "--shape", "834,224,834,3"]


def _first_line_and_report(args):
    shown = CliRunner().invoke(main, ["estimate", *args])
    as_json = CliRunner().invoke(main, ["estimate", *args, "--json"])
    assert shown.exit_code == 0 and as_json.exit_code == 0, shown.stderr
    return shown.stdout.splitlines()[0], json.loads(as_json.stdout)


@pytest.mark.parametrize("args, verdict", [
    (["--gpu", "A100-80GB", "--batch-size", "64"], "FITS on A100-80GB"),
    (["--gpu", "T4", "--batch-size", "10000000"], "DOES NOT FIT on T4"),
])
def test_the_verdict_is_the_reports_fit_with_its_numbers(args, verdict):
    line, report = _first_line_and_report([*TINY, *args])
    device = report["device"]
    assert line.startswith(verdict)
    assert device["fits"] is verdict.startswith("FITS")
    assert f"batch {device['batch_size']} needs {format_bytes(device['total_bytes'])}" in line
    usable = device["capacity_bytes"] - device["headroom_bytes"]
    assert f" / {format_bytes(usable)} usable (max batch {device['max_batch_size']})" in line


def test_the_seed_volume_fits_no_card_in_the_catalog():
    line, report = _first_line_and_report(SEED)
    biggest = max(gpu_catalog(), key=lambda gpu: gpu.memory_bytes)
    assert report["device"]["total_bytes"] > biggest.memory_bytes
    assert line.startswith("DOES NOT FIT ANY GPU: batch 1 needs ")
    assert f"({biggest.name}: {format_bytes(biggest.memory_bytes)})" in line
    assert "memcalc plan" in line and len(line) <= 80


def test_when_batch_one_does_not_fit_the_verdict_points_to_the_planner():
    line, report = _first_line_and_report([*SEED, "--gpu", "T4"])
    assert report["device"]["fits"] is False and report["device"]["max_batch_size"] == 0
    assert line.startswith("DOES NOT FIT on T4: batch 1 needs ")
    assert line.endswith("usable; memcalc plan") and len(line) <= 80


def test_without_a_gpu_the_smallest_card_that_holds_the_step_is_named():
    line, report = _first_line_and_report(TINY)
    total = report["device"]["total_bytes"]
    holding = sorted((gpu for gpu in gpu_catalog() if gpu.memory_bytes >= total),
                     key=lambda gpu: gpu.memory_bytes)
    assert f"smallest card for it: {holding[0].name} " in line


def test_a_static_estimate_never_reads_as_a_fit():
    line, report = _first_line_and_report(["--model", "tests.fixtures.models:untraceable",
                                           "--shape", "8", "--gpu", "A100-80GB",
                                           "--batch-size", "2"])
    assert report["device"]["method"] == "static"
    assert line.startswith("FIT UNKNOWN (STATIC): batch 2 needs ")
    assert "FITS" not in line
