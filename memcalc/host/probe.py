"""Run the user's Dataset in one real DataLoader worker and measure it (a subprocess).

``python -m memcalc.host.probe '<json config>' FD`` writes one JSON object per line to file
descriptor FD (a pipe from memcalc): ``started`` once the Dataset is built, a ``batch`` event
per batch of the memory phase, ``timing`` when the timing phase begins, and a final
``result`` (or ``error``). Its own stdout goes to stderr, so what the Dataset prints never
mixes with the events. It imports torch
and the user's module only, so its main process looks like a training script's.
The worker reports its pid through ``worker_init_fn``; a thread samples the worker's
private memory every few milliseconds, so the peak while samples are collated is seen.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import os
import statistics
import threading
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from memcalc.errors import InputError
from memcalc.host.child_events import emit, run_child
from memcalc.host.handover import busy_receive_s, idle_receive_budget_s, idle_receive_s, median_take
from memcalc.host.machine import core_time, cpu_run_and_wait_seconds, fault_counts, fresh_bytes
from memcalc.host.procmem import process_memory
from memcalc.model.user_code import load_dataset

SAMPLE_INTERVAL_S = 0.003
MIN_BATCHES = 18
PLATEAU_WINDOW = 6
PLATEAU_TOLERANCE = 0.02
TIMING_BATCHES = 16
"""Batches timed after the memory phase, with the memory sampler stopped: its polling takes
CPU from the worker on a small or busy machine, which would make samples look slower."""
TIMING_SHARE = 0.25
"""The timing phase's time budget, as a share of --probe-seconds (at most 5 s)."""
HANDOVER_ROUNDS = 5
HANDOVER_BUDGET_S = 2.0
"""The most spent timing the hand-over of batches after the timing phase; batches too slow
for HANDOVER_ROUNDS in it skip it (a few milliseconds matter little beside them)."""
MAIN_BUILD_BATCHES = 6
"""Batches the probe's own process builds with no worker, timed after one untimed, within
HANDOVER_BUDGET_S (else not timed): the 0-worker prediction, since a batch built in the
training process's own memory often costs less than a worker's, which writes it into fresh
shared memory (13.5 against 19.5 ms for the slice stacks of ``benchmarks/results-feed.md``)."""
TRAINING_HEAP_BLOCK_BYTES = (32 << 20) - (64 << 10)
"""A block freed just under glibc's largest dynamic mmap threshold (32 MiB on 64-bit,
``DEFAULT_MMAP_THRESHOLD_MAX``): a training script has freed blocks that size before it
starts its workers (a model's CPU copies moved to the GPU, a step's temporaries), which
raised its mmap threshold to them; the workers it forks inherit that."""




def _tensors(item: Any) -> list[torch.Tensor]:
    """Every tensor or array in a sample or batch (tuples, lists, dicts nested)."""
    if isinstance(item, torch.Tensor):
        return [item]
    if isinstance(item, np.ndarray):
        return [torch.from_numpy(item)]
    if isinstance(item, dict):
        return [t for value in item.values() for t in _tensors(value)]
    if isinstance(item, (list, tuple)):
        return [t for value in item for t in _tensors(value)]
    return []


def _model_input(item: Any, key: str | None) -> torch.Tensor:
    if key is not None:
        try:
            chosen = item[int(key)] if isinstance(item, (list, tuple)) else item[key]
        except (KeyError, IndexError, ValueError, TypeError):
            raise InputError(f"the first sample has no field {key!r} (--input-key)") from None
        item = chosen
    found = _tensors(item)
    if not found:
        raise InputError(f"the first sample is a {type(item).__name__} with no tensor or array; "
                         "return tensors or numpy arrays, or name the field with --input-key")
    return found[0]


def _record_pid(shared_pid, worker_id: int) -> None:
    shared_pid.value = os.getpid()


class _WorkerWatch:
    """Samples the worker's private memory (shared-memory batches excluded) in a thread."""

    def __init__(self, shared_pid) -> None:
        self.shared_pid, self.peak, self.stop = shared_pid, 0, False
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop:
            pid = self.shared_pid.value
            if pid:
                try:
                    memory = process_memory(pid)
                    self.peak = max(self.peak, max(0, memory.uss_bytes - memory.pss_shmem_bytes))
                except Exception:   # the worker is exiting
                    pass
            time.sleep(SAMPLE_INTERVAL_S)

    def take_peak(self) -> int:
        peak, self.peak = self.peak, 0
        return peak


def _timed_arrivals(batches, seconds: float, worker_pid: int
                    ) -> tuple[list[float], list[tuple[float, float]], int | None]:
    """Arrival times of up to TIMING_BATCHES more batches, nothing else running beside them
    (empty at the dataset's end), the worker's (seconds run, seconds waited for a CPU) so
    far at each arrival (empty where the kernel does not say), and the fresh memory the
    worker mapped meanwhile (``machine.fresh_bytes``; None where not known)."""
    faults = fault_counts(worker_pid)
    arrivals, cpu = [time.monotonic()], [cpu_run_and_wait_seconds(worker_pid)]
    deadline = arrivals[0] + seconds
    for batch in itertools.islice(batches, TIMING_BATCHES):
        del batch
        arrivals.append(time.monotonic())
        cpu.append(cpu_run_and_wait_seconds(worker_pid))
        if arrivals[-1] > deadline:
            break
    return arrivals, ([] if None in cpu else cpu), fresh_bytes(faults, fault_counts(worker_pid))


def _median_interval(times: list[float]) -> float:
    """Median time between batches (prefetched batches arrive at once, so not the mean)."""
    return statistics.median([b - a for a, b in itertools.pairwise(times)] or [0.0])


def _median_core_interval(times: list[float], cpu: list[tuple[float, float]]) -> float:
    """Median time between batches with the worker's core to itself (``core_time`` of each
    interval; the CPU times are read just after each arrival)."""
    steps = [core_time(b - a, run_b - run_a, wait_b - wait_a)
             for (a, b), ((run_a, wait_a), (run_b, wait_b))
             in zip(itertools.pairwise(times), itertools.pairwise(cpu))]
    return statistics.median(steps or [0.0])


def _worker_share(pid: int) -> int:
    """The worker's PSS share of pages it still shares with the main process."""
    try:
        worker = process_memory(pid)
    except Exception:   # not started yet, or exiting
        return 0
    return max(0, worker.pss_private_bytes - (worker.uss_bytes - worker.pss_shmem_bytes))


def _handover_wait_s(batch_s: float, prefetch: int) -> float:
    """How long a hand-over round waits for the worker to fill its prefetch queue."""
    return (prefetch + 1) * batch_s + 0.005


def handover_timed(batch_s: float, prefetch: int) -> bool:
    """Whether batches built in ``batch_s`` leave HANDOVER_BUDGET_S for timing their
    hand-over (``receive_seconds``)."""
    busy = HANDOVER_ROUNDS * (_handover_wait_s(batch_s, prefetch) + batch_s / 4)
    return busy + idle_receive_budget_s(batch_s, HANDOVER_ROUNDS) <= HANDOVER_BUDGET_S


def main_build_timed(batch_s: float) -> bool:
    """Whether batches built in ``batch_s`` leave HANDOVER_BUDGET_S for timing the probe's own
    process building them (``main_build_seconds``)."""
    return (MAIN_BUILD_BATCHES + 1) * batch_s <= HANDOVER_BUDGET_S


def _busy_receive(batches, batch_s: float, prefetch: int) -> dict[str, float]:
    """The main process's time to take a batch from the worker building its next one, on
    the probe's own loader (``memcalc.host.handover``), where the budget allows."""
    if not handover_timed(batch_s, prefetch):
        return {}
    try:
        busy = busy_receive_s(batches, _handover_wait_s(batch_s, prefetch), HANDOVER_ROUNDS,
                              batch_s / 4)
    except StopIteration:   # the dataset ended
        return {}
    return {"busy_receive_seconds": busy}


def _idle_receive(dataset, batch_size: int, batch_s: float, context) -> dict[str, float]:
    """The same from an idle worker, on a loader of its own (``idle_receive_s``)."""
    receive = idle_receive_s(dataset, batch_size, 1, batch_s, HANDOVER_ROUNDS,
                             multiprocessing_context=context)
    return {} if receive is None else {"receive_seconds": receive}


def _main_build(dataset, batch_size: int, batch_s: float) -> dict[str, float]:
    """The median time this process takes to build a batch itself (no worker) with a core
    to itself, where the budget allows and the dataset has the batches."""
    if not main_build_timed(batch_s):
        return {}
    batches = iter(DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=0))
    try:
        next(batches)
        return {"main_build_seconds": median_take(batches, MAIN_BUILD_BATCHES)}
    except StopIteration:
        return {}


def _plateaued(series: list[int]) -> bool:
    """Three windows of batches in a row without growth."""
    if len(series) < max(MIN_BATCHES, 3 * PLATEAU_WINDOW):
        return False
    windows = [max(series[len(series) - (k + 1) * PLATEAU_WINDOW:len(series) - k * PLATEAU_WINDOW])
               for k in range(3)]
    return all(newer <= older * (1 + PLATEAU_TOLERANCE) + (1 << 20)
               for newer, older in itertools.pairwise(windows))


def _heap_as_a_training_script_leaves_it() -> None:
    """glibc's mmap and trim thresholds where a training script's are when it starts its
    workers: a block just under the cap mapped and freed raises them to it."""
    block = torch.empty(TRAINING_HEAP_BLOCK_BYTES, dtype=torch.uint8)
    del block


def probe(config: dict[str, Any]) -> dict[str, Any]:
    if config.get("parent_heap") == "training":
        _heap_as_a_training_script_leaves_it()
    pid = os.getpid()
    before = process_memory(pid).pss_private_bytes
    dataset = load_dataset(config["dataset"])
    emit("started")
    main_bytes = process_memory(pid).pss_private_bytes
    dataset_bytes = max(0, main_bytes - before)
    first = dataset[0]
    model_input = _model_input(first, config.get("input_key"))
    sample_bytes = sum(t.nbytes for t in _tensors(first))
    del first
    context = multiprocessing.get_context(config["start_method"])
    shared_pid = context.Value("i", 0)
    loader = DataLoader(dataset, batch_size=config["batch_size"], shuffle=True, num_workers=1,
                        prefetch_factor=config["prefetch_factor"], multiprocessing_context=context,
                        worker_init_fn=functools.partial(_record_pid, shared_pid))
    watch = _WorkerWatch(shared_pid)
    watch.thread.start()
    series, arrivals, batch_bytes = [], [], 0
    deadline, stopped_by = time.monotonic() + config["seconds"], "dataset end"
    batches = iter(loader)
    for index, batch in enumerate(batches):
        arrivals.append(time.monotonic())
        batch_bytes = max(batch_bytes, sum(t.nbytes for t in _tensors(batch)))
        del batch
        series.append(watch.take_peak())
        main_bytes = max(main_bytes, process_memory(pid).pss_private_bytes
                         + _worker_share(shared_pid.value))
        emit("batch", index=index, worker_bytes=series[-1])
        if _plateaued(series):
            stopped_by = "plateau"
            break
        if time.monotonic() > deadline:
            stopped_by = "budget"
            break
    watch.stop = True
    watch.thread.join()
    emit("timing", batches=TIMING_BATCHES)
    timed, cpu, fresh = _timed_arrivals(batches, min(5.0, TIMING_SHARE * config["seconds"]),
                                        shared_pid.value)
    ended = len(timed) <= 3
    if ended:               # the dataset ended: the memory phase's arrivals, sampler and all
        timed, cpu, fresh = arrivals[1:], [], None
    batch_s = _median_interval(timed)
    # the training process's own times: taking batches from the worker, building them itself
    main_times = {} if ended else _busy_receive(batches, batch_s, config["prefetch_factor"])
    del batches, loader
    if main_times:
        main_times |= _idle_receive(dataset, config["batch_size"], batch_s, context)
    if not ended:
        main_times |= _main_build(dataset, config["batch_size"], batch_s)
    seconds_per_sample = batch_s / config["batch_size"]
    half = series[len(series) // 2:]
    slope = (half[-1] - half[0]) / max(1, len(half) - 1) if len(half) > 1 else 0.0
    return {
        "sample_shape": list(model_input.shape), "sample_dtype": str(model_input.dtype)
        .removeprefix("torch."), "sample_bytes": sample_bytes, "batch_size": config["batch_size"], "batch_bytes": batch_bytes,
        "main_process_bytes": main_bytes, "dataset_bytes": dataset_bytes,
        "worker_first_bytes": series[0] if series else 0, "worker_peak_bytes": max(series, default=0),
        "growth_bytes_per_batch": slope, "batches": len(series),
        "seconds_per_sample": seconds_per_sample,
        "core_seconds_per_sample": (_median_core_interval(timed, cpu) / config["batch_size"]
                                    if cpu else None),
        "stopped_by": stopped_by, **main_times,
        "fault_bytes_per_batch": None if fresh is None else fresh / (len(timed) - 1),
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "parent_heap": config.get("parent_heap", "fresh"),
    }


def main() -> None:
    run_child(probe)


if __name__ == "__main__":
    main()
