"""The line a step's traces lie on, once a third trace has shown it: batches the line gives are
not traced again (a replay costs milliseconds, a trace seconds).

Every real trace of one step (``PreparedStep``) is shown to ``StepLine.observe`` in the order
made. Two traces that differ only by numbers affine in the batch
(``memcalc.trace.affine_trace``) draw a line; the next trace checks it, figure for figure.
A checked line gives any batch's trace (``at``); a later trace off a checked line (a size
that changes course past some batch: an op that takes another path, a capped buffer) drops
lines for the step, and what was taken from the line is traced again. A line that a trace
contradicts before it was checked gives way to the line through the last two traces.
"""

from __future__ import annotations

from dataclasses import dataclass

from memcalc.trace.affine_trace import AffineTrace, affine_trace
from memcalc.trace.tracer import TraceResult


@dataclass
class StepLine:
    """Lines through one step's traces (real ones, in the order made)."""

    line: AffineTrace | None = None
    checked_at: int | None = None
    """The third batch traced on the line (None: not checked yet)."""
    dropped: str | None = None
    """Why lines are no longer used for this step (a trace off a checked line)."""
    _last: tuple[int, TraceResult] | None = None

    def observe(self, batch: int, trace: TraceResult) -> bool:
        """Take a new real trace; False where it is off the line (what the line gave must
        then be made again): a checked line is dropped, one not checked yet gives way to
        the line through the last two traces."""
        if self.dropped is not None:
            return True
        line, last = self.line, self._last
        self._last = (batch, trace)
        if line is not None:
            if line.matches(batch, trace):
                self.checked_at = self.checked_at or batch
                return True
            if self.checked_at is not None:
                self.dropped = (f"the trace at batch {batch} is off the line through batches "
                                f"{line.low} and {line.high} (checked at {self.checked_at})")
                self.line = None
                return False
        self.line, self.checked_at = None, None
        if last is not None and last[0] != batch:
            (low, low_trace), (high, high_trace) = sorted((last, (batch, trace)),
                                                          key=lambda item: item[0])
            self.line = affine_trace(low, low_trace, high, high_trace)
        return line is None

    def at(self, batch: int, tentative: bool = False) -> TraceResult | None:
        """The trace at ``batch`` on the checked line (``tentative``: on the line not checked
        yet, which the caller checks by a trace before relying on it); None without one."""
        if self.line is None or batch < 1 or not (self.checked or tentative):
            return None
        return self.line.at(batch)

    @property
    def checked(self) -> bool:
        return self.line is not None and self.checked_at is not None

    def assumptions(self, given: list[int]) -> list[str]:
        """What the report says of ``given``, the batches the line gave (not traced)."""
        if not given or not self.checked:
            return []
        batches = ", ".join(str(batch) for batch in sorted(given))
        return [f"batch{'es' if len(given) > 1 else ''} {batches} not traced: the step there "
                f"is on the line through the traces at batches {self.line.low}, "
                f"{self.line.high} and {self.checked_at} (each storage's bytes and each "
                "kernel's FLOPs a whole number per sample plus a constant, cuDNN workspaces and "
                "CUDA's embedding scratch by their rules; the third trace matched the line "
                "figure for figure), replayed through the allocator; a size that changes "
                "course between traced batches is not seen there"]
