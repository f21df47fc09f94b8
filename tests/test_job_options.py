"""The distributed job's options on the command line: each mistake is one Error line, exit 2."""

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from memcalc.cli.commands import main
from tests.fixtures.cli import assert_exited_cleanly

TINY = ["--model", "gpt2", "--model-arg", "vocab=1000", "--model-arg", "n_positions=64",
        "--model-arg", "dim=64", "--model-arg", "depth=2", "--model-arg", "heads=4",
        "--shape", "64", "--batch-size", "2", "--device", "cpu"]

MISTAKES = {
    "gpus without a strategy": (["--gpus", "8"],
                                r"--gpus needs --strategy \(ddp, zero1, zero2, fsdp or pipeline\)"),
    "strategy without gpus": (["--strategy", "fsdp"], r"--strategy fsdp needs --gpus"),
    "tp without a strategy": (["--tp", "2"], r"--tp 2 needs --strategy and --gpus"),
    "tp not dividing the gpus": (["--strategy", "fsdp", "--gpus", "6", "--tp", "4"],
                                 r"--tp 4 does not divide the 6 GPUs"),
    "param dtype with ddp": (["--strategy", "ddp", "--gpus", "2", "--param-dtype", "bfloat16"],
                             r"FSDP2's mixed-precision policy"),
    "ddp's options with fsdp": (["--strategy", "fsdp", "--gpus", "2", "--bucket-view",
                                 "--bucket-cap-mb", "5"],
                                r"--bucket-view, --bucket-cap-mb: options of DDP .* does not wrap"),
    "bucket view with zero2": (["--strategy", "zero2", "--gpus", "2", "--bucket-view"],
                               r"--bucket-view: options of DDP"),
    "static graph with fsdp": (["--strategy", "fsdp", "--gpus", "2", "--static-graph"],
                               r"--static-graph: options of DDP"),
    "ddp with tensor parallel": (["--strategy", "ddp", "--gpus", "4", "--tp", "2"],
                                 r"DDP with tensor parallelism is not traced"),
    "spatial split with a strategy": (["--strategy", "fsdp", "--gpus", "2", "--spatial-parts",
                                       "2"], r"--spatial-parts with --strategy"),
    "cp without a strategy": (["--cp", "2"], r"--cp 2 needs --strategy and --gpus"),
    "cpu offload with ddp": (["--strategy", "ddp", "--gpus", "2", "--cpu-offload"],
                             r"--cpu-offload is FSDP2's CPUOffloadPolicy; --strategy ddp "
                             r"does not shard with FSDP2: use --strategy fsdp or zero2"),
    "cpu offload without a gpu": (["--strategy", "fsdp", "--gpus", "2", "--cpu-offload",
                                   "--device", "cpu"],
                                  r"--cpu-offload moves .* with --device cpu there is no GPU"),
    "cp with ddp": (["--strategy", "ddp", "--gpus", "4", "--cp", "2"],
                    r"--cp with --strategy ddp is not traced: .*use --strategy fsdp or zero2"),
    "cp not dividing the gpus": (["--strategy", "fsdp", "--gpus", "6", "--cp", "4"],
                                 r"--cp 4 × --tp 1 × --pp 1 does not divide the 6 GPUs"),
    "cp with a pipeline": (["--strategy", "fsdp", "--gpus", "4", "--cp", "2", "--pp", "2"],
                           r"--cp with --pp is not traced"),
    "cp on a sequence that does not split": (["--strategy", "fsdp", "--gpus", "4", "--cp", "4",
                                              "--shape", "36"],
                                             r"--cp 4: the sequence length 36 does not split "
                                             r"into 2 × 4 .* multiple of 8"),
    "cp on a model without attention": (["--model", "tests.fixtures.models:tiny_mlp",
                                         "--shape", "8,8", "--strategy", "fsdp", "--gpus",
                                         "2", "--cp", "2"],
                                        r"--cp: the model ran no .*drop --cp"),
    "model without a tensor plan": (["--model", "mlp", "--shape", "1024", "--strategy", "fsdp",
                                     "--gpus", "2", "--tp", "2"], r"--tp: .*drop --tp"),
}


@pytest.mark.parametrize("case", list(MISTAKES))
def test_a_mistake_is_one_error_line(case):
    extra, message = MISTAKES[case]
    args = ["estimate", *TINY, *extra] if extra[0] != "--model" else \
        ["estimate", "--device", "cpu", "--batch-size", "2", *extra]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert_exited_cleanly(result)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and re.search(message, result.stderr.replace("\n", " "))


@pytest.mark.parametrize("model, shape, why", [
    ("mlp", "1024", "input split on axis 1 before any attention ran"),
    ("tests.fixtures.models:attention_with_dropout", "64,64",
     "traced for causal attention without a mask .* has is_causal=False")])
def test_a_model_context_parallelism_cannot_run_is_a_static_answer_that_says_why(model, shape,
                                                                              why):
    """The MLP's features (axis 1) split by --cp: its first layer refuses them before any
    attention ran (memcalc cannot tell a model without a sequence from one it fails on). A
    bidirectional attention: torch's load-balanced ring needs a causal one. Either way the
    trace fails with the reason and the answer is the static count, said so."""
    result = CliRunner().invoke(main, ["estimate", "--device", "cpu", "--batch-size", "2",
                                       "--model", model, "--shape", shape, "--strategy",
                                       "fsdp", "--gpus", "2", "--cp", "2", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["device"]["method"] != "traced"
    assert any(re.search(why, line) for line in report["unsupported"])


def test_the_json_report_carries_the_layout_and_one_rank():
    result = CliRunner().invoke(main, ["estimate", *TINY, "--strategy", "zero1", "--gpus", "4",
                                       "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["spec"]["parallel"]["strategy"] == "zero1"
    assert report["spec"]["parallel"]["gpus_per_node"] == 4
    assert report["device"]["method"] == "traced"


def test_ddps_options_reach_the_traced_rank_and_its_head():
    result = CliRunner().invoke(main, ["estimate", *TINY, "--strategy", "ddp", "--gpus", "2",
                                       "--bucket-cap-mb", "0.5", "--bucket-view",
                                       "--static-graph"])
    assert result.exit_code == 0, result.output
    head = " ".join(result.stdout.replace("│", " ").split())      # the panel's lines joined
    assert ("ddp on 2 GPUs, gradient_as_bucket_view, static_graph, buckets of 0.5 MiB"
            in head)
    assert "can be LOW" not in head     # the reducer's flags are read back as it set them


def test_the_wrappers_print_nothing_before_the_verdict():
    """FSDP2 warns about views of a wrapped module's output; the first line stays memcalc's
    (a real process: pytest would catch the warning itself)."""
    vit = ["--model", "vit_b16", "--shape", "3,32,32", "--batch-size", "2", "--device", "cpu",
           *[item for arg in ("image_size=32", "dim=64", "depth=2", "heads=4", "num_classes=100")
             for item in ("--model-arg", arg)]]
    result = subprocess.run([sys.executable, "-m", "memcalc", "estimate", *vit, "--strategy",
                             "fsdp", "--gpus", "4", "--tp", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0].startswith("CPU training: batch 2 per GPU")
    assert "Warning" not in result.stderr, result.stderr
