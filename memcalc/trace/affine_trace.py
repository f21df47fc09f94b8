"""A traced step at any batch, from two traces where every figure is affine in the batch.

A training step's tensors are the model's states (the same at every batch) and tensors whose
size is a whole number of bytes per sample plus a constant (activations, inputs, their
gradients and temporaries). Where two traces of one step, at batches ``low`` and ``high``,
make the same storages in the same order, with the same roles, and every number that differs
between them (a storage's bytes, a kernel's FLOPs and bytes, the output's batch dimension)
grows by a whole number per sample, the trace at any batch is the one on that line: a replay
through the allocator's model costs milliseconds where a trace costs seconds.

Pure, no torch. ``affine_trace`` declines (None) where the two traces differ in anything but
such numbers (another storage at batch 1, a string that names the batch, a size that is not a
whole number per sample; op names count only where a report reads them,
``memcalc.trace.reported_ops``); the caller traces those batches. A line is only as good as its
evidence: a size that is affine between the two traces but not beyond (a workspace capped
past some batch) is caught by tracing a third batch and comparing it with the line's
(``AffineTrace.matches``), which every use of a line in memcalc does before relying on it.
"""

from __future__ import annotations

import copy
import dataclasses
from enum import Enum
from typing import Any

from pydantic import BaseModel

from memcalc.trace.ledger import EMPTY_CACHE_RECORD, MemoryEvent, MemoryLedger, StorageRecord
from memcalc.trace.reported_ops import reported_ops
from memcalc.trace.tracer import TraceResult


class _NotAffine(Exception):
    """The two traces differ in something other than affine numbers."""


@dataclasses.dataclass(frozen=True)
class AffineTrace:
    """The line through two traces of one step, at batches ``low`` < ``high``."""

    low: int
    high: int
    low_trace: TraceResult
    high_trace: TraceResult

    def at(self, batch: int) -> TraceResult:
        """The step's trace at ``batch`` on the line."""
        if batch == self.low:
            return self.low_trace
        if batch == self.high:
            return self.high_trace
        return _trace(self.low_trace, self.high_trace, _Point(self.low, self.high, batch))

    def matches(self, batch: int, trace: TraceResult) -> bool:
        """Whether ``trace``, traced at ``batch``, is the line's trace there, figure for
        figure (every storage, event, kernel and count; storages freed together in any
        order)."""
        made = self.at(batch)
        return (_shown(made) == _shown(trace)
                and made.ledger.records == trace.ledger.records
                and _in_order(made.ledger.events) == _in_order(trace.ledger.events))


def affine_trace(low: int, low_trace: TraceResult, high: int, high_trace: TraceResult
                 ) -> AffineTrace | None:
    """The line through two traces, or None where they are not two points of one."""
    if not 0 < low < high:
        return None
    try:
        _trace(low_trace, high_trace, _Point(low, high, None))
    except _NotAffine:
        return None
    return AffineTrace(low, high, low_trace, high_trace)


@dataclasses.dataclass(frozen=True)
class _Point:
    """Where on the line: ``batch`` None checks the two traces only (every difference a
    whole number per sample) and builds nothing."""

    low: int
    high: int
    batch: int | None

    def integer(self, low: int, high: int) -> int:
        slope, rest = divmod(high - low, self.high - self.low)
        if rest:
            raise _NotAffine
        return low if self.batch is None else low + slope * (self.batch - self.low)

    def real(self, low: float, high: float) -> float:
        if self.batch is None:
            return low
        return low + (high - low) * (self.batch - self.low) / (self.high - self.low)


_EQUAL_ONLY = (str, bytes, bool, Enum, type(None), frozenset, set)


def _blend(low: Any, high: Any, point: _Point) -> Any:
    if type(low) is not type(high):
        raise _NotAffine
    if low is high or isinstance(low, _EQUAL_ONLY):
        if low != high:
            raise _NotAffine
        return low
    if isinstance(low, int):
        return low if low == high else point.integer(low, high)
    if isinstance(low, float):
        return low if low == high else point.real(low, high)
    if isinstance(low, (tuple, list)):
        if len(low) != len(high):
            raise _NotAffine
        items = [_blend(a, b, point) for a, b in zip(low, high)]
        return type(low)(*items) if hasattr(low, "_fields") else type(low)(items)
    if isinstance(low, dict):
        if low.keys() != high.keys():
            raise _NotAffine
        return {key: _blend(value, high[key], point) for key, value in low.items()}
    if isinstance(low, BaseModel):
        fields = {name: _blend(getattr(low, name), getattr(high, name), point)
                  for name in type(low).model_fields}
        return type(low).model_construct(**fields)
    if dataclasses.is_dataclass(low):
        made = copy.copy(low)
        for field in dataclasses.fields(low):
            object.__setattr__(made, field.name,
                               _blend(getattr(low, field.name), getattr(high, field.name),
                                      point))
        return made
    raise _NotAffine         # a type whose equality says nothing about the step


def _shown(trace: TraceResult) -> TraceResult:
    """``trace`` without its ledger, its op names cut to those a report reads."""
    return dataclasses.replace(trace, ledger=None, op_names=reported_ops(trace.op_names))


def _trace(low: TraceResult, high: TraceResult, point: _Point) -> TraceResult:
    """The trace on the line: its ledger's records sized on the line, or by their rule; the
    op names of both traces (they must agree on those a report reads)."""
    if reported_ops(low.op_names) != reported_ops(high.op_names):
        raise _NotAffine
    sized = _blend(low.sized_records, high.sized_records, point)
    fields = {field.name: _blend(getattr(low, field.name), getattr(high, field.name), point)
              for field in dataclasses.fields(low)
              if field.name not in ("ledger", "sized_records", "op_names")}
    return TraceResult(ledger=_ledger(low.ledger, high.ledger, point, sized),
                       sized_records=sized, op_names=low.op_names | high.op_names, **fields)


def _ledger(low: MemoryLedger, high: MemoryLedger, point: _Point, sized: dict) -> MemoryLedger:
    """The ledger on the line: the same records in the same roles, each one's bytes on the
    line (or its rule's at the batch), its events the same allocations and frees of them;
    its running totals (where the peak was: an event's index, not a size) recomputed. The
    records' roles and the events' order are checked once, when the line is drawn."""
    if point.batch is None:
        _check_same_steps(low, high)
    records = []
    for one, other in zip(low.records, high.records):
        rule = sized.get(one.record_id)
        nbytes = (one.nbytes if point.batch is None else rule.nbytes) if rule is not None \
            else point.integer(one.nbytes, other.nbytes)
        records.append(StorageRecord(one.record_id, nbytes, one.phase, one.iteration,
                                     one.module_path, one.category, one.freed))
    made = MemoryLedger(records=records)
    events, live, peak, peak_index = made.events, 0, made.peak_bytes, made.peak_event_count
    for index, one in enumerate(low.events, 1):
        record_id = one.record_id
        delta = 0 if record_id == EMPTY_CACHE_RECORD else records[record_id].nbytes
        if one.is_free:
            delta = -delta
        events.append(MemoryEvent(record_id, delta, one.optional, one.freeing, one.stream))
        live += delta
        if live > peak:
            peak, peak_index = live, index
    made.live_bytes, made.peak_bytes, made.peak_event_count = live, peak, peak_index
    return made


def _check_same_steps(low: MemoryLedger, high: MemoryLedger) -> None:
    """The same storages in the same roles, allocated and freed in the same order (storages
    freed together in any order)."""
    if len(low.records) != len(high.records) or len(low.events) != len(high.events):
        raise _NotAffine
    for one, other in zip(low.records, high.records):
        if (one.phase, one.iteration, one.module_path, one.category, one.freed) != (
                other.phase, other.iteration, other.module_path, other.category, other.freed):
            raise _NotAffine
    if [(event.record_id, event.optional, event.is_free)
            for event in _in_order(low.events)] != [
            (event.record_id, event.optional, event.is_free)
            for event in _in_order(high.events)]:
        raise _NotAffine


def _in_order(events: list[MemoryEvent]) -> list[MemoryEvent]:
    """The events with each run of frees in record order: storages freed together (a
    graph's saved tensors, a dict of them) go in an order that can differ from trace to
    trace, and no figure depends on it (the allocator's free blocks end the same)."""
    ordered: list[MemoryEvent] = []
    run: list[MemoryEvent] = []
    for event in events:
        if event.is_free:
            run.append(event)
            continue
        ordered += sorted(run, key=lambda freed: freed.record_id)
        run = []
        ordered.append(event)
    return ordered + sorted(run, key=lambda freed: freed.record_id)
