"""How a child process memcalc starts on the user's Dataset (``memcalc.host.probe``,
``memcalc.host.verify_run``) talks back: one JSON object per line on a dedicated file
descriptor, its own stdout sent to stderr so what the Dataset prints never mixes with the
events, and every way the user's code can fail ending in one ``error`` line."""

from __future__ import annotations

import json
import os
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


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), file=_EVENTS[0], flush=True)


def run_child(work: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """``work(config)`` with ``sys.argv`` = [program, json config, event fd]; its result as the
    ``result`` event, a failure as ``input_error`` (exit 2) or ``error`` (exit 3)."""
    if len(sys.argv) > 2:
        _EVENTS[0] = os.fdopen(int(sys.argv[2]), "w", buffering=1)
        sys.stdout.flush()
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    try:
        emit("result", **work(json.loads(sys.argv[1])))
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
