"""How long the commands take, as ratios to `import torch` in a fresh process (the floor any
torch tool pays), with the traces each made. Median of 3 fresh processes per command, on an
idle machine. Prints the table and writes benchmarks/results-cli-speed.md.

    python -m benchmarks.cli_speed

Targets: `estimate` of a zoo model within 5 s beyond `import torch`; `check` of a batch that
clearly fits in one trace, of one that does not in two (`--fixes` searches the largest batch
and plans the fixes); `plan --emit` no slower than the plan it prints from.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.results import publish

RESULTS = Path(__file__).with_name("results-cli-speed.md")
RUNS = 3
COMMANDS = [
    ("estimate resnet50 (five cards)", ["estimate", "--model", "resnet50"]),
    ("estimate resnet50 --gpu A100-80GB", ["estimate", "--model", "resnet50", "--gpu",
                                           "A100-80GB"]),
    ("estimate resnet50 --batch-size 32 --gpu A100-80GB", [
        "estimate", "--model", "resnet50", "--batch-size", "32", "--gpu", "A100-80GB"]),
    ("estimate resnet3d (five cards)", ["estimate", "--model", "resnet3d"]),
    ("estimate unet3d (five cards)", ["estimate", "--model", "unet3d"]),
    ("estimate gpt2 (five cards)", ["estimate", "--model", "gpt2"]),
    ("estimate vit_b16 (five cards)", ["estimate", "--model", "vit_b16"]),
    ("check resnet50 batch 64 on A100-80GB (fits)", ["check", "--model", "resnet50",
                                                     "--batch-size", "64", "--gpu", "A100-80GB"]),
    ("check resnet50 batch 4000 on A100-80GB (does not)", [
        "check", "--model", "resnet50", "--batch-size", "4000", "--gpu", "A100-80GB"]),
    ("check resnet50 batch 4000 on A100-80GB --fixes", [
        "check", "--model", "resnet50", "--batch-size", "4000", "--gpu", "A100-80GB", "--fixes"]),
]
TRACE_COUNTER = ("import sys, runpy, memcalc.prepared_step as p\n"
                 "original = p.trace_training_step\n"
                 "count = [0]\n"
                 "def counted(*a, **k):\n"
                 "    count[0] += 1\n"
                 "    return original(*a, **k)\n"
                 "p.trace_training_step = counted\n"
                 "import atexit\n"
                 "atexit.register(lambda: print(f'TRACES {count[0]}', file=sys.stderr))\n"
                 "sys.argv = ['memcalc'] + sys.argv[1:]\n"
                 "runpy.run_module('memcalc', run_name='__main__')\n")


def _wall(argv: list[str]) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    return time.perf_counter() - start, done.stderr


def _median_wall(argv: list[str]) -> float:
    return statistics.median(_wall(argv)[0] for _ in range(RUNS))


def _traces(args: list[str]) -> int:
    _, stderr = _wall([sys.executable, "-c", TRACE_COUNTER, *args])
    counts = [line.split()[1] for line in stderr.splitlines() if line.startswith("TRACES ")]
    return int(counts[-1]) if counts else -1


ESTIMATE_BEYOND_TORCH_S = 5.0


def _target(label: str, beyond_s: float) -> str:
    """Whether an ``estimate`` row meets ``ESTIMATE_BEYOND_TORCH_S`` (other rows: -)."""
    if not label.startswith("estimate"):
        return "-"
    met = "met" if beyond_s <= ESTIMATE_BEYOND_TORCH_S else "NOT met"
    return f"≤ {ESTIMATE_BEYOND_TORCH_S:.0f} s: {met}"


def main() -> None:
    floor = _median_wall([sys.executable, "-c", "import torch"])
    rows = []
    for label, args in COMMANDS:
        wall = _median_wall([sys.executable, "-m", "memcalc", *args])
        rows.append(f"| {label} | {wall:.2f} | {wall / floor:.1f} | {wall - floor:.2f} | "
                    f"{_traces(args)} | {_target(label, wall - floor)} |")
    lines = [
        f"Measured {datetime.date.today()} on {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}; `import torch` alone: {floor:.2f} s (median of "
        f"{RUNS}). Wall seconds of a fresh `python -m memcalc …` process, median of {RUNS}. "
        "Regenerate with `python -m benchmarks.cli_speed` on an idle machine.",
        "",
        "| command | wall s | × import torch | s beyond import torch | traces | target |",
        "|---|---:|---:|---:|---:|---|",
        *rows,
    ]
    publish(RESULTS, "Command speed against import torch", lines)


if __name__ == "__main__":
    main()
