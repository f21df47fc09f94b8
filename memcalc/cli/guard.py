"""Every command's errors as one ``Error:`` line and a documented exit code.

Exit codes: 0 done (fits); 1 does not fit (or a measurement failed); 2 bad input; 3 fit
unknown (``check`` on a step that could not be traced); 4 the user's code failed (a builder
or Dataset raised or exited: its exception and file:line are named); 70 memcalc itself failed;
130 interrupted (SIGINT); 143 terminated (SIGTERM). A command past its ``--timeout`` is the
user's code not finishing (4). Processes the user's code started and left running are ended
with the command (``leftovers``).
"""

from __future__ import annotations

import signal
import sys
from functools import partial

import click
from pydantic import ValidationError

from memcalc.cli.deadline import DeadlineExceeded, deadline, hard_exit, timeout_message, timeout_of
from memcalc.cli.leftovers import become_subreaper, descendant_pids, end_new_descendants
from memcalc.cli.output import contained_stdout
from memcalc.errors import (
    InputError,
    MemcalcError,
    UserCodeError,
    dataloader_worker_failure,
    user_frame,
)

USER_CODE_EXIT_CODE = 4
INTERNAL_EXIT_CODE = 70
INTERRUPTED_EXIT_CODE = 130
TERMINATED_EXIT_CODE = 143


def run_guarded(ctx: click.Context, work) -> None:
    """Run ``work`` with the user's prints kept off stdout; turn every failure into one line
    and its exit code (``memcalc --debug`` re-raises instead); hold ``--timeout``; end the
    processes the user's code left running."""
    debug = ctx.obj.get("debug")
    become_subreaper()
    before = descendant_pids()
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with contained_stdout(), deadline(timeout_of(ctx), partial(_hard_stop, before)):
            work()
    except (MemcalcError, ValidationError) as error:
        if debug:
            raise
        _fail(_one_line(error), _code_of(error))
    except KeyboardInterrupt:
        if debug:
            raise
        _fail("interrupted", INTERRUPTED_EXIT_CODE)
    except Terminated:
        _fail("terminated (SIGTERM)", TERMINATED_EXIT_CODE)
    except DeadlineExceeded as error:
        if debug:
            raise
        _fail(timeout_message(error.seconds), USER_CODE_EXIT_CODE)
    except Exception as error:  # whatever the user's code or a dependency raises
        if debug:
            raise
        worker = dataloader_worker_failure(error)
        if worker:
            _fail(worker, USER_CODE_EXIT_CODE)
        where = user_frame(error.__traceback__)
        message = f"{type(error).__name__}: {_one_line(error)}"
        if where:
            _fail(f"your code raised {message} at {where} (memcalc --debug shows the traceback)",
                  USER_CODE_EXIT_CODE)
        _fail(f"memcalc failed: {message} (memcalc --debug shows the traceback; please "
              "report it)", INTERNAL_EXIT_CODE)
    finally:
        signal.signal(signal.SIGTERM, previous)
        ended = end_new_descendants(before)
        if ended:
            click.echo(f"Warning: ended {ended} process{'es' if ended > 1 else ''} that your "
                       "code started and left running", err=True)


def _hard_stop(before: set[int], message: str) -> None:
    """The main thread is stuck in C code past the deadline: end what it started, then exit."""
    end_new_descendants(before)
    hard_exit(message, USER_CODE_EXIT_CODE)


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, so no ``except Exception`` in user code or in memcalc
    mistakes it for a failure; it unwinds the stack and every child process is cleaned up."""


def _exit_on_sigterm(signum, frame) -> None:
    raise Terminated()


def _fail(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


def _code_of(error: Exception) -> int:
    if isinstance(error, UserCodeError):
        return USER_CODE_EXIT_CODE
    return 2 if isinstance(error, (InputError, ValidationError)) else 1


def _one_line(error: Exception) -> str:
    if isinstance(error, ValidationError):
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        return f"{field}: {message}" if field else message
    lines = str(error).strip().splitlines()
    return lines[0] if lines else "no message"
