"""The least limit a step runs in, against closed forms of the allocator's rules."""

from memcalc.device import least_limit
from memcalc.device.allocator import replay
from memcalc.device.allocator_settings import AllocatorSettings
from memcalc.device.least_limit import LEAST_LIMIT_TOLERANCE, least_limit_replay, live_request_peak
from memcalc.trace.ledger import MemoryEvent

MiB = 1024 * 1024


def _events(*pairs, optional=()):
    return [MemoryEvent(record, size, record in optional) for record, size in pairs]


def test_the_least_limit_a_step_runs_in_is_its_need_not_the_unlimited_peak():
    # 60 MiB cached, then 70 MiB: 130 MiB without a limit, but a 70 MiB card runs it (the
    # cache freed and retried), and a 40 MiB one does not
    events = _events((0, 60 * MiB), (0, -60 * MiB), (1, 70 * MiB))
    settings = AllocatorSettings()
    least = least_limit_replay(events, [], settings, failed_limit=40 * MiB,
                               unlimited=replay(events))
    assert least.fits
    slack = max(2 * MiB, 130 * MiB * LEAST_LIMIT_TOLERANCE)
    assert 70 * MiB <= least.peak_reserved_bytes <= 70 * MiB + slack
    assert not replay(events, limit_bytes=least.peak_reserved_bytes - 2 * MiB - 1).fits


def test_no_limit_below_the_requests_live_at_once_runs_the_step():
    # 12 and 16 MiB live together (14 MiB freed between them, a workspace that may give way
    # and 700 B rounded to 512 B steps beside them): a segment each, none shared
    events = _events((0, 12 * MiB), (1, 14 * MiB), (1, -14 * MiB), (2, 16 * MiB),
                     (4, 700), (4, -700), (3, 64 * MiB), optional=(3,))
    settings = AllocatorSettings()
    peak = live_request_peak(events, [], settings)
    assert peak == 28 * MiB + 1024
    assert replay(events, limit_bytes=30 * MiB).fits
    assert not replay(events, limit_bytes=peak - 1).fits


def test_the_least_limit_search_starts_from_the_live_requests(monkeypatch):
    # a step whose least limit is its live requests, far below its unlimited peak: the old
    # bisection from the failed limit up took six replays for it
    events = _events((0, 60 * MiB), (0, -60 * MiB), (1, 70 * MiB))
    made = []
    real_replay = least_limit.replay
    monkeypatch.setattr(least_limit, "replay",
                        lambda *args, **kwargs: made.append(1) or real_replay(*args, **kwargs))
    least = least_limit_replay(events, [], AllocatorSettings(), 0, real_replay(events))
    assert least.fits and 70 * MiB <= least.peak_reserved_bytes <= 72 * MiB
    assert len(made) <= 2


def test_a_least_limit_far_above_the_live_requests_is_bisected_over_the_whole_range():
    # ten 2 MiB requests split one 20 MiB segment; all but one are freed, so the segment
    # stays, and a 40 MiB request needs a segment of its own: 60 MiB at least, where no more
    # than 42 MiB is ever requested at once
    events = _events(*[(index, 2 * MiB) for index in range(10)],
                     *[(index, -2 * MiB) for index in range(1, 10)], (10, 40 * MiB))
    settings = AllocatorSettings()
    assert live_request_peak(events, [], settings) == 42 * MiB
    assert replay(events, limit_bytes=60 * MiB).fits
    assert not replay(events, limit_bytes=60 * MiB - 1).fits
    least = least_limit_replay(events, [], settings, 0, replay(events))
    assert least.fits and 60 * MiB <= least.peak_reserved_bytes <= 62 * MiB
