"""Reports of independent specs made at once: in worker processes and in the caller.

A plan asks for variants of one job that do not depend on each other ahead of time
(``VariantEstimator.prefetch``): the first it makes itself next; ``ReportPool.ahead`` hands
the rest to ``cores - 1`` worker processes, one each, the others as workers come free. The
plan's ``ReportCache`` asks the pool (``take``) before it makes a report: one a worker makes
is waited for, one not handed out yet is made by the caller and no longer handed out. So the
caller never waits for work it will not ask for (a slab the spatial search then skips), and
a worker is only given work once it has started: a slow start (a loaded machine) costs the
caller nothing but the start itself.

Workers are spawned (fresh interpreters: safe with torch imported and its threads running)
and ignore SIGINT; the caller ends them on every way out of the ``with`` block (done, an
error, Ctrl-C, SIGTERM, a deadline), killing what still runs. Whatever fails in a worker is
dropped: the planner makes that report again when it asks for it, so errors are those of a
serial plan, raised the same way.

Known limitations: the default worker count reads the load of a short moment; a worker
needs seconds (the interpreter, torch, the first trace's lazy imports) before its first
report, so on few cores little is gained (``memcalc plan`` of a zoo model starts them with
the command, ``memcalc.early_workers``, which hides about half of that); only zoo models are
made in workers (a user's code runs in the caller alone, where memcalc watches what it does
to the process), not with a measured DataLoader, and not when the main script would run its
work again on being imported (no ``__main__`` guard).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import math
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING

from memcalc import early_workers
from memcalc.early_workers import (
    MAX_WORKERS,
    MIN_CORES,
    end,
    start_workers,
    submit,
    usable_cores,
)
from memcalc.host.machine import other_busy_cpus
from memcalc.isolation import lacks_main_guard
from memcalc.strategies.report_cache import spec_key
from models_zoo import ZOO

if TYPE_CHECKING:
    from memcalc.report.models import Report
    from memcalc.specs import TrainingSpec
    from memcalc.strategies.report_cache import ReportCache

LOAD_SAMPLE_S = 0.05
"""How long the other processes' CPU load is sampled before workers are started."""
Announce = Callable[["TrainingSpec"], None]


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
    # the workers started early with the command are children: their imports are not load
    spare = cores - 1 - other_busy_cpus(LOAD_SAMPLE_S)
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
        self._cache: ReportCache | None = None
        self._announce: Announce | None = None
        self._sure = True
        self._wanted: deque[TrainingSpec] = deque()
        self._pending: dict[str, Future] = {}
        self._lock = threading.RLock()
        """Guards what is wanted and pending: workers are also fed from the executor's
        manager thread, as each report they make (or their start) completes."""
        self.made_in_workers = 0
        """Reports the workers made (the rest were made in this process)."""

    def __enter__(self) -> ReportPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def ahead(self, cache: ReportCache, announce: Announce | None,
              specs: list[TrainingSpec], sure: bool = True) -> None:
        """The planner will ask ``cache`` for ``specs`` in this order (every one when
        ``sure``, else it may skip all but the first): the first it makes itself next; the
        rest go to the workers, as many as are free now, the others as workers come free
        (whenever the planner asks for a report). Replaces what was wanted before; reports
        already being made are kept."""
        with self._lock:
            self._cache, self._announce, self._sure = cache, announce, sure
            self._wanted = deque(cache.missing(specs)[1:])
        self.start()
        self._feed()

    def take(self, spec: TrainingSpec) -> Report | None:
        """``spec``'s report when a worker makes it, else None: this process makes it, and it
        is no longer handed out. While the worker is still at it, this process makes the
        next wanted specs itself, into the cache, when they are sure to be asked for. A
        worker's failure is None too: the report is then made here, and fails as it would
        in a serial plan."""
        key = spec_key(spec)
        with self._lock:
            self._wanted = deque(s for s in self._wanted if spec_key(s) != key)
            future = self._pending.get(key)
        self._feed()        # keep the workers busy while this process makes it
        if future is None:
            return None
        while not future.done():
            with self._lock:
                if not (self._wanted and self._sure and self._cache is not None):
                    break
                meanwhile = self._wanted.popleft()
            with contextlib.suppress(Exception):    # made again, and raised, when asked
                self._cache.report(meanwhile)
        with self._lock:
            del self._pending[key]
        try:
            report = future.result()
        except Exception as error:  # noqa: BLE001 (made again here, where it raises)
            self._broken = self._broken or isinstance(error, BrokenProcessPool)
            return None
        self.made_in_workers += 1
        self._feed()
        return report

    def _feed(self) -> None:
        """Hand wanted specs to free workers (none while they still start): called by this
        process as it asks for reports, and from the executor's manager thread whenever a
        worker comes free (``on_variant`` may then be told from that thread)."""
        with self._lock:
            busy = sum(not future.done() for future in self._pending.values())
            while (self._wanted and busy < self.workers and self._executor is not None
                   and self._accepting()):
                spec = self._wanted.popleft()
                key = spec_key(spec)
                if key in self._pending or not self._cache.missing([spec]):
                    continue
                if self._announce is not None:
                    self._announce(spec)
                future = submit(self._executor, _worker_report, spec)
                self._pending[key] = future
                future.add_done_callback(self._came_free)
                busy += 1

    def _came_free(self, _future: Future) -> None:
        """A worker finished (or started): give it what is wanted next. Runs in the
        executor's manager thread, where nothing may raise."""
        with contextlib.suppress(Exception):
            self._feed()

    def _accepting(self) -> bool:
        started = self._started
        if self._broken or started is None or not started.done():
            return False
        if started.exception() is not None:
            self._broken = True
        return not self._broken

    def _start(self) -> ProcessPoolExecutor:
        """The workers the command started early (``memcalc.early_workers``), else new ones."""
        self._executor, self._started = (early_workers.adopt(self.workers)
                                         or start_workers(self.workers))
        self._started.add_done_callback(self._came_free)
        return self._executor

    def start(self, timeout_s: float | None = None) -> bool:
        """Start the workers now (not when first needed) and wait up to ``timeout_s`` for them
        to take work (None: no wait); True once they do."""
        if self.workers == 0:
            early_workers.discard()
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
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            with _sigint_held():
                end(executor)
            # its queues' semaphores are unlinked and unregistered from multiprocessing's
            # resource tracker once collected: then the tracker can be stopped cleanly
            del executor
            self._started = None
            gc.collect()


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


WARM_UP = {"model": "resnet3d", "model_args": {"depth": 10, "in_channels": 1, "num_classes": 2},
           "sample_shape": (8, 8, 8, 1), "batch_size": 1}
"""A tiny zoo step a worker traces as it starts: the imports and first-call work of a trace
(fake tensors, torchinfo's table, FLOP counting) are then done before its first report,
which took twice the caller's time for the same report without it."""


def worker_start() -> None:
    """In each worker: Ctrl-C is the caller's to handle; the worker ends itself once its
    parent is gone (killed, so nothing ended the pool); the pipeline imported and run once
    up front (``WARM_UP``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_end_with_parent, args=(os.getppid(),), daemon=True,
                     name="memcalc-parent-watch").start()
    pipeline = importlib.import_module("memcalc.pipeline")
    specs = importlib.import_module("memcalc.specs")
    with contextlib.suppress(Exception):    # only a warm-up: the real reports say what fails
        pipeline.estimate(specs.TrainingSpec(**WARM_UP), layer_tables={}, card_fits=False)


PARENT_CHECK_S = 1.0


def _end_with_parent(parent: int) -> None:
    """Exit once this process is no longer ``parent``'s child: an orphan waits on its task
    queue for ever (it holds the queue's write end itself, so no end-of-file comes)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


_WORKER_TABLES: dict[str, tuple] = {}
"""torchinfo's tables in a worker, shared by its reports (a worker lives for one plan)."""


def _worker_report(spec: TrainingSpec) -> Report:
    from memcalc.pipeline import planner_estimate
    return planner_estimate(spec, _WORKER_TABLES)       # as the planner's own
