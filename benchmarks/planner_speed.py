"""Planner speed: `memcalc plan` against `memcalc estimate` on the seed case, as the ratio of
their wall times (fresh processes, median of 3 runs each), with the traced steps each makes
and the cores it ran on; then the plan with and without worker processes, to show whether
they pay off here; then larger jobs: a 1 B model's plan on the one GPU given and on 8 GPUs
(median of 3 runs), GPT-2's and an 8 B model's on 8 GPUs, whose plans trace ranks of the job
(one run each: an 8 B plan takes minutes). Prints the tables and writes benchmarks/results-planner.md.

    python -m benchmarks.planner_speed
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
from unittest.mock import patch

from benchmarks.results import publish
from memcalc.api import plan_spec
from memcalc.pipeline import estimate
from memcalc.report.models import Report
from memcalc.report_pool import MIN_CORES, ReportPool, usable_cores, workers_for
from memcalc.specs import TrainingSpec
from memcalc.strategies import ClusterSpec
from memcalc.strategies.report_cache import ReportCache, spec_key

RESULTS = Path(__file__).with_name("results-planner.md")
SEED_ARGS = ["--model", "resnet3d", "--shape", "834,224,834,3", "--gpu", "RTX-4090"]
SEED = TrainingSpec(model="resnet3d", sample_shape=(834, 224, 834, 3), gpu="RTX-4090")
RUNS = 3
TARGET_RATIO = 2.0
LLAMA_1B = ["--model", "llama_7b", "--model-arg", "dim=2048", "--model-arg", "depth=16",
            "--model-arg", "heads=16", "--model-arg", "hidden=5504", "--shape", "2048",
            "--gpu", "H100-80GB", "--batch-size", "2"]
DISTRIBUTED_JOBS = [
    ("GPT-2 (124 M), 8 GPUs", ["--model", "gpt2", "--gpu", "H100-80GB", "--batch-size", "4",
                               "--gpus", "8"], None, 1),
    ("LLaMA 0.94 B (2048 wide, 16 blocks, sequence 2048), the one GPU given", LLAMA_1B, 3.0,
     RUNS),
    ("LLaMA 0.94 B (2048 wide, 16 blocks, sequence 2048), 8 GPUs", [*LLAMA_1B, "--gpus", "8"],
     3.0, RUNS),
    ("Llama 3.1 8B as torchtitan trains it (sequence 8192), 8 GPUs",
     ["--model", "llama3_8b", "--shape", "8192", "--batch-size", "2", "--optimizer", "adamw",
      "--optimizer-impl", "fused", "--free-output", "--gpu", "H100-80GB", "--gpu-memory",
      "95GiB", "--gpus", "8"], None, 1),
]
"""(name, options shared by estimate and plan (plan's --gpus dropped for estimate), target
plan / estimate ratio or None, runs of each: the median is shown); the 8 B plan's target is
in seconds (``TARGET_8B_S``)."""
TARGET_8B_S = 120.0
_PLAN_WITH = ("import sys; from memcalc.api import plan_spec; from memcalc.specs import "
              "TrainingSpec; from memcalc.strategies import ClusterSpec; plan_spec(TrainingSpec("
              "model='resnet3d', sample_shape=(834, 224, 834, 3), gpu='RTX-4090'), "
              "ClusterSpec(), workers=int(sys.argv[1]))")


def median_wall_s(argv: list[str], runs: int = RUNS) -> tuple[float, list[float]]:
    """Median wall seconds of ``runs`` fresh processes of ``argv``, and each run's (exit 0, or
    1 where the job does not fit: an answer all the same)."""
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode not in (0, 1):
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr[-500:]}")
        walls.append(time.perf_counter() - start)
    return statistics.median(walls), walls


def traces_in(report: Report) -> int:
    """Steps traced for a report: the batch plan's traced points (a planned spec traces
    nothing else)."""
    return sum(point.method == "traced" for point in report.device.plan.points)


def plan_traces(workers: int) -> int:
    """Steps traced by a plan of the seed, over every report it made, ahead or not (made in
    this process to count them; the timings are of fresh processes): those it asked for, and
    those workers had finished ahead when it ended (skipped after all)."""
    made: dict[str, Report] = {}
    report, close = ReportCache.report, ReportPool.close

    def reported(cache: ReportCache, spec: TrainingSpec) -> Report:
        made[spec_key(spec)] = report(cache, spec)
        return made[spec_key(spec)]

    def closed(pool: ReportPool) -> None:
        for key, future in pool._pending.items():      # noqa: SLF001 (counting only)
            if future.done() and future.exception() is None:
                made.setdefault(key, future.result())
        close(pool)

    with patch.object(ReportCache, "report", reported), patch.object(ReportPool, "close", closed):
        plan_spec(SEED, ClusterSpec(), workers=workers)
    return sum(traces_in(r) for r in made.values())


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} / {five:.2f}"


def main() -> None:
    cores, workers = usable_cores(), workers_for(SEED)
    start_load = load()
    cli = [sys.executable, "-m", "memcalc"]
    estimate_s, estimate_runs = median_wall_s([*cli, "estimate", *SEED_ARGS])
    plan_s, plan_runs = median_wall_s([*cli, "plan", *SEED_ARGS])
    by_workers = {n: median_wall_s([sys.executable, "-c", _PLAN_WITH, str(n)])
                  for n in sorted({0, workers, max(1, cores - 1)})}
    estimate_traces = traces_in(estimate(SEED))
    traces = {n: plan_traces(n) for n in by_workers}
    ratio = plan_s / estimate_s
    runs = lambda walls: ", ".join(f"{w:.2f}" for w in walls)  # noqa: E731
    lines = [
        f"Measured {datetime.date.today()} on {platform.machine()} "
        f"({platform.processor() or 'cpu'}), {cores} usable core(s) "
        f"(`os.sched_getaffinity`), load average (1 / 5 min) {start_load} at the start and "
        f"{load()} at the end, Python {platform.python_version()}. Regenerate with "
        "`python -m benchmarks.planner_speed`.",
        "",
        f"Seed case `{' '.join(SEED_ARGS)}`; wall time of a fresh `python -m memcalc` process "
        f"(imports included), median of {RUNS} runs. Each `memcalc plan` starts its worker "
        "processes with the command, while it imports torch (`memcalc.early_workers`), and "
        "keeps one per core that neither it nor other processes keep busy "
        f"(none below {MIN_CORES} usable cores); at the benchmark's start that was {workers}. "
        "Every trace after a process's first replays the optimizer steps it recorded "
        "(`memcalc.trace.step_replay`). "
        "Traced steps are counted from the reports made (the batch plans' traced points), "
        "those made ahead in workers included (they may be skipped after all).",
        "",
        "| command | wall s (median) | runs (s) | traced steps |",
        "|---|---:|---:|---:|",
        f"| memcalc estimate | {estimate_s:.2f} | {runs(estimate_runs)} | {estimate_traces} |",
        f"| memcalc plan | {plan_s:.2f} | {runs(plan_runs)} | {traces[workers]} |",
        "",
        f"**plan / estimate = {ratio:.2f}** (target ≤ {TARGET_RATIO:g}: "
        f"{'met' if ratio <= TARGET_RATIO else 'NOT met'}).",
        "",
        "The plan through `memcalc.api.plan_spec` in a fresh `python -c` process, by worker "
        "processes (0: this process only):",
        "",
        "| workers | wall s (median) | runs (s) | traced steps | plan / estimate |",
        "|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {n} | {median:.2f} | {runs(walls)} | {traces[n]} | {median / estimate_s:.2f} |"
              for n, (median, walls) in by_workers.items()]
    lines += distributed_lines(cli)
    publish(RESULTS, "memcalc planner speed", lines)


def distributed_lines(cli: list[str]) -> list[str]:
    """Larger jobs: the plan (on 8 GPUs, ranks traced) against one estimate of the job on
    one GPU, fresh processes."""
    lines = ["", "Larger jobs: `memcalc plan` on the one GPU given sizes the distributed "
             "layouts in closed form on its traced variants; `memcalc plan … --gpus 8` "
             "traces each layout's best row "
             "(a pipeline's only where no traced row outpaces its ceiling), its leader and "
             "closed-form rows above a traced row of their layout as one rank of the job (fake "
             "process group, real wrappers; a rank replays the optimizer steps it recorded), "
             "against "
             "`memcalc estimate` of the job on one GPU; fresh processes, the median where a "
             f"job ran more than once (load average {load()} at the start).", "",
             "| job | estimate s | plan s | plan / estimate | target |", "|---|---:|---:|---:|---|"]
    for name, options, target, repeats in DISTRIBUTED_JOBS:
        single = [o for i, o in enumerate(options) if "--gpus" not in options[max(0, i - 1):i + 1]]
        estimate_s, _ = median_wall_s([*cli, "estimate", *single], runs=repeats)
        plan_s, _ = median_wall_s([*cli, "plan", *options], runs=repeats)
        ratio = plan_s / estimate_s
        if target is not None:
            verdict = f"≤ {target:g}× the estimate: {'met' if ratio <= target else 'NOT met'}"
        elif "llama3_8b" in options:
            verdict = f"≤ {TARGET_8B_S:g} s: {'met' if plan_s <= TARGET_8B_S else 'NOT met'}"
        else:
            verdict = "-"
        lines.append(f"| {name} | {estimate_s:.1f} | {plan_s:.1f} | {ratio:.2f} | {verdict} |")
    return lines


if __name__ == "__main__":
    main()
