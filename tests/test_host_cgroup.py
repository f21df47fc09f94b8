"""memcalc.host.cgroup against closed forms: a child that touches N MiB is charged N MiB plus
the interpreter's own baseline (measured in a cgroup of its own), a cap below N gets it
OOM-killed and says so, and nothing is left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

from memcalc.host.cgroup import CgroupUnavailable, MemoryCgroup, own_memory_cgroup

MIB = 1 << 20
TOUCH = "import sys, time; b = b'\\x01' * (int(sys.argv[1]) << 20); time.sleep(float(sys.argv[2]))"
SLACK_BYTES = 4 * MIB
"""Page tables and the interpreter's small allocations around the buffer."""


def _available() -> str | None:
    try:
        MemoryCgroup().close()
    except CgroupUnavailable as error:
        return str(error)
    return None


UNAVAILABLE = _available()
needs_cgroup = pytest.mark.skipif(UNAVAILABLE is not None,
                                  reason=f"no writable memory cgroup: {UNAVAILABLE}")


def run_touching(mib: int, limit_bytes: int | None = None, hold_s: float = 0.0):
    with MemoryCgroup(limit_bytes=limit_bytes) as group:
        done = subprocess.run(group.wrap([sys.executable, "-c", TOUCH, str(mib), str(hold_s)]),
                              capture_output=True, timeout=60)
        return done.returncode, group.peak_bytes(), group.oom_kills(), group.path


@pytest.fixture(scope="module")
def baseline_bytes() -> int:
    """The same interpreter touching nothing, charged in a cgroup of its own."""
    code, peak, kills, _ = run_touching(0)
    assert code == 0 and kills == 0
    return peak


@needs_cgroup
@pytest.mark.parametrize("mib", [64, 192])
def test_peak_is_what_the_child_touched_plus_its_baseline(mib, baseline_bytes):
    code, peak, kills, path = run_touching(mib)
    assert code == 0 and kills == 0
    assert mib * MIB <= peak <= mib * MIB + baseline_bytes + SLACK_BYTES, (peak, baseline_bytes)
    assert not os.path.exists(path)


@needs_cgroup
def test_a_cap_below_the_allocation_gets_the_child_oom_killed(baseline_bytes):
    cap = 64 * MIB + baseline_bytes
    code, peak, kills, path = run_touching(256, limit_bytes=cap)
    assert code == -9 and kills == 1
    assert peak <= cap
    assert not os.path.exists(path)


@needs_cgroup
def test_a_cap_above_the_allocation_holds(baseline_bytes):
    code, peak, kills, _ = run_touching(64, limit_bytes=64 * MIB + baseline_bytes + 32 * MIB)
    assert code == 0 and kills == 0 and peak >= 64 * MIB


@needs_cgroup
def test_processes_left_inside_are_killed_on_exit():
    with MemoryCgroup() as group:
        process = subprocess.Popen(group.wrap([sys.executable, "-c", TOUCH, "1", "60"]))
        while process.pid not in group.pids():
            assert process.poll() is None
    assert process.wait(timeout=10) == -9
    assert not psutil.pid_exists(process.pid) and not os.path.exists(group.path)


@needs_cgroup
def test_preexec_join_puts_the_child_in_before_it_execs():
    with MemoryCgroup() as group:
        done = subprocess.run([sys.executable, "-c", "print(open('/proc/self/cgroup').read())"],
                              preexec_fn=group.join, capture_output=True, text=True, timeout=60)
        name = os.path.basename(group.path)
        assert any(name in line for line in done.stdout.splitlines()), done.stdout
        assert group.peak_bytes() > 0


@needs_cgroup
def test_kill_on_exit_false_moves_the_process_to_the_parent():
    with MemoryCgroup(kill_on_exit=False) as group:
        process = subprocess.Popen(group.wrap([sys.executable, "-c", TOUCH, "1", "60"]))
        while process.pid not in group.pids():
            assert process.poll() is None
    try:
        parent = open(os.path.join(group.parent, "cgroup.procs")).read().split()
        assert str(process.pid) in parent and process.poll() is None
    finally:
        process.kill()
        process.wait()


def test_reasons_name_what_is_missing(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/user.slice\n")
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("23 1 0:22 / /proc rw - proc proc rw\n")
    with pytest.raises(CgroupUnavailable, match="cgroup v2 is not mounted"):
        own_memory_cgroup(str(proc), str(mountinfo))
    proc.write_text("4:cpu:/\n")
    with pytest.raises(CgroupUnavailable, match="no memory controller"):
        own_memory_cgroup(str(proc), str(mountinfo))
    mountinfo.write_text("35 31 0:32 /job /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n")
    proc.write_text("4:memory:/job/step_0\n")
    assert own_memory_cgroup(str(proc), str(mountinfo)) == ("/sys/fs/cgroup/memory/step_0", 1)


def test_cgroup_v2_without_the_memory_controller_delegated_is_unavailable(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpu io pids\n")
    with pytest.raises(CgroupUnavailable, match="memory controller is not delegated"):
        MemoryCgroup(parent=(str(tmp_path), 2))
