"""One error hierarchy for everything a user can get wrong.

Every message is one line that names the bad value and what is accepted, so the CLI can
print it as is and exit non-zero without a traceback.
"""

import os
import re
import traceback

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class MemcalcError(Exception):
    """Root of every error memcalc raises on purpose."""


class InputError(MemcalcError, ValueError):
    """A user-supplied value (shape, name, option) is not acceptable."""


class ModelSourceError(InputError):
    """The model could not be found, imported or built."""


class LayoutError(InputError):
    """The per-sample shape fits neither channels-first nor channels-last."""


class UserCodeError(MemcalcError):
    """The user's own code (a model builder, a Dataset) raised or exited; the message names
    the exception and where in the user's files it was raised."""


class TraceError(MemcalcError):
    """The training step could not be executed on fake tensors."""


class MemoryBudgetError(MemcalcError):
    """A configuration does not fit the memory it is given; ``report`` has the numbers and
    ``plan`` (when a GPU was named) the strategies that fit."""

    def __init__(self, message: str, report=None, plan=None) -> None:
        super().__init__(message)
        self.report, self.plan = report, plan


class UntracedEstimateError(MemcalcError):
    """A check cannot say "fits": the step could not be traced, so only a static lower bound
    is known; ``report`` holds it, marked static."""

    def __init__(self, message: str, report=None) -> None:
        super().__init__(message)
        self.report = report


class CalibrationError(MemcalcError):
    """The GPU measurements of ``memcalc calibrate`` could not be made (no GPU, NVML
    missing, a measuring process failed)."""


def _is_users_file(filename: str) -> bool:
    """Not memcalc's, not an installed package's, not the standard library's."""
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if "site-packages" in path or "dist-packages" in path:
        return False
    return not any(path.startswith(root + os.sep)
                   for root in (os.path.dirname(os.__file__), _PACKAGE_DIR))


def user_frame(trace) -> str | None:
    """``file:line`` of the innermost frame in the user's own files, or None."""
    for frame in reversed(traceback.extract_tb(trace)):
        if _is_users_file(frame.filename):
            return f"{frame.filename}:{frame.lineno}"
    return None


def at_user_frame(error: BaseException) -> str:
    """`` (at file:line)`` of the user's innermost frame in ``error``'s traceback, or ''."""
    where = user_frame(error.__traceback__)
    return f" (at {where})" if where else ""


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message, for a one-line error (also when the
    exception's own ``__str__`` fails)."""
    try:
        lines = str(error).strip().splitlines()
    except Exception:  # a user's exception whose __str__ raises
        return "its message cannot be shown (its __str__ raises)"
    return lines[0][:limit] if lines else "no message"


_WORKER_FAILURE = re.compile(r"Caught (\w+) in DataLoader worker process (\d+)")
_TRACEBACK_FILE = re.compile(r'File "([^"]+)", line (\d+)')


def dataloader_worker_failure(error: BaseException) -> str | None:
    """What torch re-raises from a DataLoader worker ("Caught ValueError in DataLoader worker
    process 0") read back into the original exception and the user's file:line, or None."""
    text = str(error)
    caught = _WORKER_FAILURE.search(text)
    if caught is None or "Original Traceback" not in text:
        return None
    original = text.split("Original Traceback (most recent call last):", 1)[1]
    lines = [line.strip() for line in original.strip().splitlines() if line.strip()]
    frames = [(name, line) for name, line in _TRACEBACK_FILE.findall(original)
              if _is_users_file(name)]
    where = f" at {frames[-1][0]}:{frames[-1][1]}" if frames else ""
    return (f"your Dataset raised {lines[-1] if lines else caught.group(1)} in DataLoader "
            f"worker process {caught.group(2)}{where}")
