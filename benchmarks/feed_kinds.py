"""The feeding model against real DataLoaders on the kinds of data users train on
(``tests/fixtures/data_kinds.py``): a simulated step that spins a core (a training process
waiting on CUDA) and one that sleeps, at 0 … cores workers. Prints the table and writes
benchmarks/results-feed.md.

    python -m benchmarks.feed_kinds

It runs with glibc's two malloc thresholds set (``REUSE_ENV``; it starts itself again with them
where they are not): workers that map their temporaries afresh for every batch otherwise take
a time that depends on what this process allocated before starting them, 30-52 ms a batch
for the 3D volumes (``benchmarks/feed_malloc.py``).

    python -m benchmarks.feed_kinds --as-launched

runs as a job runs instead, into benchmarks/results-feed-as-launched.md: no malloc variable,
the loaders started from a process that has first done what a training script does
(``feed_heap.become_training_like``), and the worker measured as ``memcalc estimate
--dataset`` measures it (forked again from a training script's heap where it churns).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import PIL
import torch

from tests.fixtures.data_kinds import FEED_CASES
from benchmarks.results import publish
from memcalc.feed.check import CONSUMERS, feed_check
from memcalc.feed.model import utilization
from memcalc.host import LoaderSpec, detect_machine, measure_worker
from memcalc.host.malloc_thresholds import churns, reuse_env

RESULTS = Path(__file__).with_name("results-feed.md")
AS_LAUNCHED_RESULTS = Path(__file__).with_name("results-feed-as-launched.md")
PROBE_SECONDS = 8
BATCHES = 30
LIMIT_POINTS = 10
REUSE_ENV = reuse_env(256 << 20)
"""Above every kind's worker peak."""


def _probe(reference: str, batch_size: int, as_launched: bool):
    """The worker's measurement as ``memcalc estimate --dataset`` takes it."""
    loader = LoaderSpec(dataset=reference, probe_seconds=PROBE_SECONDS)
    sample = measure_worker(loader, batch_size)
    if as_launched and churns(sample):
        sample = measure_worker(loader, batch_size, parent_heap="training")
    return sample


def main(as_launched: bool = False) -> None:
    if as_launched:
        from benchmarks.feed_heap import become_training_like

        model, optimizer = become_training_like()  # alive while the loaders run
    cpus = detect_machine().cpus
    counts = list(range(cpus + 1))
    lines = ["| kind | batch | step | worker sample | main build | receive | busy receive "
             "| consumer | workers | predicted | measured | difference | other load "
             "| from the probe alone | its difference |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    misses, probe_misses, started = [], [], time.perf_counter()
    for name, case in FEED_CASES.items():
        sample = _probe(case.reference, case.batch_size, as_launched)
        for consumer in CONSUMERS:
            check = feed_check(case.reference, case.batch_size, case.step_s, counts, cpus=cpus,
                               batches=BATCHES, consumer=consumer,
                               seconds_per_sample=sample.feeding_seconds_per_sample)
            for row in check.rows:
                points = 100 * (row.predicted_gpu_utilization - row.measured_gpu_utilization)
                if abs(points) > LIMIT_POINTS:
                    misses.append(f"{name} {consumer} {row.num_workers}")
                alone = _from_the_probe(sample, case, row, cpus, consumer, check.wake_wait_s)
                alone_points = 100 * (alone - row.measured_gpu_utilization)
                if abs(alone_points) > LIMIT_POINTS:
                    probe_misses.append(f"{name} {consumer} {row.num_workers}")
                receive = f"{row.receive_s * 1e3:.1f} ms" if row.receive_s else "–"
                lines.append(
                    f"| {name} | {case.batch_size} | {case.step_s * 1e3:.0f} ms | "
                    f"{sample.feeding_seconds_per_sample * 1e3:.2f} ms | "
                    f"{check.main_build_s * 1e3:.1f} ms | {receive} | "
                    f"{check.busy_receive_s * 1e3:.1f} ms | {consumer} | "
                    f"{row.num_workers} | {row.predicted_gpu_utilization:.0%} | "
                    f"{row.measured_gpu_utilization:.0%} | {points:+.1f} | "
                    f"{row.other_busy_cpus:.2f} | {alone:.0%} | {alone_points:+.1f} |")
    rows = len(lines) - 2
    lines += ["", f"{rows - len(misses)} of {rows} rows within {LIMIT_POINTS} points"
              + (f"; outside: {', '.join(misses)}" if misses else "") + ".",
              "", f"From the probe alone: {rows - len(probe_misses)} of {rows} within "
              f"{LIMIT_POINTS} points" + (f"; outside: {', '.join(probe_misses)}"
                                          if probe_misses else "") + ". What `memcalc estimate "
              "--dataset` predicts: the same model with the main process's build and receive "
              "from the probe (`WorkerMeasurement.main_build_seconds`, `receive_seconds`), "
              "timed once in the probe's process, not on each row's own loader.",
              "", "Worker sample: the probe's time per sample in one real worker with its waits "
              "for a CPU taken out (`WorkerMeasurement.feeding_seconds_per_sample`), what the "
              "predictions with workers are made from. Main build and receive: the main "
              "process's own time to build a batch (the 0-worker row's prediction) and to take "
              "one from an idle worker (the rows with workers, taken back to back from as many "
              "workers right before the row's run: `memcalc.host.handover.idle_receive_s`), "
              "each timed just before its timed batches (`memcalc.feed.check.Run`). Busy receive: "
              "taking one from a worker that is building its next, timed once before the runs "
              "(`memcalc.feed.check.handover`; not in the prediction; far above the receive "
              "where the Dataset's Python code holds the GIL that the worker's hand-over "
              "needs). Measured: simulated step time × batches over the wall "
              f"time of {BATCHES} batches after warm-up. Other load: cores other processes "
              "kept busy meanwhile (the prediction shares the CPUs with them).",
              "", _how_run(as_launched),
              "", f"Linux {platform.release()}, Python {platform.python_version()}, torch "
              f"{torch.__version__}, numpy {np.__version__}, Pillow {PIL.__version__}; "
              f"{cpus} CPUs ({platform.processor() or platform.machine()}); "
              f"{time.perf_counter() - started:.0f} s in all."]
    publish(AS_LAUNCHED_RESULTS if as_launched else RESULTS,
            "Feeding: predicted vs measured GPU-busy share by kind of data"
            + (", as a job launches its loaders" if as_launched else ""), lines)


def _how_run(as_launched: bool) -> str:
    if as_launched:
        return ("Run with no MALLOC_ variable set, the loaders started from a process that had "
                "built ResNet-50, run one AdamW step and freed a CPU copy of its weights; the "
                "worker sample from the probe forked from a training script's heap where the "
                "fresh one churns (as `memcalc estimate --dataset` measures it).")
    return ("Run with " + " and ".join(f"`{key}={value}`" for key, value in REUSE_ENV.items())
            + " (the probe and every loader): see benchmarks/results-malloc.md for the "
            "same workers without them, and benchmarks/results-feed-as-launched.md "
            "(`--as-launched`) for these kinds run as a job runs them.")


def _from_the_probe(sample, case, row, cpus: int, consumer: str, wake_wait_s: float) -> float:
    """The row's prediction from the probe's times alone, as ``memcalc estimate`` makes it."""
    return utilization(row.num_workers, case.step_s,
                       sample.feeding_seconds_per_sample * case.batch_size, cpus,
                       main_busy=CONSUMERS[consumer].main_busy,
                       other_busy_cpus=row.other_busy_cpus,
                       receive_s=sample.receive_seconds or 0.0,
                       main_load_s=sample.main_build_seconds, wake_wait_s=wake_wait_s,
                       busy_receive_s=sample.busy_receive_seconds)


if __name__ == "__main__":
    if sys.argv[1:] == ["--as-launched"]:
        if any(key.startswith("MALLOC_") for key in os.environ):
            sys.exit("--as-launched runs without MALLOC_ variables")
        main(as_launched=True)
    else:
        if any(os.environ.get(key) != value for key, value in REUSE_ENV.items()):
            os.execve(sys.executable, [sys.executable, "-m", "benchmarks.feed_kinds"],
                      {**os.environ, **REUSE_ENV})
        main()
