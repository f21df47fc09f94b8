"""The optimizer step's ledger events, recorded on one trace and replayed on later ones.

A plan traces one model many times (batch 1 and batch 8 of each variant; a slab of each), and
an estimate twice: the parameters, their gradients and the optimizer are the same each time,
and so is everything the optimizer step allocates and frees. On fake tensors that step is
about half of a trace's time (foreach Adam dispatches each of its list ops over every
parameter). So the first trace in a process runs its steps and records their ledger events;
a later trace whose first step would see the same optimizer (class, defaults, group options),
the same parameters and gradients (shape, stride, offset, dtype, device, which share storage)
and an empty state replays them instead of calling ``optimizer.step()``: the same records
(size, category, optional), stamped with the trace's own phase, iteration and module, the
same events in the same order, the same op names and bounded-op uses.

A recording is kept only when it is closed, checked as it is made: inside a step only storages
made by the steps are freed and nothing is made outside the step's own stamp; the state the
steps leave is ended by ``finish`` (``optimizer.state.clear()``, on a ZeRO-1 rank its inner
optimizer's, which a replay mirrors) and every storage the steps made is freed by then;
nothing else the trace reports (CUDA kernels left unmodelled, attention backends, cuDNN calls)
changes in a step. A later step whose parameters or gradients differ from the recording's
raises ``ReplayMismatch``: the tracer then traces again with the steps run.

A rank of a distributed job (``memcalc.distributed``) replays only a recording of the same
layout and rank (the tracer's ``context``; a DTensor's placements are in its signature); an
FSDP2 rank with CPU offload always runs its steps (its host-held states are counted as the step
runs them).

Known limitations: recordings live for the process (the latest ``MAX_RECORDINGS``); a step is
matched on what it reads, not on its code, so an optimizer patched between traces in one
process would replay the unpatched step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from memcalc.trace.categories import MemoryCategory
from memcalc.trace.ledger import EMPTY_CACHE_RECORD, MemoryLedger, Phase

MAX_RECORDINGS = 16

Stamp = Callable[[], "tuple[Phase, int, str]"]
"""Where the step is: phase, iteration, module path (what a new record is stamped with)."""
Snapshot = Callable[[], object]
"""What else the trace reports, compared before and after a step run for real."""


class ReplayMismatch(RuntimeError):
    """A step's parameters or gradients differ from the recording being replayed."""


@dataclass(frozen=True)
class _Record:
    nbytes: int
    category: MemoryCategory
    optional: bool


@dataclass(frozen=True)
class RecordedStep:
    """One step: what it reads (``signature``), the records it made (numbered across the
    trace's steps), its events as (step record, allocated?), its op names and bounded uses."""

    signature: str
    records: tuple[tuple[int, _Record], ...]
    events: tuple[tuple[int, bool], ...]
    op_names: frozenset[str]
    uses: tuple[tuple[tuple[str, str], int], ...]
    kernels: tuple = ()
    """The kernels the step launched, where the trace was listing them (the step-time model)."""


@dataclass(frozen=True)
class Recording:
    """A trace's steps, in order, and the step records ``finish`` frees, in order."""

    steps: tuple[RecordedStep, ...]
    finish: tuple[int, ...]


_RECORDINGS: dict[str, Recording] = {}


def recordings() -> int:
    """Recordings this process keeps."""
    return len(_RECORDINGS)


def forget_recordings() -> None:
    """Drop every recording (the next trace runs its steps)."""
    _RECORDINGS.clear()


def step_signature(optimizer: torch.optim.Optimizer, context: str = "") -> str:
    """What a step reads: the optimizer's class, defaults and group options, each parameter
    and its gradient (shape, stride, offset, dtype, device, storage shared with an earlier
    tensor), the default dtype (its step counters) and ``context``. Not the state: a recording
    starts from none (the first step of a trace), and a replay makes none."""
    storages: dict[int, int] = {}
    kept: list[torch.UntypedStorage] = []      # ids stay unique while the storages live

    def tensor(value: torch.Tensor | None) -> tuple | None:
        if value is None:
            return None
        storage = value.untyped_storage()
        kept.append(storage)
        shared = storages.setdefault(id(storage), len(storages))
        return (tuple(value.shape), value.stride(), value.storage_offset(), str(value.dtype),
                str(value.device), shared, repr(getattr(value, "placements", None)))

    groups = [(sorted((key, repr(option)) for key, option in group.items() if key != "params"),
               [(tensor(param), param.requires_grad, tensor(param.grad))
                for param in group["params"]])
              for group in optimizer.param_groups]
    return repr((type(optimizer).__module__, type(optimizer).__qualname__,
                 sorted((key, repr(value)) for key, value in optimizer.defaults.items()),
                 groups, str(torch.get_default_dtype()), context))


@dataclass(frozen=True)
class TraceSide:
    """What a trace lends its optimizer steps: its ledger, op names and bounded-op uses (a
    replay adds to them), where the step is (``stamp``), what else it reports (``snapshot``),
    how to forget the value counts of tensors written unseen (``forget_values``) and the list
    of launched kernels, while the trace keeps one (``kernels``; a replay adds to it)."""

    ledger: MemoryLedger
    op_names: set[str]
    uses: Counter
    stamp: Stamp
    snapshot: Snapshot
    forget_values: Callable[[list[torch.Tensor]], None]
    kernels: Callable[[], "list | None"] = lambda: None


class OptimizerSteps:
    """A trace's optimizer steps: call it where the iteration steps the optimizer, then
    ``finish`` after the last iteration. Replays a recording when one matches the first step
    (unless ``replay`` is False), else runs the steps and records them. ``context``: what else
    the steps depend on (the tracer's setup). ``holder``: the optimizer whose ``state`` the
    steps fill (ZeRO-1's inner one, which steps the rank's shard); default ``optimizer``."""

    def __init__(self, optimizer: torch.optim.Optimizer, trace: TraceSide, context: str = "",
                 replay: bool = True, holder: torch.optim.Optimizer | None = None) -> None:
        self._optimizer, self._trace, self._ledger = optimizer, trace, trace.ledger
        self._state = (holder or optimizer).state
        self._context, self._replay_allowed = context, replay
        self._replaying: Recording | None = None
        self._steps: list[RecordedStep | None] = []
        self._made: dict[int, int] = {}        # ledger record id -> step record number
        self._replayed: dict[int, object] = {}  # step record number -> ledger record
        self._key: str | None = None

    def __call__(self) -> None:
        signature = step_signature(self._optimizer, self._context)
        if not self._steps:
            fresh = not self._state
            self._key = signature if fresh else None
            self._replaying = (_RECORDINGS.get(signature) if fresh and self._replay_allowed
                               else None)
        if self._replaying is not None:
            self._replay_step(signature)
        else:
            self._record_step(signature)

    def _replay_step(self, signature: str) -> None:
        steps = self._replaying.steps
        number = len(self._steps)
        if number >= len(steps) or steps[number].signature != signature:
            raise ReplayMismatch(f"optimizer step {number + 1} differs from the recording")
        step = steps[number]
        phase, iteration, module = self._trace.stamp()
        records = dict(step.records)
        for which, allocated in step.events:
            if allocated:
                record = records[which]
                self._replayed[which] = self._ledger.allocate(
                    record.nbytes, phase, iteration, module, record.category, record.optional)
            else:
                self._ledger.free(self._replayed.pop(which))
        self._trace.op_names.update(step.op_names)
        listed = self._trace.kernels()
        if listed is not None:
            listed.extend(step.kernels)
        self._trace.uses.update(dict(step.uses))
        # the step writes every parameter that has a gradient: counts of their values go
        self._trace.forget_values([param for group in self._optimizer.param_groups
                                   for param in group["params"] if param.grad is not None])
        self._steps.append(step)

    def _record_step(self, signature: str) -> None:
        ledger, trace = self._ledger, self._trace
        names_before, uses_before = set(trace.op_names), Counter(trace.uses)
        first_record, first_event, before = len(ledger.records), len(ledger.events), trace.snapshot()
        listed = trace.kernels()
        first_kernel = len(listed) if listed is not None else 0
        self._optimizer.step()
        stamp = trace.stamp()
        closed = trace.snapshot() == before and all(
            (record.phase, record.iteration, record.module_path) == stamp
            for record in ledger.records[first_record:])
        events: list[tuple[int, bool]] = []
        for event in ledger.events[first_event:]:
            if event.record_id == EMPTY_CACHE_RECORD:
                closed = False
            elif event.delta_bytes > 0:
                events.append((self._made.setdefault(event.record_id, len(self._made)), True))
            elif event.record_id in self._made:
                events.append((self._made[event.record_id], False))
            else:                   # a storage made before the steps died inside one
                closed = False
        optional = {event.record_id for event in ledger.events[first_event:] if event.optional}
        records = tuple((self._made[record.record_id],
                         _Record(record.nbytes, record.category, record.record_id in optional))
                        for record in ledger.records[first_record:])
        uses = Counter(trace.uses)
        uses.subtract(uses_before)
        self._steps.append(RecordedStep(
            signature, records, tuple(events), frozenset(trace.op_names - names_before),
            tuple((key, count) for key, count in uses.items() if count),
            tuple(listed[first_kernel:]) if listed is not None else ()) if closed else None)

    def finish(self) -> None:
        """End the optimizer state the steps left (its storages are freed now, in a replay as
        in a run) and keep a closed recording."""
        if self._replaying is not None:
            if len(self._steps) != len(self._replaying.steps):
                raise ReplayMismatch("the trace made fewer optimizer steps than the recording")
            for which in self._replaying.finish:
                self._ledger.free(self._replayed.pop(which))
            return
        first_event = len(self._ledger.events)
        self._state.clear()
        finish = [self._made.get(event.record_id) for event in self._ledger.events[first_event:]]
        if (self._key is None or None in self._steps or None in finish
                or any(not self._ledger.records[record_id].freed for record_id in self._made)):
            return
        self._keep(Recording(tuple(self._steps), tuple(finish)))

    def _keep(self, recording: Recording) -> None:
        record_ids = {which: record_id for record_id, which in self._made.items()}
        steps = []
        for step in recording.steps:      # categories as the trace ended with them
            records = tuple((which, _Record(record.nbytes,
                                            self._ledger.records[record_ids[which]].category,
                                            record.optional))
                            for which, record in step.records)
            steps.append(RecordedStep(step.signature, records, step.events, step.op_names,
                                      step.uses, step.kernels))
        while len(_RECORDINGS) >= MAX_RECORDINGS:
            del _RECORDINGS[next(iter(_RECORDINGS))]
        _RECORDINGS[self._key] = Recording(tuple(steps), recording.finish)
