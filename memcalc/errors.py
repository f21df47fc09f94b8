"""One error hierarchy for everything a user can get wrong.

Every message is one line that names the bad value and what is accepted, so the CLI can
print it as is and exit non-zero without a traceback.
"""

import os
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


def user_frame(trace) -> str | None:
    """``file:line`` of the innermost frame in the user's own files (not memcalc's, not an
    installed package's, not the standard library's), or None."""
    library = {os.path.dirname(os.__file__), _PACKAGE_DIR}
    for frame in reversed(traceback.extract_tb(trace)):
        path = os.path.abspath(frame.filename)
        if "site-packages" in path or "dist-packages" in path or frame.filename.startswith("<"):
            continue
        if any(path.startswith(root + os.sep) for root in library):
            continue
        return f"{frame.filename}:{frame.lineno}"
    return None
