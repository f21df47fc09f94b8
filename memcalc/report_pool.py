"""Reports of independent specs made at once: in worker processes and in the caller.

A plan asks for variants of one job that do not depend on each other ahead of time
(``VariantEstimator.prefetch``). With more than one core, ``ReportPool`` makes them in
``cores - 1`` worker processes while the calling process makes them too, from the other end
of the list; what it makes goes into the plan's ``ReportCache``, where the planner, asking
in its usual order, finds it. A worker is only given work once it has started, so a slow
start (a loaded machine) costs the caller nothing but the start itself.

Workers are spawned (fresh interpreters: safe with torch imported and its threads running)
and ignore SIGINT; the caller ends them on every way out of the ``with`` block (done, an
error, Ctrl-C, SIGTERM, a deadline), killing what still runs. Whatever fails in a worker, or
in the caller while working ahead, is dropped: the planner makes that report again when it
asks for it, so errors are those of a serial plan, raised the same way.

Known limitations: the default worker count reads the load of a short moment; a worker
needs seconds (the interpreter, torch, the first trace's lazy
imports) before its first report, so on few cores little is gained; only zoo models are
made in workers (a user's code runs in the caller alone, where memcalc watches what it does
to the process), not with a measured DataLoader, and not when the main script would run its
work again on being imported (no ``__main__`` guard).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import multiprocessing
import os
import signal
import sys
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from memcalc.host.machine import busy_cpus
from memcalc.isolation import lacks_main_guard
from models_zoo import ZOO

if TYPE_CHECKING:
    from memcalc.report.models import Report
    from memcalc.specs import TrainingSpec
    from memcalc.strategies.report_cache import ReportCache

MIN_CORES = 2
"""Fewest usable cores with which a plan starts workers (see benchmarks/planner_speed.py)."""
MAX_WORKERS = 5
"""A plan asks for at most six single-GPU variants at once: more workers would only start."""
LOAD_SAMPLE_S = 0.05
"""How long the other processes' CPU load is sampled before workers are started."""
_END_GRACE_S = 2.0

Announce = Callable[["TrainingSpec"], None]


def usable_cores() -> int:
    """Cores this process may run on (its affinity, not the machine's count)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def serial_reason(spec: TrainingSpec) -> str | None:
    """Why reports of ``spec`` are made in this process only; None when workers may."""
    if spec.model not in ZOO:
        return f"{spec.model!r} is not a zoo model: the user's code runs in this process only"
    if spec.loader.dataset:
        return "the DataLoader is measured in this process"
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    path = getattr(main, "__file__", None)
    if path and not name.endswith("__main__") and not (
            os.path.isfile(path) and not lacks_main_guard(path)):
        return f"{path} has no `if __name__ == \"__main__\":` guard; a worker would run it"
    return None


def workers_for(spec: TrainingSpec, requested: int | None = None) -> int:
    """Worker processes a plan of ``spec`` starts: ``requested``, or by default one per usable
    core that neither this process nor others keep busy now (none below ``MIN_CORES``, at
    most ``MAX_WORKERS``: on busy cores a worker only slows the rest); none when
    ``serial_reason`` says so."""
    if serial_reason(spec):
        return 0
    if requested is not None:
        return requested
    cores = usable_cores()
    if cores < MIN_CORES:
        return 0
    spare = cores - 1 - busy_cpus(LOAD_SAMPLE_S)
    return max(0, min(MAX_WORKERS, cores - 1, math.floor(spare + 0.5)))


class ReportPool:
    """``workers`` spawned processes, started when first needed; a context manager."""

    def __init__(self, workers: int) -> None:
        if workers < 0:
            raise ValueError(f"workers must be 0 or more: workers={workers}")
        self.workers = workers
        self._executor: ProcessPoolExecutor | None = None
        self._started: Future | None = None
        self._broken = False
        self.made_in_workers = 0
        """Reports the workers made (the rest were made in this process)."""

    @property
    def width(self) -> int:
        """Reports made at once: one per worker and the caller's."""
        return self.workers + 1

    def __enter__(self) -> ReportPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def fill(self, cache: ReportCache, local: Callable[[TrainingSpec], Report],
             announce: Announce | None, specs: list[TrainingSpec]) -> None:
        """Make the reports ``cache`` lacks among ``specs`` (``local`` in this process) and
        add them; a report that failed is left out."""
        missing = cache.missing(specs)
        if self.workers == 0 or len(missing) < 2:
            return      # one report ahead gains nothing: the planner makes it when it asks
        for index, report in self._make(missing, local, announce).items():
            cache.add(missing[index], report)

    def _make(self, specs: list[TrainingSpec], local: Callable[[TrainingSpec], Report],
              announce: Announce | None) -> dict[int, Report]:
        executor = self._executor or self._start()
        queue, running, made = deque(range(len(specs))), {}, {}
        while queue or running:
            self._collect(running, made, wait_for_one=not queue)
            if queue and self._accepting() and len(running) < self.workers:
                index = queue.popleft()
                if announce is not None:
                    announce(specs[index])
                running[_submit(executor, _worker_report, specs[index])] = index
            elif queue:
                index = queue.pop()
                with contextlib.suppress(Exception):    # made again, and raised, when asked
                    made[index] = local(specs[index])
        return made

    def _collect(self, running: dict[Future, int], made: dict[int, Report],
                 wait_for_one: bool) -> None:
        if not running:
            return
        done, _ = wait(list(running), timeout=None if wait_for_one else 0,
                       return_when=FIRST_COMPLETED)
        for future in done:
            index, error = running.pop(future), future.exception()
            if error is None:
                made[index] = future.result()
                self.made_in_workers += 1
            self._broken = self._broken or isinstance(error, BrokenProcessPool)

    def _accepting(self) -> bool:
        started = self._started
        if self._broken or started is None or not started.done():
            return False
        if started.exception() is not None:
            self._broken = True
        return not self._broken

    def _start(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")
        self._executor = ProcessPoolExecutor(self.workers, mp_context=context,
                                             initializer=_worker_start)
        self._started = _submit(self._executor, os.getpid)
        return self._executor

    def start(self, timeout_s: float | None = None) -> bool:
        """Start the workers now (not when first needed) and wait up to ``timeout_s`` for them
        to take work (None: no wait); True once they do."""
        if self.workers == 0:
            return False
        if self._executor is None:
            self._start()
        if timeout_s is not None:
            wait([self._started], timeout=timeout_s)
        return self._accepting()

    def close(self) -> None:
        """End the workers now: what they still run was only ever ahead of the planner. A
        Ctrl-C meanwhile is held back until they are gone (an interrupted close would leave the
        executor's manager thread running)."""
        executor, self._executor = self._executor, None
        if executor is not None:
            with _sigint_held():
                _end(executor)


def _end(executor: ProcessPoolExecutor) -> None:
    # CPython keeps the worker processes there; 3.14's terminate_workers() reads the same
    processes = list((getattr(executor, "_processes", None) or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(OSError, ValueError):
            process.terminate()
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            process.join(_END_GRACE_S)
            if process.is_alive():
                process.kill()
                process.join(_END_GRACE_S)
    executor.shutdown(wait=True)


@contextlib.contextmanager
def _sigint_held():
    """SIGINT recorded, not acted on, inside the block; raised again after it, for the handler
    that was there before (main thread only: elsewhere signals cannot be handled, so nothing
    changes)."""
    received = []
    try:
        before = signal.signal(signal.SIGINT, lambda *_: received.append(True))
    except ValueError:          # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
    if received:
        signal.raise_signal(signal.SIGINT)


def _submit(executor: ProcessPoolExecutor, call: Callable, *args) -> Future:
    """``executor.submit`` with SIGINT blocked meanwhile: a worker it starts inherits the block,
    so a Ctrl-C while the worker still imports cannot print its traceback (the caller gets the
    signal when the block is lifted)."""
    if not hasattr(signal, "pthread_sigmask"):
        return executor.submit(call, *args)
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return executor.submit(call, *args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _worker_start() -> None:
    """In each worker: Ctrl-C is the caller's to handle; the pipeline imported up front."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    importlib.import_module("memcalc.pipeline")


_WORKER_TABLES: dict[str, tuple] = {}
"""torchinfo's tables in a worker, shared by its reports (a worker lives for one plan)."""


def _worker_report(spec: TrainingSpec) -> Report:
    from memcalc.pipeline import estimate
    return estimate(spec, layer_tables=_WORKER_TABLES, card_fits=False)   # as the planner's own
