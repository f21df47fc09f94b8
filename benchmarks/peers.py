"""memcalc next to what users would use instead: accuracy against real measurements, speed,
and how the estimator's cost scales. Prints the tables and writes benchmarks/results.md.

    python -m benchmarks.peers        (about 5 minutes on 2 CPUs)
"""

from __future__ import annotations

import datetime
import math
import platform
import statistics
import time
from pathlib import Path

import torch

from tests.fixtures.cases import CPU_CONV_CASES, CPU_TRUTH_CASES
from benchmarks.core import cli_rows, markdown_table
from benchmarks.peer_tools import (
    accelerate_rule,
    deepspeed_zero2_states,
    mem_tracker_peak,
    torchinfo_total,
)
from tests.fixtures.published_cases import PUBLISHED_CASES
from benchmarks.results import publish
from tests.fixtures.cpu_truth import measure_spec_cpu_peak
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from memcalc.units import format_bytes
from models_zoo import ZOO

RESULTS = Path(__file__).with_name("results.md")
TOOLS = ("memcalc", "torchinfo", "accelerate ×4", "DeepSpeed ZeRO-2", "MemTracker (real run)")


def _timed(function, *args):
    start = time.perf_counter()
    value = function(*args)
    return value, time.perf_counter() - start


def truth_rows(errors: dict[str, list[float]], times: dict[str, list[float]]) -> list[list[str]]:
    rows = []
    for name, fields in {**CPU_TRUTH_CASES, **CPU_CONV_CASES}.items():
        spec = TrainingSpec(device="cpu", **fields)
        report, seconds = _timed(estimate, spec)
        shape = tuple(report.input.traced_batch_shape)
        truth = measure_spec_cpu_peak(spec, shape)
        values = {"memcalc": (report.device.peak_bytes, seconds)}
        values["torchinfo"] = _timed(torchinfo_total, spec, shape)
        values["accelerate ×4"] = _timed(accelerate_rule, spec)
        values["DeepSpeed ZeRO-2"] = _timed(deepspeed_zero2_states, spec)
        values["MemTracker (real run)"] = _timed(mem_tracker_peak, spec, shape)
        row = [name, f"{truth:,}"]
        for tool in TOOLS:
            value, seconds = values[tool]
            error = 100 * (value - truth) / truth
            errors[tool].append(abs(error))
            times[tool].append(seconds)
            row.append(f"{value:,} ({error:+.1f} %)")
        rows.append(row)
    return rows


def published_rows() -> list[list[str]]:
    rows = []
    for case in PUBLISHED_CASES:
        report = estimate(case.spec)
        device = report.device
        truth, ours = ((case.reserved_bytes, device.peak_reserved_bytes) if case.reserved_bytes
                       else (case.nvidia_smi_bytes, device.total_bytes))
        shape = tuple(report.input.traced_batch_shape)
        values = [ours, torchinfo_total(case.spec, shape),
                  accelerate_rule(case.spec), deepspeed_zero2_states(case.spec)]
        rows.append([case.name, case.hardware, format_bytes(truth)] + [
            f"{format_bytes(v)} ({100 * (v - truth) / truth:+.1f} %)" for v in values])
    return rows


def zoo_rows() -> list[list[str]]:
    rows = []
    for name in ZOO:
        for batch in (1, 8):
            spec = TrainingSpec(model=name, batch_size=batch)
            report, seconds = _timed(estimate, spec)
            shape = tuple(report.input.traced_batch_shape)
            info, info_s = _timed(torchinfo_total, spec, shape)
            planned = estimate(spec.with_changes(batch_size=None, gpu="A100-80GB")).device
            best = planned.max_batch_size or 0
            search = (math.ceil(math.log2(best + 1)) * 2) if best else 1
            rows.append([name, str(batch), format_bytes(report.device.peak_bytes),
                         f"{seconds:.2f}", format_bytes(info), f"{info_s:.2f}",
                         format_bytes(accelerate_rule(spec)), str(best), str(search)])
    return rows


def scaling_rows() -> list[list[str]]:
    cases = [(f"resnet3d seed volume, batch {b}", ["--model", "resnet3d", "--shape",
                                                    "834,224,834,3", "--batch-size", str(b)])
             for b in (1, 8, 64)]
    cases += [(f"{name} ({label}), batch 1", ["--model", name]) for name, label in
              (("mlp", "1 M"), ("gpt2", "124 M"), ("bert_large", "335 M"), ("llama_7b", "6.7 B"))]
    return cli_rows(cases)


def main() -> None:
    torch.set_num_threads(1)
    scaling = scaling_rows()    # first: a child's peak RSS includes what it forked from us
    errors = {tool: [] for tool in TOOLS}
    times = {tool: [] for tool in TOOLS}
    truth = truth_rows(errors, times)
    summary = [[tool, f"{statistics.median(errors[tool]):.1f} %", f"{max(errors[tool]):.1f} %",
                f"{statistics.median(times[tool]) * 1e3:.1f} ms"] for tool in TOOLS]
    ratio = statistics.median(times["memcalc"]) / statistics.median(times["torchinfo"])
    lines = [
        f"Measured {datetime.date.today()} on {platform.machine()}, {torch.get_num_threads()} "
        f"torch thread, Python {platform.python_version()}, torch {torch.__version__}. "
        "Regenerate with `python -m benchmarks.peers`; nothing here is written by hand.",
        "", "## Against real CPU training steps (profiler memory timeline; value and error)", "",
        markdown_table(["case", "truth (B)", *TOOLS], truth), "",
        "## Summary over the CPU-truth cases", "",
        markdown_table(["tool", "median |error|", "worst |error|", "median time per estimate"],
                       summary), "",
        f"memcalc takes {ratio:.1f}× torchinfo's time in the same process: it runs the whole "
        "step twice (forward, backward, optimizer), torchinfo one forward.", "",
        "## Against published GPU measurements (max_memory_reserved where published, else "
        "nvidia-smi, compared with memcalc's matching figure)", "",
        markdown_table(["case", "hardware", "measured", "memcalc", "torchinfo", "accelerate ×4",
                        "DeepSpeed ZeRO-2"], published_rows()), "",
        "## Zoo models at two batch sizes (no truth: what each tool says, how long it takes)",
        "",
        markdown_table(["model", "batch", "memcalc (CUDA total)", "memcalc s", "torchinfo",
                        "torchinfo s", "accelerate ×4", "largest batch on A100-80GB",
                        "real steps a doubling + bisection search needs"], zoo_rows()), "",
        "## Cost of the estimate against batch size and model size (fresh process each)", "",
        markdown_table(["case", "predicted", "wall s (incl. torch import)", "max RSS"], scaling),
    ]
    publish(RESULTS, "memcalc and the tools users would use instead", lines)


if __name__ == "__main__":
    main()
