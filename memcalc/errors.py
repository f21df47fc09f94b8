"""One error hierarchy for everything a user can get wrong.

Every message is one line that names the bad value and what is accepted, so the CLI can
print it as is and exit non-zero without a traceback.
"""


class MemcalcError(Exception):
    """Root of every error memcalc raises on purpose."""


class InputError(MemcalcError, ValueError):
    """A user-supplied value (shape, name, option) is not acceptable."""


class ModelSourceError(InputError):
    """The model could not be found, imported or built."""


class LayoutError(InputError):
    """The per-sample shape fits neither channels-first nor channels-last."""


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
