"""Each allocator replay of a traced step made once, whatever the card asks for it.

A replay depends on the step's events, the workspaces resident before it and the
allocator's settings, and on the card only through its limit. A replay that never reached
its limit is the replay without one, so every card with room for that peak takes it as it
is; the least limit the step runs in is the same for every card it does not fit. The card
fits and the batch searches ask for one step on many cards: this keeps them from replaying
it again for each (milliseconds each, hundreds of them).

Known limitations: a least limit found once is taken for every limit below it. Where whether
a limit runs the step does not grow with the limit (``memcalc.device.least_limit``), a
search from a card's own failed limit could have ended elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memcalc.device.allocator import AllocatorReplay, replay
from memcalc.device.allocator_settings import AllocatorSettings
from memcalc.device.least_limit import least_limit_replay
from memcalc.trace.ledger import MemoryEvent


@dataclass
class _StepReplays:
    events: list[MemoryEvent]
    """Held so that the key's ``id`` cannot be reused while the memo lives."""
    unlimited: AllocatorReplay | None = None
    least: list[AllocatorReplay] = field(default_factory=list)
    """The least-limit replays searched so far."""


class ReplayMemo:
    """Replays of one prepared step's traces, by events, workspaces and settings."""

    def __init__(self) -> None:
        self._steps: dict[tuple, _StepReplays] = {}

    def _step(self, events: list[MemoryEvent], resident: list[int],
              settings: AllocatorSettings) -> _StepReplays:
        key = (id(events), tuple(resident), settings)
        if key not in self._steps:
            self._steps[key] = _StepReplays(events)
        return self._steps[key]

    def at_limit(self, events: list[MemoryEvent], resident: list[int],
                 settings: AllocatorSettings, limit_bytes: int | None) -> AllocatorReplay:
        """``replay(events, resident, settings, limit_bytes)``, made once."""
        step = self._step(events, resident, settings)
        known = step.unlimited
        if known is not None and (limit_bytes is None
                                  or known.peak_reserved_bytes <= limit_bytes):
            return known
        made = replay(events, resident, settings, limit_bytes=limit_bytes)
        if not made.limit_reached:
            step.unlimited = made
        return made

    def least(self, events: list[MemoryEvent], resident: list[int],
              settings: AllocatorSettings, failed_limit: int) -> AllocatorReplay:
        """``least_limit_replay`` above ``failed_limit``, searched once for all the limits
        below what it found."""
        step = self._step(events, resident, settings)
        for found in step.least:
            if failed_limit < found.peak_reserved_bytes:
                return found
        unlimited = self.at_limit(events, resident, settings, None)
        found = least_limit_replay(events, resident, settings, failed_limit, unlimited)
        step.least.append(found)
        return found
