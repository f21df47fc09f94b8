"""The wait for a CPU at a wake-up with every core busy, measured with real busy processes."""

import psutil
import pytest

from memcalc.host import wake_latency
from memcalc.host.wake_latency import WAKE_ROUNDS, wake_wait_s


def _busy_children() -> list[psutil.Process]:
    return [child for child in psutil.Process().children(recursive=True)
            if child.is_running() and child.status() != psutil.STATUS_ZOMBIE
            and "while True" in " ".join(child.cmdline())]


def test_the_wake_wait_is_measured_against_busy_cores_and_leaves_nothing_running():
    seconds, source = wake_wait_s(2)
    assert source.startswith(f"measured: mean of {WAKE_ROUNDS} wake-ups with 2 busy processes")
    # a wait, not a sum over rounds or a sleep: at most a few scheduler slices or ticks
    assert 0.0 <= seconds < 0.02
    assert _busy_children() == []


def test_the_busy_processes_are_stopped_when_the_measurement_fails(monkeypatch):
    seen = []

    def failing(thread):
        seen.extend(_busy_children())
        raise KeyboardInterrupt

    monkeypatch.setattr(wake_latency, "_rounds", failing)
    with pytest.raises(KeyboardInterrupt):
        wake_wait_s(2)
    assert len(seen) == 2           # they were running while it measured ...
    assert _busy_children() == []   # ... and are gone after it failed
