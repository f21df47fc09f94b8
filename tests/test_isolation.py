"""isolate=True: the estimate runs in a child process; crashes and hangs become one-line
errors instead of killing the caller."""

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
from torch import nn

import memcalc
from memcalc.errors import InputError, TraceError, UserCodeError

MACHINE = {"cpus": 2, "ram_bytes": 4 << 30}


@pytest.fixture(scope="module", autouse=True)
def runs_to_their_timeout(tmp_path_factory):
    """The estimates that wait for their timeout, started in threads with the module's first
    test (each waits in its own process; the module's other tests use that time)."""
    pid_file = tmp_path_factory.mktemp("spawning") / "grandchild.pid"
    with ThreadPoolExecutor(2) as pool:
        yield pid_file, {
            "hanging": pool.submit(partial(
                memcalc.estimate, "tests.fixtures.models:hanging", (8,), batch_size=2,
                isolate=True, timeout_s=8, machine=MACHINE)),
            "spawning": pool.submit(partial(
                memcalc.estimate, "tests.fixtures.hostile:spawning_and_hanging", (8,),
                batch_size=2, model_args={"pid_file": str(pid_file)}, isolate=True,
                timeout_s=10, machine=MACHINE))}


@pytest.mark.slow   # end to end, seconds of CPU: with the slow checks
def test_isolated_estimate_equals_the_in_process_one():
    options = dict(batch_size=4, device="cpu", model_args={"in_features": 16, "hidden": 32},
                   machine=MACHINE)
    isolated = memcalc.estimate("mlp", (16,), isolate=True, timeout_s=120, **options)
    assert isolated.device.peak_bytes == memcalc.estimate("mlp", (16,), **options).device.peak_bytes


def test_a_crashing_model_does_not_take_the_caller_down():
    with pytest.raises(TraceError, match=r"killed by SIGSEGV"):
        memcalc.estimate("tests.fixtures.models:crashing", (8,), batch_size=2, isolate=True,
                         timeout_s=120, machine=MACHINE)


def test_a_hanging_model_is_stopped_at_the_timeout(runs_to_their_timeout):
    _, runs = runs_to_their_timeout
    with pytest.raises(TraceError, match=r"did not finish in 8 s"):
        runs["hanging"].result(timeout=300)


def test_instances_cannot_be_isolated():
    with pytest.raises(InputError, match="isolate=True needs a model name"):
        memcalc.estimate(nn.Linear(4, 2), (4,), isolate=True)


def test_a_builder_that_exits_is_the_users_code_not_a_timeout():
    with pytest.raises(UserCodeError, match=r"sys.exit\(0\)"):
        memcalc.estimate("tests.fixtures.user_builders:exits", (8,), batch_size=2,
                         isolate=True, timeout_s=120, machine=MACHINE)


@pytest.mark.parametrize("timeout_s", [float("nan"), float("inf"), 0, -1])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused_before_starting(timeout_s):
    with pytest.raises(InputError, match="timeout_s"):
        memcalc.estimate("mlp", (16,), isolate=True, timeout_s=timeout_s)


def test_the_timeout_kills_what_the_model_started(runs_to_their_timeout):
    pid_file, runs = runs_to_their_timeout
    with pytest.raises(TraceError, match=r"did not finish in 10 s"):
        runs["spawning"].result(timeout=300)
    grandchild = int(pid_file.read_text())
    time.sleep(0.5)
    assert not _running(grandchild)


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan stays a zombie where init does not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_a_script_without_a_main_guard_is_told_how_to_fix_it(tmp_path):
    script = tmp_path / "no_guard.py"
    script.write_text("import memcalc\n"
                      "memcalc.estimate('mlp', (16,), isolate=True, timeout_s=120)\n")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            cwd=root, timeout=300)
    assert result.returncode != 0
    assert "has no `if __name__ == \"__main__\":` guard" in result.stderr


def test_an_isolated_estimate_is_stopped_at_its_real_memory_cap(monkeypatch):
    cap = 512 << 20
    monkeypatch.setattr("memcalc.isolation.real_memory_cap_bytes", lambda: cap)
    started = time.monotonic()
    with pytest.raises(TraceError, match=r"over its cap of 0.50 GiB") as stopped:
        memcalc.estimate("tests.fixtures.hostile:hoarding", (8,), batch_size=2, isolate=True,
                         timeout_s=120, machine=MACHINE)
    held_gib = float(str(stopped.value).split("held ")[1].split(" GiB")[0])
    # stopped soon after the cap (held > 0.50 GiB, shown to two decimals), long before 4 GiB
    assert 0.5 <= held_gib < 1.5
    assert time.monotonic() - started < 60
