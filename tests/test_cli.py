"""The command line: bad input gives one line and a non-zero exit; --json is the report."""

import json
import re
import subprocess
import sys

import pytest
from pathlib import Path
from click.testing import CliRunner

from memcalc.cli.commands import main
from models_zoo import ZOO
from tests.fixtures.cli import assert_exited_cleanly

TINY_MLP = ["--model", "mlp", "--model-arg", "in_features=64", "--model-arg", "hidden=128",
            "--shape", "64"]

BAD_INVOCATIONS = {
    "non-numeric shape": (["--model", "resnet3d", "--shape", "3,x,224,224"],
                          r"shape must be positive integers separated by commas"),
    "zero in shape": (["--model", "resnet3d", "--shape", "3,0,224,224"],
                      r"shape dimensions must be positive"),
    "negative shape": (["--model", "resnet3d", "--shape", "3,-8,224,224"],
                       r"shape dimensions must be positive"),
    "unknown model": (["--model", "resnet3", "--shape", "3,8,8,8"],
                      r"unknown model 'resnet3' \(did you mean 'resnet3d'\?\); zoo models: resnet3d, unet3d"),
    "callable returning a non-module": (
        ["--model", "tests.fixtures.models:not_a_module", "--shape", "8"],
        r"returned int, not a torch.nn.Module"),
    "unimportable module": (["--model", "no_such_pkg.models:build", "--shape", "8"],
                            r"cannot import 'no_such_pkg.models'"),
    "missing attribute": (["--model", "tests.fixtures.models:nope", "--shape", "8"],
                          r"has no attribute 'nope'"),
    "unknown optimizer": (["--model", "mlp", "--optimizer", "lamb"],
                          r"Invalid value for '--optimizer': 'lamb' is not one of"),
    "unknown precision": (["--model", "mlp", "--precision", "fp8"],
                          r"Invalid value for '--precision': 'fp8' is not one of"),
    "shape fits neither layout": (["--model", "resnet3d", "--shape", "834,224,834,5"],
                                  r"fits neither layout.*takes 3 channels"),
    "wrong rank for the first layer": (["--model", "resnet3d", "--shape", "3,224,224"],
                                       r"has 3 dims but the first layer 'stem.0' \(Conv3d\)"),
    "bad builder argument": (["--model", "resnet3d", "--model-arg", "depth=7"],
                             r"resnet3d depth must be one of \[10, 18, 34, 50\]"),
    "float input to an embedding": (["--model", "gpt2", "--input-dtype", "float32"],
                                    r"token ids need an integer dtype.*use int64"),
    "batch size zero": (["--model", "mlp", "--batch-size", "0"], r"0 is not in the range 1<=x<=2147483647"),
    "malformed model arg": (["--model", "mlp", "--model-arg", "depth"],
                            r"model argument must look like key=value"),
    "ambiguous gpu": (["--model", "mlp", "--gpu", "a100"],
                      r"GPU 'a100' is ambiguous: which one, A100-40GB or A100-80GB\?"),
    "unknown gpu": (["--model", "mlp", "--gpu", "b300x"], r"unknown GPU 'b300x'"),
    "ambiguous memory unit": (["--model", "mlp", "--gpu-memory", "24G"],
                              r"size '24G' has unit 'g'; use .*GiB.*GB"),
    "headroom of all memory": (["--model", "mlp", "--gpu", "T4", "--headroom", "100%"],
                               r"headroom must be at least 0 and below 100%"),
    "gpu with a cpu device": (["--model", "mlp", "--gpu", "T4", "--device", "cpu"],
                              r"--gpu/--gpu-memory plan GPU memory; drop them or use --device cuda"),
    "more workers than CPUs": (["--model", "mlp", "--num-workers", "9", "--cpus", "8",
                                "--ram", "16GB"], r"num_workers 9 \(--num-workers\) is more than the 8 CPUs"),
}

# Other commands: full argument list, exit code, message.
COMMAND_BAD_INVOCATIONS = {
    "negative gpu memory": (["estimate", "--model", "mlp", "--gpu-memory", "-5GB"], 2,
                            r"size '-5GB' must be positive"),
    "unknown input dtype": (["estimate", "--model", "mlp", "--input-dtype", "float8"], 2,
                            r"'--input-dtype': 'float8' is not one of"),
    "unknown sample dtype": (["host", "--shape", "8", "--sample-dtype", "complex"], 2,
                             r"'--sample-dtype': 'complex' is not one of"),
    "unknown start method": (["host", "--shape", "8", "--start-method", "thread"], 2,
                             r"'--start-method': 'thread' is not one of"),
    "zero prefetch factor": (["host", "--shape", "8", "--prefetch-factor", "0"], 2,
                             r"'--prefetch-factor': 0 is not in the range x>=1"),
    "headroom not a number": (["estimate", "--model", "mlp", "--headroom", "lots"], 2,
                              r"headroom must be a fraction like 0.05 or a percentage like 5%"),
    "zero GPUs": (["plan", "--model", "mlp", "--gpu", "T4", "--gpus", "0"], 2,
                  r"'--gpus': 0 is not in the range 1<=x<=72"),
    "unknown interconnect": (["plan", "--model", "mlp", "--gpu", "T4", "--interconnect", "wifi"],
                             2, r"'--interconnect': 'wifi' is not one of"),
    "unknown strategy": (["plan", "--model", "mlp", "--gpu", "T4", "--strategy", "zero4"], 2,
                         r"'--strategy': 'zero4' is not one of"),
    "plan without a gpu": (["plan", "--model", "mlp"], 2, r"the strategy planner needs a GPU"),
    "check without a batch": (["check", "--model", "mlp", "--gpu", "T4"], 2,
                              r"check needs a batch size and a capacity"),
    "check that does not fit": (["check", "--model", "mlp", "--model-arg", "hidden=65536",
                                 "--shape", "784", "--model-arg", "in_features=784",
                                 "--batch-size", "4", "--gpu-memory", "1GiB", "--cpus", "2",
                                 "--ram", "8GiB"], 1,
                                r"DOES NOT FIT: batch 4 needs .* GiB on the GPU, .* usable "
                                r"\((largest batch that fits: about \d+, on the line through "
                                r"traced batches 1 and 4|not even batch 1 fits)\)"),
    "check of an untraceable model": (["check", "--model", "tests.fixtures.models:untraceable",
                                       "--shape", "8", "--batch-size", "4", "--gpu", "T4",
                                       "--cpus", "2", "--ram", "8GiB"], 3,
                                      r"FIT UNKNOWN \(STATIC\): the training step could not "
                                      r"be traced"),
    "named input without a shape": (["estimate", "--model", "mlp", "--input", "mask"], 2,
                                    r"input must look like NAME=SHAPE\[:DTYPE\]"),
    "empty shape part": (["estimate", "--model", "mlp", "--shape", "3,,224"], 2,
                         r"shape must be positive integers separated by commas"),
    "zero step time": (["feed", "--dataset", "a:b", "--step-time", "0"], 2,
                       r"'--step-time': 0.0 is not in the range x>0"),
    "negative worker count": (["feed", "--dataset", "a:b", "--step-time", "1", "--workers",
                               "-1"], 2, r"'--workers': counts must be 0 or more"),
    "unknown layout": (["estimate", "--model", "mlp", "--layout", "nhwc"], 2,
                       r"'--layout': 'nhwc' is not one of"),
    "spatial split of a transformer": (["estimate", "--model", "gpt2", "--spatial-parts", "2"],
                                       2, r"'gpt2' cannot be split spatially: it has no conv"),
    "more slabs than positions": (["estimate", "--model", "resnet3d", "--shape", "3,8,8,4",
                                   "--spatial-parts", "16"], 2,
                                  r"--spatial-parts 16 is more than the 8 positions"),
    "zero GPUs at most": (["plan", "--model", "mlp", "--gpu", "T4", "--max-gpus", "0"], 2,
                          r"'--max-gpus': 0 is not in the range 1<=x<=7200000"),
    "bad allocator setting": (["estimate", "--model", "mlp", "--allocator-conf",
                               "expandable_segments:maybe"], 2,
                              r"allocator setting expandable_segments:maybe: use True or False"),
    "forward missing an input": (["estimate", "--model", "tests.fixtures.models:two_inputs",
                                  "--shape", "32", "--batch-size", "2"], 2,
                                 r"forward\(\) needs 'mask'.*--input mask=SHAPE"),
    "check with an input forward does not take": (
        ["check", "--model", "tests.fixtures.models:two_inputs", "--shape", "32", "--batch-size",
         "2", "--gpu", "T4", "--input", "mask=64", "--input", "extra=3"], 2,
        r"unexpected keyword argument 'extra'"),
    "missing environment profile": (["check", "--model", "mlp", "--batch-size", "2", "--gpu",
                                     "T4", "--env-profile", "/no/such/profile.json"], 2,
                                    r"does not exist; write one with `memcalc calibrate`"),
}

HOST_BAD_INVOCATIONS = {
    "no shape and no dataset": ([], r"needs --shape, or --dataset to measure"),
    "negative RAM": (["--shape", "8", "--ram", "-4GB"], r"size '-4GB' must be positive"),
    "mem-per-cpu without cpus": (["--shape", "8", "--mem-per-cpu", "4GB"],
                                 r"--mem-per-cpu needs --cpus"),
    "more workers than CPUs": (["--shape", "8", "--cpus", "4", "--ram", "8GB",
                                "--num-workers", "5"], r"num_workers 5 \(--num-workers\) is more than the 4 CPUs"),
    "zero CPUs": (["--shape", "8", "--cpus", "0"], r"'--cpus': 0 is not in the range x>=1"),
    "unimportable dataset": (["--dataset", "no_such_pkg.data:build"],
                             r"cannot import 'no_such_pkg.data' for dataset"),
    "dataset that raises": (["--dataset", "tests.fixtures.host_datasets:broken"],
                            r"KeyError: 'no file for item \d+'"),
}


@pytest.mark.parametrize("command,case", [("estimate", case) for case in BAD_INVOCATIONS]
                         + [("host", case) for case in HOST_BAD_INVOCATIONS])
def test_bad_input_is_one_line_and_nonzero(command, case):
    args, message = (BAD_INVOCATIONS if command == "estimate" else HOST_BAD_INVOCATIONS)[case]
    result = CliRunner().invoke(main, [command, *args])
    assert result.exit_code == (4 if case == "dataset that raises" else 2)
    assert_exited_cleanly(result)
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(error_lines) == 1
    assert re.search(message, result.stderr.replace("\n", " ")), result.stderr


@pytest.mark.parametrize("case", list(COMMAND_BAD_INVOCATIONS))
def test_every_command_rejects_bad_input_in_one_line(case):
    args, exit_code, message = COMMAND_BAD_INVOCATIONS[case]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == exit_code, result.output
    assert_exited_cleanly(result)
    lines = [line for line in result.stderr.splitlines()
             if line.startswith(("Error", "DOES NOT FIT", "FIT UNKNOWN"))]
    assert len(lines) == 1
    assert re.search(message, result.stderr.replace("\n", " ")), result.stderr


def test_the_bad_input_tables_cover_at_least_25_cases():
    assert len(BAD_INVOCATIONS) + len(HOST_BAD_INVOCATIONS) + len(COMMAND_BAD_INVOCATIONS) >= 25


def test_json_report_has_the_documented_fields():
    result = CliRunner().invoke(main, ["estimate", *TINY_MLP, "--batch-size", "4", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    device = report["device"]
    for field in ("kind", "batch_size", "peak_bytes", "peak_allocated_bytes", "breakdown",
                  "top_modules"):
        assert field in device
    assert device["kind"] == "cuda" and device["batch_size"] == 4
    assert (sum(v for k, v in device["breakdown"].items() if k != "total_bytes")
            + device["workspace_bytes"] == device["peak_allocated_bytes"])
    assert device["peak_reserved_bytes"] >= device["peak_allocated_bytes"]
    assert (device["peak_bytes"] == device["total_bytes"]
            == device["peak_reserved_bytes"] + device["context_bytes"])
    assert report["assumptions"] and isinstance(report["unsupported"], list)


def test_seed_case_is_read_as_channels_last_and_rendered_in_iec_units():
    result = CliRunner().invoke(main, ["estimate", "--model", "resnet3d", "--shape",
                                       "834,224,834,3", "--model-arg", "depth=10"])
    assert result.exit_code == 0, result.output
    assert "channels-last" in result.output
    assert "(1, 3, 834, 224, 834)" in result.output
    assert "GiB" in result.output and "--details" in result.output


def test_gpus_lists_the_catalog_as_json():
    result = CliRunner().invoke(main, ["gpus", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    by_name = {row["name"]: row for row in rows}
    assert by_name["H100-80GB"]["memory_bytes"] == 81559 * 2**20
    assert by_name["T4"]["compute_capability"] == "7.5"


def test_plan_is_reported_and_the_report_is_made_at_the_planned_batch():
    args = ["estimate", *TINY_MLP, "--gpu-memory", "1GiB", "--headroom", "0", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    device = json.loads(result.stdout)["device"]
    best = device["max_batch_size"]
    assert device["batch_size"] == best > 8 and device["capacity_bytes"] == 2**30
    points = {point["batch_size"]: point for point in device["plan"]["points"]}
    # the next traced batch up does not fit: the next one, or within 1 % above 100 samples
    above = min(batch for batch, point in points.items() if not point["fits"])
    assert best < above <= best + max(1, best // 100)
    assert device["plan"]["confirmed"] is (above == best + 1)
    assert points[best]["fits"] and all(point["fits"] for batch, point in points.items()
                                        if batch < best)
    assert points[best]["total_bytes"] == device["total_bytes"] <= 2**30 < points[above]["total_bytes"]


def test_models_lists_every_zoo_entry():
    result = CliRunner().invoke(main, ["models", "--json"])
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert set(rows) == set(ZOO)
    assert rows["resnet50"]["parameter_count"] == 25_557_032


def test_console_entry_point_exits_nonzero_without_traceback():
    completed = subprocess.run([sys.executable, "-m", "memcalc", "estimate", "--model",
                                "nosuch"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 2
    assert "Traceback" not in completed.stderr
    assert completed.stderr.strip().startswith("Error: unknown model 'nosuch'")


@pytest.mark.slow
def test_a_check_that_does_not_fit_prints_one_line_after_planning_in_worker_processes():
    # its cheapest fixes come from a plan whose variants run in a process pool: the pool's
    # queues must not outlive the resource tracker (a traceback at exit, a process ended)
    completed = subprocess.run(
        [sys.executable, "-m", "memcalc", "check", "--model", "resnet50", "--batch-size", "4000",
         "--gpu", "A100-80GB", "--cpus", "8", "--ram", "64GiB", "--fixes"],
        capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
    assert completed.returncode == 1
    assert completed.stdout.startswith("DOES NOT FIT: batch 4000") or \
        completed.stderr.startswith("DOES NOT FIT: batch 4000")
    assert "cheapest fixes" in completed.stdout + completed.stderr
    assert "Traceback" not in completed.stderr and "Warning" not in completed.stderr
    assert len((completed.stdout + completed.stderr).strip().splitlines()) == 1


def test_host_reports_the_seed_arithmetic_as_json():
    result = CliRunner().invoke(main, ["host", "--shape", "834,224,834,3", "--batch-size", "2",
                                       "--cpus", "64", "--ram", "188GB", "--json"])
    assert result.exit_code == 0, result.output
    host = json.loads(result.stdout)
    for field in ("per_worker_bytes", "main_process_bytes", "peak_bytes", "max_num_workers",
                  "recommended_num_workers", "measured", "spec", "sbatch", "assumptions"):
        assert field in host
    assert host["measured"] is False and host["spec"]["machine"]["cpus"] == 64
    main_terms = {t["name"]: t["total_bytes"] for t in host["main_terms"]}
    # at the epoch start the main process holds a batch while every worker collates
    at_epoch_start = sum(main_terms.values()) + host["num_workers"] * host["per_worker_bytes"]
    assert host["peak_bytes"] == host["epoch_start_bytes"] == at_epoch_start


def test_estimate_with_a_dataset_reads_the_shape_from_its_first_item():
    args = ["estimate", "--model", "mlp", "--model-arg", "in_features=64", "--device", "cpu",
            "--dataset", "tests.fixtures.host_datasets:python_objects", "--probe-seconds", "5", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["input"]["traced_batch_shape"] == [1, 64]
    host = report["host"]
    assert host["measured"] and host["spec"]["sample_shape"] == [64]
    assert host["measurement"]["dataset_bytes"] > 50 * 2**20


def test_plan_needs_a_gpu_and_says_so_in_one_line():
    result = CliRunner().invoke(main, ["plan", *TINY_MLP])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("Error: the strategy planner needs a GPU for capacity and "
                                     "speed: give --gpu (see `memcalc gpus`)")


def test_plan_emits_the_launch_line_of_the_recommendation():
    args = ["plan", *TINY_MLP, "--gpu", "T4", "--gpus", "4", "--cpus", "8", "--ram", "64GB",
            "--rank-traces", "0"]     # the launch files, not the traced ranks
    torchrun = CliRunner().invoke(main, [*args, "--emit", "torchrun"])
    assert torchrun.exit_code == 0, torchrun.output
    assert torchrun.stdout.strip() == "torchrun --nnodes=1 --nproc-per-node=4 --standalone train.py"
    slurm = CliRunner().invoke(main, [*args, "--emit", "slurm"]).stdout.splitlines()
    assert slurm[0] == "#!/bin/bash" and "#SBATCH --gres=gpu:4" in slurm
    assert "#SBATCH --cpus-per-task=8" in slurm    # 4 processes × (1 worker + 1) on 8 CPUs
    plan = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    assert plan["recommended"] and {c["strategy"] for c in plan["candidates"]} >= {
        "baseline", "ddp", "fsdp", "pipeline"}


def test_a_forced_strategy_that_does_not_apply_exits_1_with_the_reason():
    args = ["plan", *TINY_MLP, "--gpu", "T4", "--strategy", "spatial", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    plan = json.loads(result.stdout)
    assert plan["recommended"] is None
    assert plan["reason"] == ("--strategy spatial is not applicable here: it has no convolutions "
                              "over the sample's spatial axes")


@pytest.mark.slow
def test_feed_compares_measured_and_predicted_utilization():
    args = ["feed", "--dataset", "tests.fixtures.host_datasets:spin_samples", "--step-time", "0.02",
            "--batch-size", "2", "--workers", "0,1", "--batches", "6", "--cpus", "2", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    check = json.loads(result.stdout)
    assert [row["num_workers"] for row in check["rows"]] == [0, 1]
    assert 0.005 < check["seconds_per_sample"] < 0.02
    bad = CliRunner().invoke(main, ["feed", "--dataset", "x:y", "--step-time", "1",
                                    "--workers", "one"])
    assert bad.exit_code == 2 and "'--workers': must be counts separated by commas" in bad.stderr


@pytest.mark.slow
def test_estimate_prints_the_feeding_verdict():
    args = ["estimate", "--model", "resnet50", "--shape", "3,32,32", "--batch-size", "128",
            "--gpu", "A100-80GB", "--sample-time", "0.002", "--cpus", "2", "--ram", "16GiB"]
    result = CliRunner().invoke(main, args, terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "CPU-bound" in result.output and "workers needed" in result.output


def test_a_named_profile_and_the_cudnn_options_reach_the_report():
    args = ["estimate", "--model", "resnet3d", "--model-arg", "depth=10", "--shape",
            "3,8,32,32", "--batch-size", "2", "--json", "--env-profile", "h100-torch2.11-cu130"]
    plain = json.loads(CliRunner().invoke(main, args).stdout)
    assert plain["device"]["env_profile"] == "h100-torch2.11-cu130"
    assert plain["device"]["cudnn_calls"] > 0
    assert any("h100-torch2.11-cu130" in line for line in plain["assumptions"])
    searched = json.loads(CliRunner().invoke(main, [*args, "--cudnn-benchmark"]).stdout)
    assert searched["spec"]["cudnn_benchmark"] is True
    assert searched["device"]["peak_allocated_bytes"] >= plain["device"]["peak_allocated_bytes"]
    expandable = json.loads(CliRunner().invoke(
        main, [*args, "--allocator-conf", "expandable_segments:True"]).stdout)
    assert expandable["device"]["peak_reserved_bytes"] <= plain["device"]["peak_reserved_bytes"]
    assert any("expandable_segments:True" in line for line in expandable["assumptions"])


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_calibrate_without_a_gpu_is_one_line_and_exit_1():
    result = CliRunner().invoke(main, ["calibrate"])
    assert result.exit_code == 1
    assert_exited_cleanly(result)
    assert result.stderr.strip().startswith("Error: no CUDA GPU is visible here")


def test_calibrate_writes_the_profile_estimates_then_use(monkeypatch, tmp_path):
    from memcalc.calibration import run
    from memcalc.device.env_profile import builtin_profile

    measured = builtin_profile("h100-torch2.11-cu130.json").model_copy(update={"name": "mine"})
    monkeypatch.setattr(run, "calibrate", lambda name, progress: measured)
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(main, ["calibrate", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "profile 'mine' written to" in result.stdout and "cuDNN workspace rules" in result.stdout
    report = json.loads(CliRunner().invoke(main, ["estimate", *TINY_MLP, "--json",
                                                  "--env-profile", str(out)]).stdout)
    assert report["device"]["env_profile"] == "mine"


def test_a_launch_file_from_a_static_plan_is_flagged_and_exits_fit_unknown():
    result = CliRunner().invoke(main, ["plan", "--model", "tests.fixtures.models:untraceable",
                                       "--shape", "8", "--gpu", "T4", "--max-gpus", "2",
                                       "--cpus", "2", "--ram", "8GiB", "--emit", "slurm"])
    assert_exited_cleanly(result)
    assert result.exit_code == 3        # a `plan --emit ... > job.sh && sbatch job.sh` stops
    assert result.stdout.startswith("#!/bin/bash")
    assert "FIT UNKNOWN (STATIC): STATIC ESTIMATE, NOT TRACED" in result.stderr


def test_version_is_the_installed_distributions():
    from importlib.metadata import version

    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"memcalc, version {version('torch-memcalc')}"
