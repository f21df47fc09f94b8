"""The caching-allocator model against the rules of CUDACachingAllocator.cpp, in closed form."""

import pytest

from memcalc.device.allocator import (
    CachingAllocatorModel,
    replay,
    round_size,
    segment_size,
)
from memcalc.trace.ledger import MemoryEvent

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


# --- capacity, settings and markers -------------------------------------------------------

from memcalc.device.allocator_settings import AllocatorSettings  # noqa: E402
from memcalc.device.allocator import OutOfMemory  # noqa: E402
from memcalc.trace.ledger import EMPTY_CACHE_RECORD  # noqa: E402


def _events(*pairs, optional=()):
    return [MemoryEvent(record, size, record in optional) for record, size in pairs]


def test_at_the_limit_cached_segments_are_freed_and_the_request_retried():
    # 60 MiB cached after the free; a 70 MiB request does not fit a 100 MiB limit with it
    events = _events((0, 60 * MiB), (0, -60 * MiB), (1, 70 * MiB))
    unlimited = replay(events)
    assert unlimited.peak_reserved_bytes == 130 * MiB
    limited = replay(events, limit_bytes=100 * MiB)
    assert limited.fits and limited.peak_reserved_bytes == 70 * MiB


def test_a_required_request_beyond_the_limit_is_an_oom_at_its_event():
    events = _events((0, 60 * MiB), (1, 50 * MiB))
    result = replay(events, limit_bytes=100 * MiB)
    assert not result.fits and result.oom_event == 1


def test_an_optional_request_beyond_the_limit_is_given_up():
    # a workspace that does not fit: cuDNN takes a plan that needs none
    events = _events((0, 60 * MiB), (1, 50 * MiB), (1, -50 * MiB), (2, 30 * MiB), optional={1})
    result = replay(events, limit_bytes=100 * MiB)
    assert result.fits and result.skipped_optional_bytes == 50 * MiB
    assert result.skipped_records == {1}


def test_empty_cache_marker_returns_free_segments():
    events = [MemoryEvent(0, 40 * MiB), MemoryEvent(0, -40 * MiB),
              MemoryEvent(EMPTY_CACHE_RECORD, 0), MemoryEvent(1, 60 * MiB)]
    # without the marker the 40 MiB segment stays reserved next to the new 60 MiB one
    assert replay(events).peak_reserved_bytes == 60 * MiB
    assert replay([e for e in events if e.record_id != EMPTY_CACHE_RECORD]).peak_reserved_bytes \
        == 100 * MiB


def test_resident_bytes_beyond_the_limit_are_an_oom_before_the_step():
    assert replay([], resident_bytes=[64 * MiB], limit_bytes=32 * MiB).oom_event == -1


def test_max_split_size_keeps_oversize_blocks_whole():
    settings = AllocatorSettings.from_conf("max_split_size_mb:20")
    allocator = CachingAllocatorModel(settings)
    big = allocator.malloc(100 * MiB)
    allocator.free(big)
    # a small request may not take (and split) the cached oversize block: new segment
    allocator.malloc(4 * MiB)
    assert allocator.segment_count == 2
    # an oversize request takes a cached oversize block only within 20 MiB of its size
    allocator.malloc(90 * MiB)
    assert allocator.segment_count == 2
    allocator.malloc(30 * MiB)
    assert allocator.segment_count == 3


def test_out_of_memory_is_raised_by_malloc_without_a_fit():
    allocator = CachingAllocatorModel(limit_bytes=10 * MiB)
    with pytest.raises(OutOfMemory):
        allocator.malloc(12 * MiB)


def test_expandable_segments_grow_one_segment_in_20_mib_pages():
    settings = AllocatorSettings.from_conf("expandable_segments:True")
    allocator = CachingAllocatorModel(settings)
    first = allocator.malloc(30 * MiB)      # 40 MiB mapped (two pages)
    assert allocator.reserved_bytes == 40 * MiB
    allocator.malloc(30 * MiB)              # 10 MiB free at the tail: map 20 more
    assert allocator.reserved_bytes == 60 * MiB and allocator.segment_count == 1
    allocator.free(first)                   # a 30 MiB hole at the start
    allocator.malloc(25 * MiB)              # fits the hole: nothing mapped
    assert allocator.reserved_bytes == 60 * MiB
    # without expandable segments the second request needs a segment of its own
    plain = replay(_events((0, 30 * MiB), (1, 30 * MiB), (0, -30 * MiB), (2, 25 * MiB)))
    assert plain.peak_reserved_bytes == 60 * MiB and plain.segment_count == 2


def test_a_replay_says_whether_it_reached_its_limit():
    events = _events((0, 60 * MiB), (0, -60 * MiB), (1, 70 * MiB))
    assert not replay(events).limit_reached
    assert not replay(events, limit_bytes=130 * MiB).limit_reached
    assert replay(events, limit_bytes=100 * MiB).limit_reached


# --- streams ------------------------------------------------------------------------------

def test_a_block_freed_on_one_stream_serves_only_that_stream():
    # CUDACachingAllocator.cpp: a free block is found by (stream, size): another stream's
    # request cannot take it and gets a segment of its own
    allocator = CachingAllocatorModel()
    allocator.free(allocator.malloc(40 * MiB, stream=1))
    allocator.malloc(40 * MiB, stream=0)
    assert allocator.segment_count == 2 and allocator.reserved_bytes == 80 * MiB
    allocator.malloc(40 * MiB, stream=1)     # its own stream's cached block
    assert allocator.segment_count == 2


def test_empty_cache_returns_every_streams_free_segments():
    allocator = CachingAllocatorModel()
    for stream in (0, 1, 2):
        allocator.free(allocator.malloc(30 * MiB, stream=stream))
    kept = allocator.malloc(2 * MiB, stream=1)     # split from stream 1's 30 MiB segment
    allocator.empty_cache()
    assert allocator.reserved_bytes == 30 * MiB and kept.allocated   # stream 1 keeps its one


def test_replay_keeps_each_events_stream():
    events = [MemoryEvent(0, 30 * MiB, stream=1), MemoryEvent(0, -30 * MiB, freeing=True),
              MemoryEvent(1, 30 * MiB)]
    assert replay(events).peak_reserved_bytes == 60 * MiB
    same = [MemoryEvent(0, 30 * MiB), MemoryEvent(0, -30 * MiB), MemoryEvent(1, 30 * MiB)]
    assert replay(same).peak_reserved_bytes == 30 * MiB
