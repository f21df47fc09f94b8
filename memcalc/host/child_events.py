"""How a child process memcalc starts on the user's Dataset (``memcalc.host.probe``,
``memcalc.host.verify_run``) talks back: one JSON object per line on a dedicated file
descriptor, its own stdout sent to stderr so what the Dataset prints never mixes with the
events, and every way the user's code can fail ending in one ``error`` line. It dies with
the memcalc process that started it (PDEATHSIG), and its DataLoader workers with it
(DataLoader's watchdog), so a killed memcalc leaves nothing running."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from memcalc.errors import (
    InputError,
    UserCodeError,
    at_user_frame,
    dataloader_worker_failure,
    first_line,
)

_EVENTS: list[Any] = [sys.stdout]
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """SIGKILL when memcalc (pid ``parent``) ends, however it ends (Linux); nothing where not
    supported. The child runs in a process group of its own, which a signal to memcalc's
    group does not reach."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:     # memcalc ended before the call
        os._exit(1)


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), file=_EVENTS[0], flush=True)


def run_child(work: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """``work(config)`` with ``sys.argv`` = [program, json config, event fd]; its result as the
    ``result`` event, a failure as ``input_error`` (exit 2) or ``error`` (exit 3). A config's
    ``parent_pid`` (``memcalc.host.measure.start_child`` sets it) is the process it dies with."""
    config = json.loads(sys.argv[1])
    if "parent_pid" in config:
        die_with_parent(config["parent_pid"])
    if len(sys.argv) > 2:
        _EVENTS[0] = os.fdopen(int(sys.argv[2]), "w", buffering=1)
        sys.stdout.flush()
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    try:
        emit("result", **work(config))
    except InputError as error:   # bad reference, or no tensor in the sample
        emit("input_error", message=str(error).splitlines()[0])
        sys.exit(2)
    except SystemExit as error:      # sys.exit in the Dataset's code (in this process)
        emit("error", message=f"your Dataset called sys.exit({error.code!r})"
                              f"{at_user_frame(error)}")
        sys.exit(3)
    except UserCodeError as error:   # already names the user's file:line
        emit("error", message=first_line(error, limit=1000))
        sys.exit(3)
    except Exception as error:   # the user's Dataset can raise anything; report it in one line
        emit("error", message=dataloader_worker_failure(error)
             or f"{type(error).__name__}: {first_line(error)}{at_user_frame(error)}")
        sys.exit(3)
