"""The least limit a traced step runs in: what the smallest card that takes it reserves.

Under a limit the allocator frees its cache and retries before it fails, so a step runs in
less than its unlimited peak; the least such limit is searched by replaying the step
(``memcalc.device.allocator.replay``) at trial limits.

Known limitations: whether a limit runs the step need not grow with the limit (where the
cache is freed changes how blocks split); the search finds a limit that runs with one that
fails within ``LEAST_LIMIT_TOLERANCE`` below it, not always the least of all.
"""

from __future__ import annotations

from collections.abc import Iterable

from memcalc.device.allocator import AllocatorReplay, replay
from memcalc.device.allocator_settings import AllocatorSettings
from memcalc.trace.ledger import EMPTY_CACHE_RECORD, MemoryEvent

LEAST_LIMIT_TOLERANCE = 0.005
"""The least limit a step runs in is searched to this share of it (or 2 MiB)."""


def least_limit_replay(events: list[MemoryEvent], resident_bytes: list[int],
                       settings: AllocatorSettings, failed_limit: int,
                       unlimited: AllocatorReplay) -> AllocatorReplay:
    """The replay at about the least limit the step runs in, above ``failed_limit`` where it
    does not: what the smallest card that takes the step reserves. ``unlimited`` is the same
    events' replay without a limit: the allocator then keeps every block it cached, so that
    peak is no card's need; under a limit it frees its cache and retries first, as
    PyTorch's does.

    The search looks first just above the requests live at once (no smaller limit runs the
    step), where the least limit most often lies: ``GALLOP_PROBES`` probes, their steps
    doubling, then bisection between the last that failed and the one that ran. Where none
    runs, the least limit lies far above (fragmentation under a limit, where whether a limit
    runs need not grow with it), and the bisection runs over the whole range from
    ``failed_limit``."""
    high = unlimited.peak_reserved_bytes
    low = max(failed_limit, live_request_peak(events, resident_bytes, settings) - 1)
    step = tolerance_bytes(high)
    for _ in range(GALLOP_PROBES):
        if low + step >= high:
            break
        attempt = replay(events, resident_bytes, settings, limit_bytes=low + step)
        if attempt.fits:
            return _bisected(events, resident_bytes, settings, low, low + step, attempt)
        low, step = low + step, step * 2
    best = replay(events, resident_bytes, settings, limit_bytes=high)
    if not best.fits:      # segments split otherwise under a limit: no smaller answer known
        return unlimited
    return _bisected(events, resident_bytes, settings, failed_limit, high, best)


GALLOP_PROBES = 3
"""Probes just above the live requests before the search falls back to bisection."""


def _bisected(events: list[MemoryEvent], resident_bytes: list[int],
              settings: AllocatorSettings, low: int, high: int,
              best: AllocatorReplay) -> AllocatorReplay:
    """Bisection between a limit that fails (``low``) and one that runs (``high``, its
    replay ``best``), to ``LEAST_LIMIT_TOLERANCE``."""
    while high - low > tolerance_bytes(high):
        middle = (low + high) // 2
        attempt = replay(events, resident_bytes, settings, limit_bytes=middle)
        if attempt.fits:
            high, best = middle, attempt
        else:
            low = middle
    return best


def tolerance_bytes(limit: int) -> int:
    """How close to the least limit the search ends: ``LEAST_LIMIT_TOLERANCE`` of it, or 2 MiB."""
    return max(2 << 20, int(limit * LEAST_LIMIT_TOLERANCE))


def live_request_peak(events: Iterable[MemoryEvent], resident_bytes: Iterable[int],
                      settings: AllocatorSettings) -> int:
    """The most bytes requested at once, each request rounded as the allocator rounds it
    (optional ones left out: they give way): no limit below it runs the step."""
    live = sum(settings.round_size(nbytes) for nbytes in resident_bytes)
    peak, sizes = live, {}
    for event in events:
        if event.delta_bytes > 0 and not event.optional and event.record_id != EMPTY_CACHE_RECORD:
            sizes[event.record_id] = size = settings.round_size(event.delta_bytes)
            live += size
            peak = max(peak, live)
        elif event.delta_bytes < 0 and event.record_id in sizes:
            live -= sizes.pop(event.record_id)
    return peak
