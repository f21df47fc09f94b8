"""The first line of every command: the verdict agrees with the report under it (and with
the GPU catalog), and fits an 80-column line for the usual sizes."""

import json

import pytest
from click.testing import CliRunner

from memcalc.cli.commands import main
from memcalc.device.gpus import gpu_catalog
from memcalc.feed.check import FeedCheck, FeedRow
from memcalc.render.plan import short_label
from memcalc.render.verdict import feed_verdict
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


def test_the_seed_volume_fits_no_card_in_the_catalog_at_batch_2():
    line, report = _first_line_and_report([*SEED, "--batch-size", "2"])
    biggest = max(gpu_catalog(), key=lambda gpu: gpu.memory_bytes)
    least = report["device"]["least_reserved_bytes"] + report["device"]["context_bytes"]
    assert least > biggest.memory_bytes
    assert line.startswith("DOES NOT FIT ANY GPU: batch 2 needs ")
    assert f"({biggest.name}: {format_bytes(biggest.memory_bytes)})" in line
    assert "memcalc plan" in line


def test_at_batch_1_the_smallest_card_named_is_one_that_runs_it_at_its_capacity():
    # with room to spare the allocator caches more than the smallest card that runs the step
    # holds: the card named is the one whose own replay, at its capacity, runs the step
    line, report = _first_line_and_report(SEED)
    device = report["device"]
    assert device["least_reserved_bytes"] < device["peak_reserved_bytes"]
    assert "with room to spare, at least" in line
    smallest = line.split("smallest card for it: ")[1].split(" ")[0]
    on_it, _ = _first_line_and_report([*SEED, "--gpu", smallest])
    assert on_it.startswith(f"FITS on {smallest}: batch 1 needs ")


def test_when_batch_one_does_not_fit_the_verdict_points_to_the_planner():
    line, report = _first_line_and_report([*SEED, "--gpu", "T4"])
    assert report["device"]["fits"] is False and report["device"]["max_batch_size"] == 0
    assert line.startswith("DOES NOT FIT on T4: batch 1 needs ")
    assert line.endswith("usable; memcalc plan") and len(line) <= 80


def test_without_a_gpu_the_largest_batch_on_the_common_cards_is_named():
    line, report = _first_line_and_report(TINY)
    fits = [fit for fit in report["device"]["card_fits"] if fit["max_batch_size"]]
    low, high = fits[0], fits[-1]
    mark = {True: "", False: "~"}
    assert (f"largest batch {mark[low['confirmed']]}{low['max_batch_size']} on {low['gpu']} to "
            f"{mark[high['confirmed']]}{high['max_batch_size']} on {high['gpu']}") in line
    assert line.endswith("--gpu for a verdict")


def test_a_step_only_the_largest_catalog_cards_hold_names_the_smallest_of_them():
    from memcalc.pipeline import estimate
    from memcalc.render.verdict import verdict_line
    from memcalc.specs import TrainingSpec

    report = estimate(TrainingSpec(model="mlp", sample_shape=(64,),
                                   model_args={"in_features": 64, "hidden": 128}))
    catalog = sorted(gpu_catalog(), key=lambda gpu: gpu.memory_bytes)
    total = (catalog[-2].memory_bytes + catalog[-1].memory_bytes) // 2   # only the largest
    device = report.device.model_copy(update={
        "card_fits": [fit.model_copy(update={"max_batch_size": 0})
                      for fit in report.device.card_fits],
        "peak_reserved_bytes": total - report.device.context_bytes,
        "least_reserved_bytes": None})
    line = verdict_line(report.model_copy(update={"device": device}))
    assert f"smallest card for it: {catalog[-1].name} " in line


def test_a_static_estimate_never_reads_as_a_fit():
    line, report = _first_line_and_report(["--model", "tests.fixtures.models:untraceable",
                                           "--shape", "8", "--gpu", "A100-80GB",
                                           "--batch-size", "2"])
    assert report["device"]["method"] == "static"
    assert line.startswith("FIT UNKNOWN (STATIC): batch 2 needs ")
    assert "FITS" not in line


def _first_line_and_json(command, args):
    shown = CliRunner().invoke(main, [command, *args], terminal_width=80)
    as_json = CliRunner().invoke(main, [command, *args, "--json"])
    assert shown.exit_code == as_json.exit_code == 0, shown.stderr
    return shown.stdout.splitlines(), json.loads(as_json.stdout)


def test_plan_opens_with_the_recommendation_and_reads_at_80_columns():
    lines, plan = _first_line_and_json("plan", [*TINY, "--gpu", "T4", "--gpus", "4", "--cpus",
                                               "8", "--ram", "64GB", "--rank-traces", "0"])
    chosen = next(c for c in plan["candidates"] if c["label"] == plan["recommended"])
    assert lines[0].startswith(f"PLAN: {short_label(chosen['label'])} on {chosen['gpus']} GPU")
    assert (f"batch {chosen['max_batch_size']}/GPU needs "
            f"{format_bytes(chosen['per_gpu_peak_bytes'])} / "
            f"{format_bytes(plan['usable_bytes'])} usable") in lines[0]
    assert all(len(line) <= 80 for line in lines[1:]) and "…" not in "".join(lines)


def test_host_opens_with_whether_the_workers_fit():
    args = ["--shape", "834,224,834,3", "--batch-size", "2", "--cpus", "64", "--ram", "188GB"]
    lines, host = _first_line_and_json("host", args)
    assert lines[0] == (f"FITS in host RAM: {host['num_workers']} workers need "
                        f"{format_bytes(host['peak_bytes'])} / "
                        f"{format_bytes(host['usable_bytes'])} usable (max_num_workers "
                        f"{host['max_num_workers']})")


def test_check_opens_with_fits():
    lines, report = _first_line_and_json("check", [*TINY, "--gpu", "T4", "--batch-size", "8"])
    assert lines[0].startswith(f"FITS: batch 8 needs "
                               f"{format_bytes(report['device']['total_bytes'])} of ")


def test_feed_opens_with_the_best_measured_share_and_the_models_worst_distance():
    rows = [FeedRow(num_workers=w, predicted_gpu_utilization=p, measured_gpu_utilization=m)
            for w, p, m in ((0, 0.3, 0.28), (1, 0.5, 0.56), (2, 0.9, 0.88))]
    check = FeedCheck(dataset="d:f", batch_size=4, step_time_s=0.01, seconds_per_sample=0.01,
                      cpus=2, consumer="spin", rows=rows)
    assert feed_verdict(check) == ("MEASURED: GPU busy 88% at best (2 workers); the model is "
                                   "within 6 points at every count")


@pytest.mark.parametrize("command", ["estimate", "check"])
def test_a_default_value_read_from_a_tensor_is_a_warning_under_the_verdict(command):
    # it was "TRACED, FITS" with the .item() that drove a branch only under --details
    args = [command, "--model", "tests.fixtures.models:item_gate", "--shape", "8",
            "--batch-size", "4", "--gpu", "T4"]
    lines = CliRunner().invoke(main, args).stdout.splitlines()
    assert lines[0].startswith("FITS")
    assert lines[1].startswith("WARNING: 2 values read from tensors") and "LOW" in lines[1]
    untouched = CliRunner().invoke(main, [command, *TINY, "--batch-size", "4", "--gpu", "T4"])
    assert "read from tensors" not in untouched.stdout


@pytest.mark.parametrize(("gpu", "precision", "warned"), [
    ("T4", "bf16-mixed", True), ("V100-16GB", "bf16", True), ("T4", "fp16-mixed", False),
    ("A100-80GB", "bf16-mixed", False)])
def test_bf16_on_a_card_without_bf16_tensor_cores_is_warned_under_the_verdict(gpu, precision,
                                                                              warned):
    result = CliRunner().invoke(main, ["check", "--model", "tests.fixtures.models:tiny_mlp",
                                       "--shape", "8", "--batch-size", "2", "--gpu", gpu,
                                       "--precision", precision, "--cpus", "2", "--ram", "8GiB"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("FITS")
    assert any(line.startswith(f"WARNING: {gpu} ") and "no bf16 tensor cores" in line
               for line in lines[:3]) is warned
