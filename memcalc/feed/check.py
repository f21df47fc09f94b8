"""``memcalc feed``: the real DataLoader against a simulated consumer that sleeps for the
step time, measured GPU utilisation per worker count next to the feeding model's."""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict
from torch.utils.data import DataLoader

from memcalc.errors import InputError
from memcalc.feed.model import utilization
from memcalc.model.user_code import load_dataset

WARMUP_BATCHES = 2


class FeedRow(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    num_workers: int
    predicted_gpu_utilization: float
    measured_gpu_utilization: float


class FeedCheck(BaseModel):
    """Measured against predicted utilisation of a simulated GPU."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str
    batch_size: int
    step_time_s: float
    seconds_per_sample: float
    """From a separate real-worker measurement (``memcalc.host.probe``)."""
    cpus: int
    rows: list[FeedRow]


def measured_utilization(dataset, batch_size: int, workers: int, step_s: float,
                         batches: int) -> float:
    """Share of wall time the simulated GPU (a sleep per batch) is busy, after warm-up."""
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, shuffle=False)
    iterator = iter(loader)
    for _ in range(WARMUP_BATCHES + workers):     # worker start-up and queue fill
        next(iterator)
        time.sleep(step_s)
    start = time.perf_counter()
    for _ in range(batches):
        next(iterator)
        time.sleep(step_s)
    elapsed = time.perf_counter() - start
    del iterator
    return batches * step_s / elapsed


def feed_check(reference: str, batch_size: int, step_s: float, worker_counts: list[int], *,
               seconds_per_sample: float, cpus: int, batches: int = 20,
               progress: Callable[[int], None] | None = None) -> FeedCheck:
    dataset = load_dataset(reference)
    needed = (WARMUP_BATCHES + max(worker_counts) + batches) * batch_size
    if len(dataset) < needed:
        raise InputError(f"dataset {reference!r} has {len(dataset)} samples; the check needs "
                         f"{needed} ((warm-up + largest --workers + --batches) × batch size); "
                         "lower --batches or --workers")
    rows = []
    for workers in worker_counts:
        rows.append(FeedRow(
            num_workers=workers,
            predicted_gpu_utilization=utilization(workers, step_s, seconds_per_sample * batch_size,
                                                  cpus),
            measured_gpu_utilization=measured_utilization(dataset, batch_size, workers, step_s,
                                                          batches)))
        if progress:
            progress(workers)
    return FeedCheck(dataset=reference, batch_size=batch_size, step_time_s=step_s,
                     seconds_per_sample=seconds_per_sample, cpus=cpus, rows=rows)
