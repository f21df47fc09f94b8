"""A model of PyTorch's CUDA caching allocator, replayed over a traced allocation sequence.

Predicts ``torch.cuda.max_memory_reserved`` (segments obtained with cudaMalloc) and the
block-level ``max_memory_allocated`` (rounded, possibly unsplit blocks) from the ledger's
events. Constants and rules follow ``c10/cuda/CUDACachingAllocator.cpp`` (torch 2.x): 512 B
rounding (or ``roundup_power2_divisions``), a small pool of 2 MiB segments for requests up
to 1 MiB, 20 MiB segments for 1–10 MiB, larger ones rounded to 2 MiB; best fit; splitting
and merging; ``max_split_size_mb``. With a capacity, a request that does not fit first frees
cached blocks and retries, as the allocator does before raising an OOM; an optional request
(a cuDNN workspace: cuDNN then takes a plan that needs less) is skipped instead.

Each stream has its own pools, as in the original: a block freed by an allocation of one
stream serves only that stream again (FSDP2's all-gather and reduce-scatter streams keep
their own segments beside the default stream's).

Known limitations: blocks used on another stream than their own are not held back until
that stream's work ends (``record_stream``); ``expandable_segments`` is one growing segment
per pool, mapped in 2 MiB / 20 MiB pages, whose free pages are returned only at its end.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from memcalc.device.allocator_settings import MIN_BLOCK_SIZE, AllocatorSettings
from memcalc.trace.ledger import EMPTY_CACHE_RECORD, MemoryEvent

SMALL_SIZE = 1 << 20          # kSmallSize: requests up to 1 MiB use the small pool
SMALL_BUFFER = 2 << 20        # kSmallBuffer: small-pool segments are 2 MiB
LARGE_BUFFER = 20 << 20       # kLargeBuffer: 1–10 MiB requests get a 20 MiB segment
MIN_LARGE_ALLOC = 10 << 20    # kMinLargeAlloc
ROUND_LARGE = 2 << 20         # kRoundLarge: larger segments are rounded to 2 MiB
DEFAULT_SETTINGS = AllocatorSettings()


def round_size(nbytes: int, settings: AllocatorSettings = DEFAULT_SETTINGS) -> int:
    """Request size after the allocator's rounding."""
    return settings.round_size(nbytes)


def segment_size(rounded: int) -> int:
    """Size of the cudaMalloc made when no cached block fits a rounded request."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-rounded // ROUND_LARGE)


class OutOfMemory(Exception):
    """A required request did not fit the capacity even after freeing cached blocks."""


@dataclass(eq=False)
class _Block:
    size: int
    segment: int
    offset: int
    small: bool
    stream: int = 0
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)

    @property
    def pool(self) -> tuple[int, bool]:
        return (self.stream, self.small)

    @property
    def whole_segment(self) -> bool:
        return self.prev is None and self.next is None


@dataclass(frozen=True)
class AllocatorReplay:
    """Peaks of the replay, in bytes; ``oom_event`` is the index of the event that did not
    fit (None when everything fitted)."""

    peak_reserved_bytes: int
    peak_allocated_block_bytes: int
    segment_count: int
    oom_event: int | None = None
    skipped_optional_bytes: int = 0
    """Optional requests (workspaces) that did not fit and were left out."""
    skipped_records: frozenset[int] = frozenset()
    """The ledger records of those requests."""
    limit_reached: bool = False
    """A segment was refused for the limit (else the replay is the one without a limit)."""

    @property
    def fits(self) -> bool:
        return self.oom_event is None


class CachingAllocatorModel:
    """Best-fit allocation from per-pool free lists, splitting and merging like the original."""

    def __init__(self, settings: AllocatorSettings = DEFAULT_SETTINGS,
                 limit_bytes: int | None = None) -> None:
        self.settings, self.limit_bytes = settings, limit_bytes
        # per (stream, small pool): the free blocks, sorted; an expandable segment's tail
        self._free: dict[tuple[int, bool], list[tuple[tuple[int, int, int], _Block]]] = {}
        self._arena_tail: dict[tuple[int, bool], _Block] = {}
        self.reserved_bytes = self.peak_reserved_bytes = 0
        self.allocated_bytes = self.peak_allocated_bytes = 0
        self.segment_count = 0
        self.limit_reached = False

    def malloc(self, nbytes: int, stream: int = 0) -> _Block:
        """Allocate ``nbytes`` on ``stream``; raise ``OutOfMemory`` when it cannot fit the
        limit."""
        size = self.settings.round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = (stream, small)
        block = self._take_best_fit(pool, size) or self._grow(pool, size)
        if self._should_split(block, size, small):
            rest = _Block(block.size - size, block.segment, block.offset + size, small, stream,
                          prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
            elif self._arena_tail.get(pool) is block:
                self._arena_tail[pool] = rest
            block.next, block.size = rest, size
            self._insert_free(rest)
        block.allocated = True
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block

    def free(self, block: _Block) -> None:
        block.allocated = False
        self.allocated_bytes -= block.size
        for neighbour in (block.prev, block.next):
            if neighbour is not None and not neighbour.allocated:
                self._remove_free(neighbour)
                if neighbour is block.prev:
                    block.offset, block.prev = neighbour.offset, neighbour.prev
                    if neighbour.prev is not None:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                block.size += neighbour.size
                if self._arena_tail.get(block.pool) is neighbour:
                    self._arena_tail[block.pool] = block
        self._insert_free(block)

    def empty_cache(self) -> None:
        """``torch.cuda.empty_cache()``: give back every segment with nothing allocated."""
        self._release(lambda block: True)

    def _should_split(self, block: _Block, size: int, small: bool) -> bool:
        remaining = block.size - size
        if small:
            return remaining >= MIN_BLOCK_SIZE
        return not self.settings.oversize(size) and remaining > SMALL_SIZE

    def _take_best_fit(self, key: tuple[int, bool], size: int) -> _Block | None:
        small, pool = key[1], self._free.get(key, [])
        index = bisect.bisect_left(pool, ((size, -1, -1),))
        if index == len(pool):
            return None
        block = pool[index][1]
        if self.settings.max_split_size_bytes is not None and not small:
            # An oversize cached block serves only an oversize request within 20 MiB of it.
            if not self.settings.oversize(size) and self.settings.oversize(block.size):
                return None
            if self.settings.oversize(size) and block.size >= size + LARGE_BUFFER:
                return None
        del pool[index]
        return block

    def _grow(self, pool: tuple[int, bool], size: int) -> _Block:
        """A new segment (or more pages of the pool's expandable segment), freeing cached
        blocks and retrying when the limit is reached, as ``malloc`` does before an OOM."""
        attempts = (lambda: None, self._release_oversize, self.empty_cache)
        for release in attempts:
            release()
            block = self._try_grow(pool, size)
            if block is not None:
                return block
        raise OutOfMemory(size)

    def _try_grow(self, pool: tuple[int, bool], size: int) -> _Block | None:
        if self.settings.expandable_segments:
            return self._grow_arena(pool, size)
        total = segment_size(size)
        if not self._reserve(total):
            return None
        self.segment_count += 1
        return _Block(total, self.segment_count, 0, pool[1], pool[0])

    def _grow_arena(self, pool: tuple[int, bool], size: int) -> _Block | None:
        stream, small = pool
        page = SMALL_BUFFER if small else LARGE_BUFFER
        tail = self._arena_tail.get(pool)
        reuse = tail is not None and not tail.allocated
        shortfall = size - (tail.size if reuse else 0)
        mapped = page * -(-shortfall // page)
        if not self._reserve(mapped):
            return None
        if reuse:
            self._remove_free(tail)
            tail.size += mapped
            return tail
        if tail is None:
            self.segment_count += 1
        segment = tail.segment if tail is not None else self.segment_count
        offset = tail.offset + tail.size if tail is not None else 0
        block = _Block(mapped, segment, offset, small, stream, prev=tail)
        if tail is not None:
            tail.next = block
        self._arena_tail[pool] = block
        return block

    def _reserve(self, nbytes: int) -> bool:
        if self.limit_bytes is not None and self.reserved_bytes + nbytes > self.limit_bytes:
            self.limit_reached = True
            return False
        self.reserved_bytes += nbytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return True

    def _release_oversize(self) -> None:
        """``release_available_cached_blocks``: with ``max_split_size_mb``, free cached
        oversize blocks (whole segments) before trying again."""
        if self.settings.max_split_size_bytes is not None:
            self._release(lambda block: self.settings.oversize(block.size))

    def _release(self, wanted) -> None:
        for pool in sorted(set(self._free) | set(self._arena_tail)):
            tail = self._arena_tail.get(pool)
            if tail is not None and not tail.allocated:
                self._remove_free(tail)
                self.reserved_bytes -= tail.size
                if tail.prev is None:
                    del self._arena_tail[pool]
                else:
                    tail.prev.next, self._arena_tail[pool] = None, tail.prev
            keep = []
            for item in self._free.get(pool, []):
                block = item[1]
                if block.whole_segment and wanted(block) and block not in self._arena_tail.values():
                    self.reserved_bytes -= block.size
                else:
                    keep.append(item)
            self._free[pool] = keep

    # A pool is sorted by its items' keys, compared as tuples: keys are unique (a segment
    # and an offset), so no comparison reaches a block; a probe ``(key,)`` sorts before
    # the item ``(key, block)``.
    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free.setdefault(block.pool, []), (block.key, block))

    def _remove_free(self, block: _Block) -> None:
        pool = self._free[block.pool]
        del pool[bisect.bisect_left(pool, (block.key,))]


def replay(events: Iterable[MemoryEvent], resident_bytes: Iterable[int] = (),
           settings: AllocatorSettings = DEFAULT_SETTINGS,
           limit_bytes: int | None = None) -> AllocatorReplay:
    """Run a ledger's allocation/free sequence through the allocator model.

    ``resident_bytes`` are allocated first and never freed (library workspaces);
    ``limit_bytes`` is what the allocator may reserve (capacity minus what lies outside it).
    """
    allocator, blocks, skipped = CachingAllocatorModel(settings, limit_bytes), {}, {}
    try:
        for nbytes in resident_bytes:
            allocator.malloc(nbytes)
    except OutOfMemory:
        return _result(allocator, oom_event=-1, skipped={})
    for index, event in enumerate(events):
        if event.record_id == EMPTY_CACHE_RECORD:
            allocator.empty_cache()
        elif event.delta_bytes > 0:
            try:
                blocks[event.record_id] = allocator.malloc(event.delta_bytes, event.stream)
            except OutOfMemory:
                if not event.optional:
                    return _result(allocator, oom_event=index, skipped=skipped)
                skipped[event.record_id] = event.delta_bytes
        elif event.record_id in blocks:
            allocator.free(blocks.pop(event.record_id))
    return _result(allocator, oom_event=None, skipped=skipped)


def _result(allocator: CachingAllocatorModel, oom_event: int | None,
            skipped: dict[int, int]) -> AllocatorReplay:
    return AllocatorReplay(allocator.peak_reserved_bytes, allocator.peak_allocated_bytes,
                           allocator.segment_count, oom_event, sum(skipped.values()),
                           frozenset(skipped), allocator.limit_reached)
