"""The evaluation step against real CPU runs (profiler memory timeline): every case of
``tests/test_eval_step.py`` in each grad mode, the sliding-window cases of
``tests/test_sliding_window.py`` and a training job's validation. Prints the table and writes
benchmarks/results-evaluation.md.

    python -m benchmarks.evaluation
"""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.results import publish
from memcalc.pipeline import estimate
from memcalc.specs import TrainingSpec
from tests.fixtures.cpu_truth import measure_spec_cpu_peak
from tests.test_eval_step import EVAL_CASES, GRAD_MODES
from tests.test_sliding_window import CASES as WINDOW_CASES
from tests.test_sliding_window import _estimate as window_estimate
from tests.test_sliding_window import _real_peak as window_real_peak

RESULTS = Path(__file__).with_name("results-evaluation.md")


def _row(name: str, real: int, traced: int) -> str:
    return f"| {name} | {real:,} | {traced:,} | {(traced - real) / real * 100:+.3f} % |"


def main() -> None:
    torch.set_num_threads(1)
    lines = ["| case | real CPU peak (B) | memcalc --device cpu (B) | error |",
             "|---|---:|---:|---:|"]
    for case, fields in EVAL_CASES.items():
        for mode in GRAD_MODES:
            spec = TrainingSpec(device="cpu", phase="eval", eval_grad_mode=mode, **fields)
            report = estimate(spec)
            real = measure_spec_cpu_peak(spec, report.input.traced_batch_shape)
            lines.append(_row(f"{case}, {mode}", real, report.device.peak_bytes))
    for case, arguments in WINDOW_CASES.items():
        lines.append(_row(f"sliding window, {case}", window_real_peak(*arguments),
                          window_estimate(*arguments).device.peak_bytes))
    lines += ["", f"torch {torch.__version__}, MONAI "
              f"{__import__('monai').__version__}; the sliding-window model is a per-voxel MLP "
              "(a real CPU convolution allocates scratch the trace cannot see)."]
    publish(RESULTS, "The evaluation step against real CPU runs", lines)


if __name__ == "__main__":
    main()
