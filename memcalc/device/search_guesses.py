"""Where the batch search traces next: pure guesses from the batches traced so far.

Totals (reserved + context) steer the search far from the capacity; near it, a fitting
batch's total flattens (the replay at capacity frees its cache and retries), so floors
(allocated bytes + what lies outside the allocator, which no replay undercuts) steer there.
"""

from __future__ import annotations

from memcalc.device.report import DeviceReport

GROWTH = 8   # batch multiplier while the totals are still flat (no ceiling found yet)
MAX_BATCH = 1 << 24


def floor_bytes(report: DeviceReport) -> int:
    """Allocated bytes plus what lies outside the allocator: no replay reserves less, so a
    batch whose floor exceeds the usable memory cannot fit."""
    allocated = getattr(report, "peak_allocated_bytes", None)
    reserved = getattr(report, "peak_reserved_bytes", None)
    if allocated is None or reserved is None:
        return report.total_bytes
    return allocated + (report.total_bytes - reserved)


def floor_ceiling(floors: dict[int, int], best: int, usable_bytes: int) -> int:
    """The first batch above ``best`` whose floor, on the line through the smallest traced
    batch and ``best``, exceeds ``usable_bytes`` (``MAX_BATCH`` when the floor is flat)."""
    low = min(floors)
    slope = (floors[best] - floors[low]) / (best - low) if best > low else 0.0
    if slope <= 0:
        return MAX_BATCH
    return max(best + 1, min(MAX_BATCH, best + int((usable_bytes - floors[best]) // slope) + 1))


def floor_secant(totals: dict[int, int], floors: dict[int, int], fitting: int, ceiling: int,
                  usable_bytes: int) -> int:
    """Inside the bracket, along the floors' line (fitting totals flatten near the capacity
    and steer badly; floors grow with the batch to the end), the larger of two guesses: the
    batch where the floor, scaled by the reserve the ceiling's replay adds to its floor,
    meets ``usable_bytes`` (close when the ceiling is close), and the batch where the
    fitting one's slack below ``usable_bytes`` runs out at the same reserve (close when the
    ceiling is far and its reserve larger)."""
    slope = (floors[ceiling] - floors[fitting]) / (ceiling - fitting)
    ratio = totals[ceiling] / max(1, floors[ceiling])
    if slope <= 0 or ratio <= 0:
        return (fitting + ceiling) // 2
    scaled = fitting + int((usable_bytes / ratio - floors[fitting]) // slope)
    slack = fitting + int((usable_bytes - totals[fitting]) // slope)
    return max(fitting + 1, min(max(scaled, slack), ceiling - 1))


def over_secant(totals: dict[int, int], fitting: int, lowest: int, next_over: int,
                 usable_bytes: int) -> int:
    """After a step that did not fit: the secant through the two lowest batches that do not
    fit (their totals are what they need), down to ``usable_bytes``: from above, a need
    that curves upwards is approached without crossing it."""
    slope = (totals[next_over] - totals[lowest]) / (next_over - lowest)
    if slope <= 0:
        return (fitting + lowest) // 2
    guess = lowest - int(-(-(totals[lowest] - usable_bytes) // slope))
    return max(fitting + 1, min(guess, lowest - 1))


def next_candidate(totals: dict[int, int], fitting: int, ceiling: int | None,
                    usable_bytes: int, bisect: bool) -> int:
    """Secant through the bracket's ends (or its midpoint), strictly inside the bracket."""
    if ceiling is None:
        others = [batch for batch in totals if batch < fitting]
        previous = max(others) if others else fitting
        slope = ((totals[fitting] - totals[previous]) / (fitting - previous)
                 if previous != fitting else 0.0)
        if bisect or slope <= 0:
            return min(fitting * GROWTH, MAX_BATCH)
        guess = fitting + int((usable_bytes - totals[fitting]) // slope)
        return max(fitting + 1, min(guess, MAX_BATCH))
    if bisect:
        return (fitting + ceiling) // 2
    slope = (totals[ceiling] - totals[fitting]) / (ceiling - fitting)
    guess = fitting + int((usable_bytes - totals[fitting]) // slope) if slope > 0 else fitting + 1
    # near the card's capacity the replayed totals flatten (the allocator frees its cache
    # and retries), so secant steps crawl: each step takes at least an eighth of the bracket
    margin = max(1, (ceiling - fitting) // 8)
    return max(fitting + margin, min(guess, ceiling - margin))
