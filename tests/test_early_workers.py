"""A plan's workers started with the command: only for a plan of a zoo-like model name, taken
over by a pool that wants no more of them, ended otherwise."""

from __future__ import annotations

import psutil
import pytest

from memcalc import early_workers
from memcalc.report_pool import ReportPool


class _Executor:
    """Stands in for a process pool: records that it was ended."""

    def __init__(self):
        self._processes, self.ended = {}, False

    def shutdown(self, wait=True, cancel_futures=False):
        self.ended = True


@pytest.fixture
def started(monkeypatch):
    """Workers ``prestart`` starts (none really spawned), by count."""
    made = []

    def start(workers):
        made.append((workers, _Executor()))
        return made[-1][1], None
    monkeypatch.setattr(early_workers, "start_workers", start)
    monkeypatch.setattr(early_workers, "usable_cores", lambda: 4)
    yield made
    early_workers.discard()


@pytest.mark.parametrize("arguments, starts", [
    (["plan", "--model", "resnet3d", "--shape", "8,8,8,1", "--gpu", "T4"], True),
    (["--debug", "plan", "--model=llama_7b", "--gpu", "A100-80GB"], True),
    (["estimate", "--model", "resnet3d"], False),
    (["check", "--model", "resnet3d", "--batch-size", "2", "--gpu", "T4"], False),
    (["plan", "--model", "mymodels:build", "--gpu", "T4"], False),     # the user's code
    (["plan", "--model", "net.py", "--gpu", "T4"], False),
    (["plan", "--model", "resnet3d", "--dataset", "data:make"], False),
    (["plan", "--spec", "job.toml"], False),
    (["plan", "--model", "resnet3d", "--help"], False),
])
def test_workers_start_for_a_plan_of_a_zoo_model_name_only(started, arguments, starts):
    early_workers.prestart(arguments)
    assert [workers for workers, _ in started] == ([3] if starts else [])


def test_a_pool_takes_them_over_unless_it_wants_more_or_none(started):
    early_workers.prestart(["plan", "--model", "resnet3d"])
    executor = started[0][1]
    assert early_workers.adopt(2) == (executor, None) and not executor.ended
    assert early_workers.adopt(1) is None               # taken over once
    early_workers.prestart(["plan", "--model", "resnet3d"])
    assert early_workers.adopt(4) is None and started[1][1].ended      # wants more: ended
    early_workers.prestart(["plan", "--model", "resnet3d"])
    ReportPool(0).start()                                # a serial plan ends them
    assert started[2][1].ended


def test_real_workers_started_early_are_gone_once_discarded():
    early_workers.prestart(["plan", "--model", "resnet3d"])
    pids = early_workers.pids()
    if early_workers.usable_cores() < early_workers.MIN_CORES:
        assert not pids
        return
    assert pids and all(psutil.pid_exists(pid) for pid in pids)
    early_workers.discard()
    assert not early_workers.pids()
    assert not [pid for pid in pids if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
