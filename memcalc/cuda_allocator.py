"""A model of PyTorch's CUDA caching allocator, replayed over a traced allocation sequence.

Predicts ``torch.cuda.max_memory_reserved`` (segments obtained with cudaMalloc) and the
block-level ``max_memory_allocated`` (rounded, possibly unsplit blocks) from the ledger's
events. Constants and rules follow ``c10/cuda/CUDACachingAllocator.cpp`` with the default
configuration: no ``max_split_size_mb``, no ``roundup_power2_divisions``, no
``expandable_segments``.

Known limitations: one stream (blocks freed while in use on another stream are not held
back); cached blocks are never released (``empty_cache`` / OOM-retry are not modelled).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from memcalc.ledger import MemoryEvent

MIN_BLOCK_SIZE = 512          # kMinBlockSize: every request is rounded up to 512 B
SMALL_SIZE = 1 << 20          # kSmallSize: requests up to 1 MiB use the small pool
SMALL_BUFFER = 2 << 20        # kSmallBuffer: small-pool segments are 2 MiB
LARGE_BUFFER = 20 << 20       # kLargeBuffer: 1–10 MiB requests get a 20 MiB segment
MIN_LARGE_ALLOC = 10 << 20    # kMinLargeAlloc
ROUND_LARGE = 2 << 20         # kRoundLarge: larger segments are rounded to 2 MiB


def round_size(nbytes: int) -> int:
    """Request size after the allocator's 512-byte rounding."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return MIN_BLOCK_SIZE * -(-nbytes // MIN_BLOCK_SIZE)


def segment_size(rounded: int) -> int:
    """Size of the cudaMalloc made when no cached block fits a rounded request."""
    if rounded <= SMALL_SIZE:
        return SMALL_BUFFER
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * -(-rounded // ROUND_LARGE)


@dataclass(eq=False)
class _Block:
    size: int
    segment: int
    offset: int
    small: bool
    allocated: bool = False
    prev: _Block | None = None
    next: _Block | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.size, self.segment, self.offset)


@dataclass(frozen=True)
class AllocatorReplay:
    """Peaks of the replay, in bytes."""

    peak_reserved_bytes: int
    peak_allocated_block_bytes: int
    segment_count: int


class CachingAllocatorModel:
    """Best-fit allocation from per-pool free lists, splitting and merging like the original."""

    def __init__(self) -> None:
        self._free: dict[bool, list[tuple[tuple[int, int, int], _Block]]] = {True: [], False: []}
        self.reserved_bytes = self.peak_reserved_bytes = 0
        self.allocated_bytes = self.peak_allocated_bytes = 0
        self.segment_count = 0

    def malloc(self, nbytes: int) -> _Block:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._take_best_fit(small, size) or self._new_segment(small, size)
        remaining = block.size - size
        if remaining >= MIN_BLOCK_SIZE if small else remaining > SMALL_SIZE:
            rest = _Block(remaining, block.segment, block.offset + size, small,
                          prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = rest
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
        self._insert_free(block)

    def _take_best_fit(self, small: bool, size: int) -> _Block | None:
        pool = self._free[small]
        index = bisect.bisect_left(pool, (size, -1, -1), key=lambda item: item[0])
        if index == len(pool):
            return None
        return pool.pop(index)[1]

    def _new_segment(self, small: bool, size: int) -> _Block:
        total = segment_size(size)
        self.segment_count += 1
        self.reserved_bytes += total
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return _Block(total, self.segment_count, 0, small)

    def _insert_free(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.key, block), key=lambda item: item[0])

    def _remove_free(self, block: _Block) -> None:
        pool = self._free[block.small]
        index = bisect.bisect_left(pool, block.key, key=lambda item: item[0])
        del pool[index]


def replay(events: Iterable[MemoryEvent], resident_bytes: Iterable[int] = ()) -> AllocatorReplay:
    """Run a ledger's allocation/free sequence through the allocator model.

    ``resident_bytes`` are allocated first and never freed (library workspaces).
    """
    allocator, blocks = CachingAllocatorModel(), {}
    for nbytes in resident_bytes:
        allocator.malloc(nbytes)
    for event in events:
        if event.delta_bytes > 0:
            blocks[event.record_id] = allocator.malloc(event.delta_bytes)
        else:
            allocator.free(blocks.pop(event.record_id))
    return AllocatorReplay(allocator.peak_reserved_bytes, allocator.peak_allocated_bytes,
                           allocator.segment_count)
