"""memcalc against training steps measured on a real GPU (benchmarks/gpu_data/).

    python -m benchmarks.gpu            compare the stored measurements; write results-gpu.md
    python -m benchmarks.gpu --measure  on a CUDA machine: measure again first (~6 min on one
                                        H100; benchmarks.gpu_measure), then compare

Measured: ``max_memory_allocated``, ``max_memory_reserved`` and NVML's bytes for the process
(nvidia-smi's figure: what lies outside the allocator plus the reserved peak). Predicted: the
same step traced on this machine's CPU with the built-in H100 environment profile, whose
cuDNN rules were fitted to each convolution net's first size only; the second sizes are held
out. Also: the allocator model replaying the real allocation histories (step times:
``benchmarks.step_time``).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.fixtures import gpu_data
from tests.fixtures.gpu_compare import FIGURES, case_errors, is_conv_net, measured_figures, replay_error
from tests.fixtures.gpu_profile import fitted_case
from benchmarks.results import publish

RESULTS = Path(__file__).with_name("results-gpu.md")
MIB = 2**20


def _medians(rows: list[tuple[str, dict[str, float]]]) -> str:
    return " / ".join(f"{statistics.median(abs(errors[f]) for _, errors in rows):.1f} %"
                      for f in FIGURES)


def _step_lines(cases) -> tuple[list[str], list[tuple[str, dict[str, float]]]]:
    lines = ["| case | fit or held out | allocated | reserved | nvidia-smi | measured (alloc / reserved / smi) |",
             "|---|---|---:|---:|---:|---:|"]
    rows = []
    for case, row in cases:
        errors = case_errors(case, row)
        rows.append((case.name, errors))
        measured = measured_figures(row)
        lines.append(f"| {case.name} | {'fit' if fitted_case(case.name) else 'held out'} | "
                     + " | ".join(f"{errors[f]:+.1f} %" for f in FIGURES) + " | "
                     + " / ".join(f"{measured[f] / MIB:,.0f}" for f in FIGURES) + " MiB |")
    return lines, rows


def report_lines() -> list[str]:
    cases = gpu_data.measured_cases()
    steps = gpu_data.steps()
    versions = steps["versions"]
    table, rows = _step_lines(cases)
    conv_names = {case.name for case, _ in cases if is_conv_net(case)}
    conv = [(n, e) for n, e in rows if n in conv_names]
    held = [(n, e) for n, e in conv if not fitted_case(n)]
    lines = [f"Measured on {versions['gpu']}, driver {versions['driver']}, torch {versions['torch']}, "
             f"CUDA {versions['cuda']}, cuDNN {versions['cudnn']}; predicted with the built-in "
             f"profile `{gpu_data.PROFILE}`. Errors are (predicted - measured) / measured.", "",
             "| cases | n | median abs. error: allocated / reserved / nvidia-smi |", "|---|---:|---|",
             f"| convolution nets, all | {len(conv)} | {_medians(conv)} |",
             f"| convolution nets, held out (second sizes) | {len(held)} | {_medians(held)} |",
             f"| convolution nets, fp32 (TF32 on and off) | "
             f"{len([n for n, _ in conv if 'fp32' in n])} | "
             f"{_medians([(n, e) for n, e in conv if 'fp32' in n])} |",
             f"| convolution nets, cudnn.benchmark | {len([n for n, _ in conv if 'bench' in n])} | "
             f"{_medians([(n, e) for n, e in conv if 'bench' in n])} |",
             f"| ViT-B/16 and GPT-2 | {len(rows) - len(conv)} | "
             f"{_medians([(n, e) for n, e in rows if n not in dict(conv)])} |", ""]
    replays = [replay_error(history) for history in gpu_data.traces().values()]
    lines += ["Allocator model over the real allocation histories of the same steps: reserved "
              f"peak within {statistics.median(abs(e) for e in replays):.1f} % (median), "
              f"{max(abs(e) for e in replays):.1f} % at worst, {len(replays)} histories.", ""]
    lines += ["Step times of the same steps against memcalc's per-kernel model: "
              "results-step-time.md (`python -m benchmarks.step_time`).", ""]
    lines += ["", *_largest_lines(), *table]
    return lines


def largest_rows() -> list[tuple[dict, int]]:
    """Each measured largest batch with memcalc's plan for the same allocator budget."""
    from tests.fixtures.gpu_budget import planned_in_measured_budget

    return [(row, planned_in_measured_budget(row)) for row in gpu_data.largest()["rows"]]


def _largest_lines() -> list[str]:
    stored = gpu_data.largest()
    rows = largest_rows()
    versions = stored["versions"]
    on_spot = sum(row["true"] - 1 <= planned <= row["true"] for row, planned in rows)
    above = [(planned - row["true"]) / row["true"] * 100 for row, planned in rows
             if planned > row["true"]]
    lines = [f"Largest batch on emulated cards ({stored['hardware']}; torch {versions['torch']}, "
             f"cuDNN {versions['cudnn']}, driver {versions['driver']}; {stored['measured']}). "
             "The allocator was capped at what the card leaves it; memcalc planned for the same "
             f"budget. Equal or one below: {on_spot} of {len(rows)}; above: {len(above)} "
             f"(at most {max(above, default=0.0):.1f} %).",
             "", "| model | card | planned | true | planned / true |", "|---|---|---:|---:|---:|"]
    for row, planned in rows:
        true = f"{row['true']}" if row["exact"] else f"{row['true']}-{row['true_below'] - 1}"
        lines.append(f"| {row['model']} {row['precision']} | {row['card']} | {planned} | {true} | "
                     f"{planned / row['true']:.3f} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true",
                        help="measure on this machine's GPU first and store the result")
    args = parser.parse_args(argv)
    if args.measure:
        out = Path("benchmarks/out/gpu")
        subprocess.run([sys.executable, "-m", "benchmarks.gpu_measure", "--out", str(out)],
                       check=True)
        gpu_data.import_run(out)
    start = time.perf_counter()
    lines = report_lines()
    lines += ["", f"memcalc on this machine's CPU: {time.perf_counter() - start:.0f} s. Cases: "
              "tests/fixtures/gpu_cases.py; measured data: benchmarks/gpu_data/."]
    publish(RESULTS, "Real GPU training steps vs memcalc", lines)


if __name__ == "__main__":
    main()
