"""Every command's errors as one ``Error:`` line and a documented exit code.

Exit codes: 0 done (fits); 1 does not fit (or a measurement failed); 2 bad input; 3 fit
unknown (``check`` on a step that could not be traced); 4 the user's code failed (a builder
or Dataset raised or exited: its exception and file:line are named); 70 memcalc itself failed;
130 interrupted (SIGINT); 141 the reader closed the pipe (``output.OutputClosed``); 143
terminated (SIGTERM). A command past its ``--timeout`` is the
user's code not finishing (4). Processes the user's code started and left running are ended
with the command (``leftovers``).
"""

from __future__ import annotations

import signal
import sys
from functools import partial

import click
from pydantic import ValidationError

from memcalc import early_workers
from memcalc.cli.deadline import DeadlineExceeded, deadline, hard_exit, timeout_message, timeout_of
from memcalc.cli.leftovers import (
    become_subreaper,
    descendant_pids,
    end_new_descendants,
    leftovers_warning,
)
from memcalc.cli.output import PIPE_CLOSED_EXIT_CODE, OutputClosed, contained_stdout
from memcalc.cli.signal_raise import put_back, raise_owed, raise_where_safe, settle
from memcalc.cli.traps import (
    HardExit,
    end_forked_copy,
    sigint_received,
    stderr_at_line_start,
    trapped,
)
from memcalc.errors import (
    InputError,
    MemcalcError,
    UserCodeError,
    at_user_frame,
    dataloader_worker_failure,
    first_line,
    user_frame,
)

USER_CODE_EXIT_CODE = 4
INTERNAL_EXIT_CODE = 70
INTERRUPTED_EXIT_CODE = 130
TERMINATED_EXIT_CODE = 143


def run_guarded(ctx: click.Context, work) -> None:
    """Run ``work`` with the user's prints kept off stdout; turn every failure into one line
    and its exit code (``memcalc --debug`` re-raises instead); hold ``--timeout``; end the
    processes the user's code left running; catch what it does to the process (``traps``)."""
    debug = ctx.obj.get("debug")
    become_subreaper()
    before = descendant_pids() - early_workers.pids()    # ended with the rest on a hard stop
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        with trapped(), contained_stdout(), deadline(timeout_of(ctx), partial(_hard_stop, before)):
            work()
            raise_owed()        # a signal whose exception the work swallowed
    except BaseException as error:   # SystemExit from sys.exit(code) of a command passes
        settle()
        if isinstance(error, SystemExit) or (debug and not isinstance(error, Terminated)):
            raise
        if isinstance(error, OutputClosed):   # the reader has the answer it wanted
            sys.exit(PIPE_CLOSED_EXIT_CODE)
        _fail(*_failure(error))
    finally:
        end_forked_copy()
        put_back(signal.SIGTERM, previous)
        early_workers.discard()      # started for a plan that never took them: not the user's
        _warn_leftovers(end_new_descendants(before))


def _failure(error: BaseException) -> tuple[str, int]:
    """The one line and the exit code for an exception that ended a command."""
    if isinstance(error, (MemcalcError, ValidationError)):
        return _one_line(error), _code_of(error)
    if isinstance(error, Terminated):
        return "terminated (SIGTERM)", TERMINATED_EXIT_CODE
    if isinstance(error, KeyboardInterrupt) and sigint_received():
        return "interrupted", INTERRUPTED_EXIT_CODE
    if isinstance(error, DeadlineExceeded):
        return timeout_message(error.seconds), USER_CODE_EXIT_CODE
    if isinstance(error, HardExit):
        return (f"your code called os._exit({error.code}){at_user_frame(error)}; memcalc "
                "stopped there", USER_CODE_EXIT_CODE)
    worker = dataloader_worker_failure(error)
    if worker:
        return worker, USER_CODE_EXIT_CODE
    where = user_frame(error.__traceback__)
    message = f"{type(error).__name__}: {_one_line(error)}"
    if where or not isinstance(error, Exception):     # KeyboardInterrupt raised, not sent
        return (f"your code raised {message} at {where or 'an unknown place'} (memcalc --debug "
                "shows the traceback)", USER_CODE_EXIT_CODE)
    return (f"memcalc failed: {message} (memcalc --debug shows the traceback; please report "
            "it)", INTERNAL_EXIT_CODE)


def _hard_stop(before: set[int], message: str) -> None:
    """The main thread is stuck in C code past the deadline: end what it started, then exit."""
    ended = end_new_descendants(before)
    hard_exit(message, USER_CODE_EXIT_CODE, ended)


def _warn_leftovers(ended: int) -> None:
    if ended:
        click.echo(leftovers_warning(ended), err=True)


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, so no ``except Exception`` in user code or in memcalc
    mistakes it for a failure; it unwinds the stack and every child process is cleaned up."""


def _exit_on_sigterm(signum, frame) -> None:
    raise_where_safe(signum, frame, Terminated())


def _fail(message: str, code: int) -> None:
    end_forked_copy()
    if not stderr_at_line_start():      # a prompt or progress text of the user's code
        click.echo("", err=True)
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
    return first_line(error, limit=1000)
