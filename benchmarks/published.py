"""Accuracy against published real GPU measurements. Prints the error table and writes
benchmarks/results-published.md.

    python -m benchmarks.published
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tests.fixtures.published_cases import PUBLISHED_CASES
from tests.fixtures.published_compare import error_rows, predicted
from benchmarks.results import publish

RESULTS = Path(__file__).with_name("results-published.md")
MIB = 2**20


def main() -> None:
    lines = ["| case | hardware | figure | measured | predicted | error |",
             "|---|---|---|---:|---:|---:|"]
    start = time.perf_counter()
    for case in PUBLISHED_CASES:
        for figure, measured, guess, error in error_rows(case, predicted(case)):
            lines.append(f"| {case.name} | {case.hardware} | {figure} | {measured / MIB:,.0f} MiB "
                         f"| {guess / MIB:,.0f} MiB | {error:+.1f} % |")
    lines += ["", f"memcalc on torch {torch.__version__}, {time.perf_counter() - start:.0f} s "
              "for all cases. Sources and setups: tests/fixtures/published_cases.py."]
    publish(RESULTS, "Published real-GPU measurements vs memcalc", lines)


if __name__ == "__main__":
    main()
