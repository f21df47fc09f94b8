"""``--spec FILE``: a report's spec round-trips through a file, the command line overrides
the file, a node is taken whole, and a bad file is one Error: line (exit 2)."""

import json

import pytest
from click.testing import CliRunner

from memcalc.cli.commands import main

TINY = ["--model", "mlp", "--model-arg", "in_features=64", "--model-arg", "hidden=128",
        "--shape", "64"]
TOML = """
model = "mlp"
model_args = { in_features = 64, hidden = 128 }
sample_shape = [64]
gpu = "T4"
precision = "bf16-mixed"
batch_size = 16

[machine]
cpus = 8
ram_bytes = 68719476736
"""


def _json(args):
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture()
def toml_file(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(TOML)
    return str(path)


@pytest.mark.parametrize("whole_report", [False, True])
def test_an_estimates_spec_round_trips_through_a_file(tmp_path, whole_report):
    first = _json(["estimate", *TINY, "--gpu", "T4", "--precision", "bf16-mixed",
                   "--cpus", "4", "--ram", "16GiB", "--num-workers", "2"])
    path = tmp_path / "job.json"
    path.write_text(json.dumps(first if whole_report else first["spec"]))
    again = _json(["estimate", "--spec", str(path)])
    assert again["spec"] == first["spec"]
    assert again["device"]["total_bytes"] == first["device"]["total_bytes"]
    assert again["host"]["peak_bytes"] == first["host"]["peak_bytes"]


def test_the_file_sets_the_job_and_the_command_line_overrides_it(toml_file):
    spec = _json(["estimate", "--spec", toml_file])["spec"]
    assert (spec["model"], spec["precision"], spec["batch_size"]) == ("mlp", "bf16-mixed", 16)
    assert spec["machine"] == {"cpus": 8, "ram_bytes": 64 << 30, "mem_per_cpu_bytes": None,
                               "shm_bytes": 32 << 30, "shm_assumed": True, "source": "given",
                               "node_processes": 1}
    # an option given explicitly wins even when it is the option's default
    spec = _json(["estimate", "--spec", toml_file, "--precision", "fp32", "--batch-size", "2",
                  "--cpus", "2", "--ram", "4GiB"])["spec"]
    assert (spec["precision"], spec["batch_size"]) == ("fp32", 2)
    assert (spec["machine"]["cpus"], spec["machine"]["ram_bytes"]) == (2, 4 << 30)


def test_check_plan_and_host_take_the_same_file(toml_file):
    check = CliRunner().invoke(main, ["check", "--spec", toml_file])
    assert check.exit_code == 0 and check.stdout.startswith("FITS: batch 16 needs ")
    plan = _json(["plan", "--spec", toml_file, "--gpus", "2"])
    assert plan["cluster"]["gpus_per_node"] == 2 and plan["recommended"]
    host = _json(["host", "--spec", toml_file])
    assert host["spec"]["sample_shape"] == [64] and host["spec"]["batch_size"] == 16
    assert host["spec"]["machine"]["cpus"] == 8 and host["spec"]["cuda"] is True


@pytest.mark.parametrize("name, text, message", [
    ("job.toml", TOML + 'precison = "fp32"\n',
     "unknown field \"machine['precison']\"; did you mean 'precision'?"),
    ("job.toml", 'model = "mlp"\nprecison = "fp32"\n',
     "unknown field 'precison'; did you mean 'precision'?"),
    ("job.toml", "model = \n", "not valid TOML"),
    ("job.json", "[1, 2]", "the file must hold a table of spec fields"),
    ("job.yaml", "model: mlp", "name a .toml or .json file"),
    ("job.json", '{"model": "mlp", "batch_size": 0}', "batch_size=0: Input should be greater"),
])
def test_a_bad_file_is_one_error_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    result = CliRunner().invoke(main, ["estimate", "--spec", str(path), "--shape", "64"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"Error: --spec {path}: ") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_without_a_model_anywhere_the_error_names_both_ways(tmp_path):
    missing = CliRunner().invoke(main, ["estimate", "--shape", "64"])
    assert missing.exit_code == 2
    assert missing.stderr.strip() == ("Error: --model is missing: give --model NAME, or a "
                                      "--spec file that names the model")
    unreadable = CliRunner().invoke(main, ["estimate", "--spec", str(tmp_path / "none.toml")])
    assert unreadable.exit_code == 2 and "cannot read it (FileNotFoundError" in unreadable.stderr
