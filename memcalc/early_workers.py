"""A plan's worker processes, started as the ``memcalc plan`` command starts.

A plan's workers (``memcalc.report_pool``) spend about two seconds importing torch and tracing a
warm-up step before they take a variant. Started with the command, while this process itself
still imports torch, they are ready about a second sooner. Only what the command line alone
tells is known then, so they start only for ``plan`` of a model named as a zoo model is (no
``module:attr``, no ``.py``), without ``--dataset`` or ``--spec``, on at least ``MIN_CORES``
usable cores: as many as a plan may use (``MAX_WORKERS``, cores - 1), before the load is read.
The pool takes them over (``adopt``) when it wants at most that many; when it wants none (a busy
machine, a reason to run serially) or the command ends first, they are ended (``discard``), on
a SIGTERM too (``memcalc.cli.entry``); a worker whose parent is gone (SIGKILL) ends itself
(``memcalc.report_pool``).

Standard library only: this module is imported before torch.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import os
import re
import signal
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor

MIN_CORES = 2
"""Fewest usable cores with which a plan starts workers (see benchmarks/planner_speed.py)."""
MAX_WORKERS = 5
"""A plan asks for at most six single-GPU variants at once: more workers would only start."""
_END_GRACE_S = 2.0
_ZOO_NAME = re.compile(r"[A-Za-z0-9_\-]+")

_held: tuple[int, ProcessPoolExecutor, Future] | None = None


def usable_cores() -> int:
    """Cores this process may run on (its affinity, not the machine's count)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def start_workers(workers: int) -> tuple[ProcessPoolExecutor, Future]:
    """``workers`` spawned processes (fresh interpreters: safe with torch imported and its
    threads running), each set up by ``memcalc.report_pool``; the future is done once one runs."""
    executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_worker_start)
    return executor, submit(executor, os.getpid)


def _worker_start() -> None:
    # spawned with SIGTERM blocked when the command started it (``memcalc.cli.entry``): a
    # terminate() must reach it while it imports torch
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    importlib.import_module("memcalc.report_pool").worker_start()


def prestart(arguments: list[str]) -> None:
    """Start a plan's workers now when ``arguments`` (the command line after ``memcalc``) are
    a plan that will use them (see the module's description)."""
    global _held
    cores = usable_cores()
    if _held is not None or cores < MIN_CORES or not _plans_a_zoo_model(arguments):
        return
    workers = min(MAX_WORKERS, cores - 1)
    _held = (workers, *start_workers(workers))


def _plans_a_zoo_model(arguments: list[str]) -> bool:
    command = next((argument for argument in arguments if not argument.startswith("-")), None)
    if command != "plan" or {"--help", "-h", "--spec", "--dataset", "--version"} & {
            argument.split("=", 1)[0] for argument in arguments}:
        return False
    models = [value for flag, value in zip(arguments, arguments[1:]) if flag == "--model"]
    models += [argument.split("=", 1)[1] for argument in arguments
               if argument.startswith("--model=")]
    return len(models) == 1 and _ZOO_NAME.fullmatch(models[0]) is not None


def adopt(workers: int) -> tuple[ProcessPoolExecutor, Future] | None:
    """The workers started early when there are at least ``workers`` (> 0) of them, now the
    caller's to end; else None (and any started early are ended)."""
    global _held
    if _held is not None and 0 < workers <= _held[0]:
        _, executor, started = _held
        _held = None
        return executor, started
    discard()
    return None


def discard() -> None:
    """End the workers started early that no pool took over."""
    global _held
    held, _held = _held, None
    if held is not None:
        end(held[1])


def pids() -> set[int]:
    """Processes of the workers started early and not taken over."""
    return {process.pid for process in _processes_of(_held[1])} if _held is not None else set()


def _processes_of(executor: ProcessPoolExecutor) -> list:
    # CPython keeps the worker processes there; 3.14's terminate_workers() reads the same
    return list((getattr(executor, "_processes", None) or {}).values())


def end(executor: ProcessPoolExecutor) -> None:
    """Terminate the executor's processes (killed after a grace) and shut it down."""
    processes = _processes_of(executor)
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


def submit(executor: ProcessPoolExecutor, call: Callable, *args) -> Future:
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
