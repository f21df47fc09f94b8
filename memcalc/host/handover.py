"""The training process's time to take a batch from a DataLoader worker (the one before
freed): from an idle worker, and from one that is building its next batch. A batch's tensors
reach the main process as file descriptors that a thread in the worker hands over, so a
worker whose Python code holds the GIL hands them over late (``feed.model``'s warning)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from functools import partial
from typing import NamedTuple

from memcalc.host.machine import core_seconds


class Handover(NamedTuple):
    receive_s: float
    """From an idle worker: the median, with this process's waits for a CPU taken out."""
    busy_receive_s: float
    """From a worker that is building its next batch: the median."""


def time_handover(batches: Iterator, wait_s: float, rounds: int, building_s: float) -> Handover:
    """``rounds`` times on a one-worker loader's iterator: wait ``wait_s`` (long enough for
    the worker's prefetched batches to be ready and the worker idle), take one batch, wait
    ``building_s`` (the worker is now building the batch that take asked for: a part of its
    batch time, so that it has started even on a loaded machine), take the next. Raises
    StopIteration at the dataset's end."""
    idle, busy = [], []
    for _ in range(rounds):
        idle.append(_take(batches, wait_s))
        busy.append(_take(batches, building_s))
    return Handover(statistics.median(idle), statistics.median(busy))


def median_take(batches: Iterator, rounds: int, wait_s: float = 0.0) -> float:
    """Median time to take the next batch with a core to itself, ``rounds`` times, each after
    waiting ``wait_s``: from workers all done and idle (a long enough wait), or built by this
    process itself (a loader with no workers, no wait)."""
    return statistics.median(_take(batches, wait_s) for _ in range(rounds))


def _take(batches: Iterator, wait_s: float) -> float:
    """Wait ``wait_s``, then the time to take the next batch with a core to itself."""
    if wait_s > 0:
        time.sleep(wait_s)
    return core_seconds(partial(next, batches))
