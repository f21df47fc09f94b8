"""Core benchmark: estimator speed/RSS on the zoo and the seed case, and accuracy against
real CPU runs. Prints tables and writes benchmarks/results-core.md.

    python -m benchmarks.core
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from tests.fixtures.cases import CPU_CONV_CASES, CPU_TRUTH_CASES
from tests.fixtures.cpu_truth import measure_spec_cpu_peak
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.units import format_bytes
from models_zoo import ZOO

RESULTS = Path(__file__).with_name("results-core.md")


def cli_run(args: list[str]) -> tuple[float, int, dict]:
    """Wall seconds, max RSS bytes of a fresh `memcalc estimate --json` process, report.

    Linux keeps a child's peak RSS across exec, so call this while the caller is still small."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "memcalc", "estimate", *args, "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    stdout = process.stdout.read()
    _, status, usage = os.wait4(process.pid, 0)     # this child's own peak RSS
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"memcalc estimate {' '.join(args)} failed")
    return wall, usage.ru_maxrss * 1024, json.loads(stdout)


def speed_rows() -> list[list[str]]:
    cases = [("seed: resnet3d 834,224,834,3 b=1", ["--model", "resnet3d", "--shape", "834,224,834,3"]),
             ("seed: resnet3d 834,224,834,3 b=2", ["--model", "resnet3d", "--shape", "834,224,834,3",
                                                   "--batch-size", "2"])]
    cases += [(f"{name} default shape b=1", ["--model", name]) for name in ZOO]
    return cli_rows(cases)


def cli_rows(cases: list[tuple[str, list[str]]]) -> list[list[str]]:
    """Label, predicted total, wall seconds and peak RSS of a fresh CLI run per case."""
    rows = []
    for label, args in cases:
        wall, rss, report = cli_run(args)
        rows.append([label, format_bytes(report["device"]["peak_bytes"]), f"{wall:.2f}",
                     format_bytes(rss)])
    return rows


def accuracy_rows(cases: dict) -> list[list[str]]:
    rows = []
    for label, fields in cases.items():
        spec = TrainingSpec(device="cpu", **fields)
        report = estimate(spec)
        truth = measure_spec_cpu_peak(spec, report.input.traced_batch_shape)
        error = 100 * (report.device.peak_bytes - truth) / truth
        rows.append([label, f"{truth:,}", f"{report.device.peak_bytes:,}", f"{error:+.2f} %"])
    return rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def main() -> None:
    torch.set_num_threads(1)
    speed = markdown_table(["case", "predicted nvidia-smi total (reserved + context)", "wall s (whole CLI run)", "max RSS"],
                           speed_rows())
    header = ["case", "real CPU peak (B)", "memcalc --device cpu (B)", "error"]
    linear = markdown_table(header, accuracy_rows(CPU_TRUTH_CASES))
    conv = markdown_table(header, accuracy_rows(CPU_CONV_CASES))
    text = "\n\n".join([
        "# memcalc core benchmark",
        f"Measured {datetime.date.today()} on {platform.machine()} with "
        f"{torch.get_num_threads()} torch thread(s), Python {platform.python_version()}, "
        f"torch {torch.__version__}. Regenerate with `python -m benchmarks.core`.",
        "## Speed and memory of the estimator (fresh process each, incl. torch import)",
        speed,
        "## Accuracy against real CPU runs (profiler memory timeline): linear, attention, "
        "ATen's own convolutions",
        linear,
        "## Convolutional models on CPU (oneDNN's scratch is not traced)",
        conv,
    ]) + "\n"
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
