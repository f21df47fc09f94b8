"""Live-bytes ledger: every storage of a traced step, its role, and the event sequence.

Pure bookkeeping, no torch. A storage becomes a ``StorageRecord`` when it first appears; its
category may be refined later (a backward output that becomes a ``.grad``), and because the
peak is reconstructed by replaying the ``events`` list, the refined role is the one reported.
The event list (allocation / free, in order) is what a caching-allocator replay consumes.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from enum import Enum

from memcalc.trace.categories import MemoryCategory


class Phase(str, Enum):
    """Part of the training iteration in which a storage was created."""

    SETUP = "setup"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    ZERO_GRAD = "zero_grad"


@dataclass
class IterationBytes:
    """Bytes a step moves off the device per iteration (offloaded to the host, received from
    neighbouring GPUs): the current iteration's and the most in any iteration."""

    current_bytes: int = 0
    peak_bytes: int = 0

    def start_iteration(self) -> None:
        self.current_bytes = 0

    def add(self, nbytes: int) -> None:
        self.current_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)


@dataclass
class StorageRecord:
    """One storage: its size, where it was made, and what it turned out to be."""

    record_id: int
    nbytes: int
    phase: Phase
    iteration: int
    module_path: str
    category: MemoryCategory
    freed: bool = False


EMPTY_CACHE_RECORD = -1
"""``record_id`` of a marker event: the allocator empties its cache here (``cudnn.benchmark``
does after each plan search)."""


@dataclass(frozen=True)
class MemoryEvent:
    """``delta_bytes`` > 0: the record was allocated; < 0: it was freed. ``optional``
    allocations may be left out when memory is short (a cuDNN workspace). ``freeing`` says
    which of the two an empty record's event (0 bytes) is: a size rule's place held at a
    batch where it is empty (``memcalc.trace.cuda_embedding``). ``stream``: the stream the
    allocation was made on (0: the default one; ``memcalc.trace.streams``)."""

    record_id: int
    delta_bytes: int
    optional: bool = False
    freeing: bool = False
    stream: int = 0

    @property
    def is_free(self) -> bool:
        return self.freeing or self.delta_bytes < 0


@dataclass
class MemoryLedger:
    """Running total of live storage bytes with the peak and how it was reached."""

    records: list[StorageRecord] = field(default_factory=list)
    events: list[MemoryEvent] = field(default_factory=list)
    live_bytes: int = 0
    peak_bytes: int = 0
    peak_event_count: int = 0

    def allocate(self, nbytes: int, phase: Phase, iteration: int, module_path: str,
                 category: MemoryCategory, optional: bool = False,
                 stream: int = 0) -> StorageRecord:
        record = StorageRecord(len(self.records), nbytes, phase, iteration, module_path, category)
        self.records.append(record)
        self.events.append(MemoryEvent(record.record_id, nbytes, optional, stream=stream))
        self.live_bytes += nbytes
        if self.live_bytes > self.peak_bytes:
            self.peak_bytes = self.live_bytes
            self.peak_event_count = len(self.events)
        return record

    def free(self, record: StorageRecord) -> None:
        record.freed = True
        self.events.append(MemoryEvent(record.record_id, -record.nbytes, freeing=True))
        self.live_bytes -= record.nbytes

    def empty_cache(self) -> None:
        """Mark where the allocator's cache is emptied (no bytes change hands)."""
        self.events.append(MemoryEvent(EMPTY_CACHE_RECORD, 0))

    def without(self, record_ids: frozenset[int]) -> MemoryLedger:
        """The same step with these allocations left out (optional workspaces an allocator
        replay under a limit could not place): the ledger the figures at capacity come from."""
        if not record_ids:
            return self
        kept = MemoryLedger(records=self.records)
        for event in self.events:
            if event.record_id in record_ids:
                continue
            kept.events.append(event)
            kept.live_bytes += event.delta_bytes
            if kept.live_bytes > kept.peak_bytes:
                kept.peak_bytes, kept.peak_event_count = kept.live_bytes, len(kept.events)
        return kept

    def records_live_at_peak(self) -> list[StorageRecord]:
        """Replay events up to the peak and return the records alive there."""
        live: set[int] = set()
        for event in self.events[: self.peak_event_count]:
            if event.delta_bytes > 0:
                live.add(event.record_id)
            else:
                live.discard(event.record_id)
        return [self.records[record_id] for record_id in sorted(live)]

    def phase_peaks(self) -> tuple[int, int]:
        """Peak live bytes while computing (forward, loss, backward) and while stepping the
        optimizer (step, zero_grad): two lines in the batch size, one flat, one rising."""
        live, compute, step = 0, 0, 0
        for event in self.events:
            live += event.delta_bytes
            if event.delta_bytes > 0:
                phase = self.records[event.record_id].phase
                if phase in (Phase.FORWARD, Phase.BACKWARD):
                    compute = max(compute, live)
                elif phase in (Phase.OPTIMIZER, Phase.ZERO_GRAD):
                    step = max(step, live)
        return compute, step

    def timeline(self, points: int = 400) -> list[tuple[int, int, str, int]]:
        """Live bytes over the step, at most ``points`` samples keeping each span's maximum:
        (event index, live bytes, phase, iteration), the phase and iteration being those of
        the latest allocation at that event."""
        span = max(1, -(-len(self.events) // points))
        samples, live, best, record = [], 0, None, None
        for index, event in enumerate(self.events):
            live += event.delta_bytes
            # the phase is the one of the latest allocation: a free belongs to the phase it
            # happens in, not to the one that made the storage (a forward tensor freed in
            # backward would otherwise mark backward as forward)
            if event.record_id != EMPTY_CACHE_RECORD and event.delta_bytes > 0:
                record = self.records[event.record_id]
            if record is None:
                continue
            if best is None or live > best[1]:
                best = (index, live, record.phase.value, record.iteration)
            if (index + 1) % span == 0 or index == len(self.events) - 1:
                samples.append(best)
                best = None
        return samples

    def peak_record(self) -> StorageRecord | None:
        """The allocation that set the peak (its phase and iteration say when the peak was)."""
        if self.peak_event_count == 0:
            return None
        return self.records[self.events[self.peak_event_count - 1].record_id]

    def bytes_by_category_at_peak(self) -> dict[MemoryCategory, int]:
        totals: Counter[MemoryCategory] = Counter()
        for record in self.records_live_at_peak():
            totals[record.category] += record.nbytes
        return {category: totals.get(category, 0) for category in MemoryCategory}

    def activation_bytes_by_module_at_peak(self) -> dict[str, int]:
        per_module: dict[str, int] = defaultdict(int)
        for record in self.records_live_at_peak():
            if record.category is MemoryCategory.ACTIVATION:
                per_module[record.module_path] += record.nbytes
        return dict(per_module)
