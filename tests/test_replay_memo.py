"""Each replay of a step made once: the memo's answers are the replays themselves."""

from memcalc.device import replay_memo
from memcalc.device.allocator import replay
from memcalc.device.least_limit import LEAST_LIMIT_TOLERANCE, least_limit_replay
from memcalc.device.allocator_settings import AllocatorSettings
from memcalc.device.replay_memo import ReplayMemo
from memcalc.trace.ledger import MemoryEvent

MiB = 1 << 20
SETTINGS = AllocatorSettings()
# 60 MiB cached after its free, then 70 MiB: 130 MiB without a limit, 70 MiB at the least
EVENTS = [MemoryEvent(0, 60 * MiB), MemoryEvent(0, -60 * MiB), MemoryEvent(1, 70 * MiB)]


def _counting(monkeypatch) -> list:
    made = []
    monkeypatch.setattr(replay_memo, "replay",
                        lambda *args, **kwargs: made.append(1) or replay(*args, **kwargs))
    return made


def test_every_card_with_room_for_the_peak_takes_the_replay_without_a_limit(monkeypatch):
    made, memo = _counting(monkeypatch), ReplayMemo()
    unlimited = memo.at_limit(EVENTS, [], SETTINGS, None)
    for limit in (130 * MiB, 200 * MiB, 10 ** 12):
        assert memo.at_limit(EVENTS, [], SETTINGS, limit) == replay(EVENTS, limit_bytes=limit)
        assert memo.at_limit(EVENTS, [], SETTINGS, limit) is unlimited
    assert len(made) == 1


def test_a_replay_that_reached_its_limit_is_made_for_each_limit(monkeypatch):
    made, memo = _counting(monkeypatch), ReplayMemo()
    memo.at_limit(EVENTS, [], SETTINGS, None)
    for limit in (100 * MiB, 80 * MiB, 60 * MiB):
        assert memo.at_limit(EVENTS, [], SETTINGS, limit) == replay(EVENTS, limit_bytes=limit)
    assert len(made) == 4
    # other workspaces or settings are another replay
    assert memo.at_limit(EVENTS, [MiB], SETTINGS, None).peak_reserved_bytes == 132 * MiB


def test_the_least_limit_is_searched_once_for_every_card_it_does_not_fit(monkeypatch):
    memo = ReplayMemo()
    first = memo.least(EVENTS, [], SETTINGS, 40 * MiB)
    slack = max(2 * MiB, int(130 * MiB * LEAST_LIMIT_TOLERANCE))
    assert first.fits and 70 * MiB <= first.peak_reserved_bytes <= 70 * MiB + slack
    assert first == least_limit_replay(EVENTS, [], SETTINGS, 40 * MiB, replay(EVENTS))
    made = _counting(monkeypatch)
    assert memo.least(EVENTS, [], SETTINGS, 20 * MiB) is first
    assert memo.least(EVENTS, [], SETTINGS, 69 * MiB) is first
    assert made == []
