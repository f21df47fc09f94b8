"""memcalc's per-kernel step time against the training steps timed on a real H100.

    python -m benchmarks.step_time           the shipped constants against every timed step,
                                             a refit, and each model left out of the refit;
                                             writes results-step-time.md

The timed steps are ``benchmarks/gpu_data/h100-steps.json`` (median of timed iterations after
warm-up; torch 2.11, CUDA 13.0, H100 SXM 80GB). Each is traced here on the CPU at the same
batch, its kernels listed, and timed by ``memcalc.device.kernel_time`` on the catalog's H100.
The refit minimises the squared log ratio of predicted to measured over the constants the
steps can tell apart (Nelder-Mead from the shipped values); the rest stay as shipped: the
bandwidth share, the shortest kernel, and the tensor-core matmul and attention efficiencies
(every half-precision transformer step here is paced by the host, so the steps cannot fit them).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from benchmarks.results import publish
from memcalc.device.gpus import find_gpu
from memcalc.device.kernel_time import H100_FIT, KernelRates, StepTime, step_time
from memcalc.device.speed import peak_flops
from memcalc.pipeline import training_step_flops
from tests.fixtures import gpu_data

RESULTS = Path(__file__).with_name("results-step-time.md")
FITTED = ("host_seconds_per_op", "conv2d_efficiency", "conv3d_efficiency",
          "fp32_conv_efficiency", "fp32_matmul_efficiency", "depthwise_efficiency")
GPU = find_gpu("H100-80GB")


def timed_steps() -> list[tuple[str, float, object, object]]:
    """(case name, measured median seconds, case, its traced StepFlops) per timed step."""
    cases = {row["name"]: case for case, row in gpu_data.measured_cases()}
    rows = []
    for timing in gpu_data.steps()["timing"]:
        case = cases[timing["name"]]
        rows.append((timing["name"], timing["median_s"], case,
                     training_step_flops(gpu_data.spec_of(case), case.batch_size)))
    return rows


def predicted(rates: KernelRates, row) -> StepTime:
    _, _, case, flops = row
    peak = peak_flops(GPU, case.precision, flops.convolution_fraction, case.tf32)[0]
    return step_time(flops.kernels, GPU, peak, case.tf32, rates=rates)


def _loss(rates: KernelRates, rows) -> float:
    return sum(math.log(predicted(rates, row).seconds / row[1]) ** 2 for row in rows)


def _rates(x: list[float]) -> KernelRates:
    values = {name: (math.exp(v) if name == "host_seconds_per_op" else 1 / (1 + math.exp(-v)))
              for name, v in zip(FITTED, x)}
    return H100_FIT.model_copy(update=values)


def _start() -> list[float]:
    return [math.log(v) if name == "host_seconds_per_op" else math.log(v / (1 - v))
            for name in FITTED for v in [getattr(H100_FIT, name)]]


def nelder_mead(f, x0: list[float], iterations: int = 400, step: float = 0.5) -> list[float]:
    n = len(x0)
    points = [list(x0)] + [[x + (step if i == j else 0) for j, x in enumerate(x0)]
                           for i in range(n)]
    values = [f(p) for p in points]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        points, values = [points[i] for i in order], [values[i] for i in order]
        centre = [sum(p[j] for p in points[:-1]) / n for j in range(n)]
        worst = points[-1]
        reflected = [c + (c - w) for c, w in zip(centre, worst)]
        fr = f(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centre, worst)]
            fe = f(expanded)
            points[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            points[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centre, worst)]
            fc = f(contracted)
            if fc < values[-1]:
                points[-1], values[-1] = contracted, fc
            else:
                best = points[0]
                points = [best] + [[b + 0.5 * (x - b) for b, x in zip(best, p)]
                                   for p in points[1:]]
                values = [values[0]] + [f(p) for p in points[1:]]
    return points[min(range(n + 1), key=values.__getitem__)]


def refit(rows) -> KernelRates:
    x = nelder_mead(lambda x: _loss(_rates(x), rows), _start())
    return _rates(nelder_mead(lambda x: _loss(_rates(x), rows), x, step=0.2))


def _summary(ratios: list[float]) -> str:
    return (f"median {statistics.median(ratios):.2f}, {min(ratios):.2f} to {max(ratios):.2f}, "
            f"median |error| {statistics.median(abs(r - 1) for r in ratios):.0%}")


def report_lines() -> list[str]:
    rows = timed_steps()
    lines = ["| step | measured | predicted | predicted / measured | host issues | GPU busy "
             "| MFU measured / predicted |", "|---|---:|---:|---:|---:|---:|---:|"]
    ratios = []
    for row in rows:
        time = predicted(H100_FIT, row)
        ratios.append(time.seconds / row[1])
        lines.append(f"| {row[0]} | {row[1] * 1e3:.1f} ms | {time.seconds * 1e3:.1f} ms | "
                     f"{time.seconds / row[1]:.2f} | {time.host_seconds * 1e3:.1f} ms | "
                     f"{time.kernel_seconds * 1e3:.1f} ms | "
                     f"{time.mfu * time.seconds / row[1]:.2f} / {time.mfu:.2f} |")
    fit = refit(rows)
    held, skipped = [], []
    for model in sorted({row[2].model for row in rows}):
        kept = [row for row in rows if row[2].model != model]
        if model == "convnext":          # its depthwise class is fitted to it alone
            skipped.append(model)
            continue
        rates = refit(kept)
        held += [predicted(rates, row).seconds / row[1] for row in rows if row[2].model == model]
    shipped = ", ".join(f"{name} {getattr(H100_FIT, name):.3g}" for name in KernelRates.model_fields)
    return [f"Timed on {gpu_data.steps()['versions']['gpu']} (torch "
            f"{gpu_data.steps()['versions']['torch']}); predicted with the catalog's H100-80GB.",
            "", f"Shipped constants: {shipped}.", "",
            f"Shipped constants against every timed step: {_summary(ratios)}.",
            "Refit here: " + ", ".join(f"{name} {getattr(fit, name):.3g}" for name in FITTED)
            + ".", f"Each model left out of the refit and predicted ({len(held)} steps; "
            f"{', '.join(skipped)} kept in, as it alone has depthwise convolutions): "
            f"{_summary(held)}.", "", *lines]


def main() -> None:
    publish(RESULTS, "Step time: the per-kernel model against timed H100 steps", report_lines())


if __name__ == "__main__":
    main()
