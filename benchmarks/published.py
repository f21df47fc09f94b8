"""Accuracy against published real GPU measurements. Prints the error table and writes
benchmarks/results-published.md.

    python -m benchmarks.published
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from benchmarks.published_cases import PUBLISHED_CASES, PublishedCase
from benchmarks.results import publish
from memcalc.pipeline import estimate

RESULTS = Path(__file__).with_name("results-published.md")
MIB = 2**20


def predicted(case: PublishedCase) -> dict[str, int]:
    device = estimate(case.spec).device
    return {"allocated": device.peak_allocated_bytes, "reserved": device.peak_reserved_bytes,
            "nvidia-smi": device.total_bytes}


def error_rows(case: PublishedCase, prediction: dict[str, int]) -> list[tuple[str, int, int, float]]:
    measured = {"allocated": case.allocated_bytes, "reserved": case.reserved_bytes,
                "nvidia-smi": case.nvidia_smi_bytes}
    return [(figure, measured[figure], prediction[figure],
             100 * (prediction[figure] - measured[figure]) / measured[figure])
            for figure in measured if measured[figure] is not None]


def main() -> None:
    lines = ["| case | hardware | figure | measured | predicted | error |",
             "|---|---|---|---:|---:|---:|"]
    start = time.perf_counter()
    for case in PUBLISHED_CASES:
        for figure, measured, guess, error in error_rows(case, predicted(case)):
            lines.append(f"| {case.name} | {case.hardware} | {figure} | {measured / MIB:,.0f} MiB "
                         f"| {guess / MIB:,.0f} MiB | {error:+.1f} % |")
    lines += ["", f"memcalc on torch {torch.__version__}, {time.perf_counter() - start:.0f} s "
              "for all cases. Sources and setups: benchmarks/published_cases.py."]
    publish(RESULTS, "Published real-GPU measurements vs memcalc", lines)


if __name__ == "__main__":
    main()
