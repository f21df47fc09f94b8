"""The reports of one plan, each spec's made once.

The planner asks for many variants of one job, and some specs come back: the accumulation
variant of a job that already keeps its gradients is the job itself, and reports made ahead
(``VariantEstimator.prefetch``, in other processes) are asked for again when the planner
reaches them. The key is the spec as traced, every field of it (model and its arguments,
sample shape, batch, precision, checkpointing, offloading, spatial parts, optimizer, GPU...):
two specs share a report only when they are traced and planned the same way.

Known limitations: a field that does not change the trace (the loader's worker count, say)
still makes a new key, so such specs are estimated again rather than shared; a cache lives
for one plan, so a model edited between plans is never read stale.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memcalc.report.models import Report
    from memcalc.specs import TrainingSpec


def spec_key(spec: TrainingSpec) -> str:
    """The spec as traced: all of its fields, serialised."""
    return spec.model_dump_json()


class ReportCache:
    """Reports by spec; ``make`` is called once per spec (a failure is not kept: asking
    again raises again)."""

    def __init__(self, make: Callable[[TrainingSpec], Report],
                 ahead: Callable[[TrainingSpec], Report | None] | None = None) -> None:
        self._make, self._ahead = make, ahead
        self._reports: dict[str, Report] = {}

    def report(self, spec: TrainingSpec) -> Report:
        """The spec's report: kept, else made ahead elsewhere (``ahead`` gives it, or None),
        else made now."""
        key = spec_key(spec)
        if key not in self._reports:
            made = self._ahead(spec) if self._ahead is not None else None
            self._reports[key] = made if made is not None else self._make(spec)
        return self._reports[key]

    def keep(self, spec: TrainingSpec, report: Report) -> None:
        """``report``, made elsewhere for ``spec`` (a check's batch search), is the spec's."""
        self._reports[spec_key(spec)] = report

    def missing(self, specs: list[TrainingSpec]) -> list[TrainingSpec]:
        """The specs among ``specs`` that have no report yet, each once, in their order."""
        wanted: dict[str, TrainingSpec] = {}
        for spec in specs:
            key = spec_key(spec)
            if key not in self._reports:
                wanted.setdefault(key, spec)
        return list(wanted.values())

    def __len__(self) -> int:
        return len(self._reports)
