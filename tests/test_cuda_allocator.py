"""The caching-allocator model against the rules of CUDACachingAllocator.cpp, in closed form."""

import pytest

from memcalc.cuda_allocator import (
    CachingAllocatorModel,
    replay,
    round_size,
    segment_size,
)
from memcalc.ledger import MemoryEvent

KiB, MiB = 1024, 1024 * 1024


@pytest.mark.parametrize("request_bytes,rounded", [(1, 512), (512, 512), (513, 1024),
                                                   (1_000_000, 1954 * 512)])
def test_requests_round_to_512_bytes(request_bytes, rounded):
    assert round_size(request_bytes) == rounded


@pytest.mark.parametrize("rounded,segment", [(512, 2 * MiB), (MiB, 2 * MiB), (MiB + 512, 20 * MiB),
                                             (10 * MiB - 512, 20 * MiB), (10 * MiB, 10 * MiB),
                                             (11 * MiB, 12 * MiB)])
def test_segment_sizes(rounded, segment):
    assert segment_size(rounded) == segment


def test_small_requests_pack_into_2_mib_segments():
    allocator = CachingAllocatorModel()
    for _ in range(4):
        allocator.malloc(512 * KiB)
    assert (allocator.reserved_bytes, allocator.segment_count) == (2 * MiB, 1)
    allocator.malloc(100)
    assert (allocator.reserved_bytes, allocator.segment_count) == (4 * MiB, 2)


def test_mid_size_requests_share_a_20_mib_segment():
    allocator = CachingAllocatorModel()
    allocator.malloc(3 * MiB // 2)
    allocator.malloc(3 * MiB // 2)
    assert allocator.reserved_bytes == 20 * MiB
    assert allocator.allocated_bytes == 3 * MiB


def test_large_block_is_not_split_when_less_than_1_mib_would_remain():
    allocator = CachingAllocatorModel()
    allocator.malloc(19 * MiB + 512 * KiB)  # segment 20 MiB, 0.5 MiB would remain
    assert allocator.reserved_bytes == 20 * MiB
    assert allocator.allocated_bytes == 20 * MiB  # max_memory_allocated sees the whole block


def test_freed_blocks_merge_and_are_reused():
    allocator = CachingAllocatorModel()
    first, second = allocator.malloc(40 * MiB), allocator.malloc(40 * MiB)
    allocator.free(first)
    allocator.free(second)
    allocator.malloc(40 * MiB)  # best fit: one of the cached 40 MiB segments
    assert allocator.reserved_bytes == 80 * MiB
    allocator.malloc(40 * MiB)
    assert allocator.segment_count == 2


def test_fragmentation_forces_a_new_segment():
    allocator = CachingAllocatorModel()
    blocks = [allocator.malloc(4 * MiB) for _ in range(5)]  # one 20 MiB segment, 5 blocks
    assert allocator.segment_count == 1
    allocator.free(blocks[1])
    allocator.free(blocks[3])  # 8 MiB free in total, but in two 4 MiB holes
    allocator.malloc(6 * MiB)
    assert allocator.segment_count == 2 and allocator.reserved_bytes == 40 * MiB


def test_coalescing_lets_adjacent_holes_serve_a_larger_request():
    allocator = CachingAllocatorModel()
    blocks = [allocator.malloc(4 * MiB) for _ in range(5)]
    allocator.free(blocks[1])
    allocator.free(blocks[2])  # adjacent: merged into one 8 MiB hole
    allocator.malloc(6 * MiB)
    assert allocator.segment_count == 1


def test_replay_of_ledger_events():
    events = [MemoryEvent(0, 100), MemoryEvent(1, 30 * MiB), MemoryEvent(1, -30 * MiB),
              MemoryEvent(2, 30 * MiB)]
    result = replay(events)
    assert result.peak_reserved_bytes == 2 * MiB + 30 * MiB
    assert result.peak_allocated_block_bytes == 512 + 30 * MiB
    assert result.segment_count == 2
