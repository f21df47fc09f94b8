"""Processes the user's code started and left running are ended with the command.

A model builder or a Dataset may start processes (a server, a helper, a ``Popen`` it never
waits for). They would outlive memcalc, hold its output pipes open (a caller reading them
waits for ever) and use the node. memcalc becomes a child subreaper (Linux ``prctl``), so an
orphaned grandchild is reparented to it rather than to init and can still be found; when the
command ends, every descendant that did not exist before it started is terminated, then killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys

import psutil

_PR_SET_CHILD_SUBREAPER = 36    # <linux/prctl.h>
_TERMINATE_GRACE_S = 1.0


def become_subreaper() -> None:
    """Orphaned descendants are reparented to this process (Linux only; elsewhere a no-op)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError, TypeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def descendant_pids() -> set[int]:
    with contextlib.suppress(psutil.Error):
        return {child.pid for child in psutil.Process().children(recursive=True)}
    return set()


def end_new_descendants(before: set[int]) -> int:
    """Terminate, then kill, the descendants not in ``before`` (and not multiprocessing's own
    resource tracker, which exits with its parent); return how many were still running."""
    keep = before | _resource_tracker_pids()
    try:
        left = [child for child in psutil.Process().children(recursive=True)
                if child.pid not in keep]
    except psutil.Error:
        return 0
    for child in left:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(left, timeout=_TERMINATE_GRACE_S)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=_TERMINATE_GRACE_S)
    return len(left)


def _resource_tracker_pids() -> set[int]:
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    pid = getattr(getattr(tracker, "_resource_tracker", None), "_pid", None)
    return {pid} if pid else set()


def leftovers_warning(ended: int) -> str:
    return (f"Warning: ended {ended} process{'es' if ended > 1 else ''} that your code started "
            "and left running")
