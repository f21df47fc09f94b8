"""Run an estimate in a child process, so a crash or a hang in the user's model code cannot
take the caller (a notebook kernel, a training script) down with it.

The child is spawned (a fresh interpreter) and made the leader of its own process group, so
whatever it starts goes with it: on a timeout, an interrupt of the caller or any other exit
the whole group is killed. The trace itself allocates almost nothing for real (fake tensors);
as a backstop to the trace's refusal of real allocations, the parent watches the resident
memory of the child and what it started, and stops them past ``real_memory_cap_bytes`` (half
the RAM available when the call starts) before they can take the node down.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import re
import signal
import sys
import time

import psutil

from memcalc.process_defaults import default_start_method_kept, resource_tracker_kept
from memcalc.errors import InputError, TraceError, UserCodeError
from memcalc.host.procmem import tree_pids
from memcalc.model.source import OBJECT_PREFIX
from memcalc.report.models import Report
from memcalc.specs import TrainingSpec

DEFAULT_TIMEOUT_S = 600.0
_POLL_S = 0.2
_MAIN_GUARD = re.compile(r"""if\s+__name__\s*==\s*['"]__main__['"]""")


def _child(spec: TrainingSpec, connection) -> None:
    with contextlib.suppress(OSError):
        os.setsid()      # its own process group: the parent kills the group
    from memcalc.pipeline import estimate

    try:
        connection.send(("report", estimate(spec)))
    except SystemExit as error:
        connection.send(("user", f"the model's code called sys.exit({error.code!r})"))
    except BaseException as error:   # reported to the parent as one line
        kind = "user" if isinstance(error, UserCodeError) else "error"
        text = str(error).strip().splitlines()
        connection.send((kind, f"{type(error).__name__}: {text[0] if text else 'no message'}"))
    finally:
        connection.close()


def estimate_isolated(spec: TrainingSpec, timeout_s: float = DEFAULT_TIMEOUT_S) -> Report:
    """``pipeline.estimate`` in a fresh (spawned) interpreter, with a time limit."""
    if spec.model.startswith(OBJECT_PREFIX):
        raise InputError("isolate=True needs a model name or 'package.module:callable': an "
                         "instance or a lambda lives only in this process")
    if not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) or timeout_s <= 0:
        raise InputError(f"timeout_s={timeout_s!r}: give a positive, finite number of seconds")
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(spec, sender), daemon=True)
    with resource_tracker_kept():      # stopped once the child is gone
        with default_start_method_kept():
            process.start()
        sender.close()
        try:
            _wait_within_limits(receiver, process.pid, timeout_s, real_memory_cap_bytes())
            kind, payload = receiver.recv()
        except EOFError:
            process.join()
            raise TraceError(_why_it_died(process.exitcode)) from None
        finally:
            receiver.close()
            _kill_group(process)
    if kind == "user":
        raise UserCodeError(f"in the isolated process: {payload}")
    if kind == "error":
        raise TraceError(f"in the isolated process: {payload}")
    return payload


def real_memory_cap_bytes() -> int:
    """The resident memory an isolated estimate may use: half the RAM available now."""
    return psutil.virtual_memory().available // 2


def _wait_within_limits(receiver, pid: int, timeout_s: float, cap_bytes: int) -> None:
    """Return when the child has an answer; raise when it runs past the time or memory cap."""
    deadline = time.monotonic() + timeout_s
    while not receiver.poll(min(_POLL_S, max(0.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            raise TraceError(f"the isolated estimate did not finish in {timeout_s:g} s and was "
                             "stopped (with every process it started)")
        used = _resident_bytes(pid)
        if used > cap_bytes:
            raise TraceError(
                f"the isolated estimate held {used / 2**30:.2f} GiB of real memory, over its "
                f"cap of {cap_bytes / 2**30:.2f} GiB (half the RAM available), and was stopped: "
                "the model's code allocates real tensors outside the fake trace")


def _resident_bytes(pid: int) -> int:
    """RSS of a process and its descendants (0 once it is gone)."""
    total = 0
    for member in tree_pids(pid):
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(member).memory_info().rss
    return total


def _kill_group(process) -> None:
    """Kill the child's process group (the child and what it started), then the child."""
    if process.pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    if process.is_alive():
        process.kill()
    process.join()
    process.close()      # its sentinel pipe, which would stay open in the caller


def _why_it_died(exitcode: int | None) -> str:
    script = getattr(sys.modules.get("__main__"), "__file__", None)
    if exitcode == 1 and script and lacks_main_guard(script):
        return (f"the isolated process could not start: {script} has no "
                "`if __name__ == \"__main__\":` guard, and isolate=True starts a fresh "
                "interpreter that imports it again; put the script's work under that guard")
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else exitcode
        return (f"the isolated estimate was killed by {name} (out of memory, or the model's "
                "code crashed it); run it without isolate to see where")
    return (f"the isolated estimate ended without an answer (exit code {exitcode}); run it "
            "without isolate to see the traceback")


def lacks_main_guard(path: str) -> bool:
    """The script at ``path`` runs its work on import: it has no ``if __name__ == "__main__":``
    guard (a fresh interpreter started by ``multiprocessing`` imports it again)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as source:
            return _MAIN_GUARD.search(source.read()) is None
    except OSError:
        return False
